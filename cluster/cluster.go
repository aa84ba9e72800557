package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/gpuplane/gpuplane/cluster/auditrec"
	"github.com/gpuplane/gpuplane/cluster/events"
	"github.com/gpuplane/gpuplane/cluster/raftstore"
	"github.com/gpuplane/gpuplane/fsm"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// Cluster is this node's Raft server and the replicated state it applies.
type Cluster struct {
	cfg   Config
	log   *slog.Logger
	raft  *raft.Raft
	fsm   *raftFSM
	store *raftstore.Store
	snaps *raft.FileSnapshotStore
	trans *contactTransport

	forwarder atomic.Pointer[forwarderBox]
	// mem is gossip membership, the bootstrap-expect and leader loops, and
	// (on a client node, which has no Raft) the server requests go to.
	mem *memberState
	// barrierTerm is the last term in which this node, as leader, committed a
	// barrier; reads need one per term (see ReadIndex).
	barrierTerm atomic.Uint64
	// windowTerm is the last term in which this node, as leader, proposed
	// an entry carrying its request window (see propose).
	windowTerm atomic.Uint64
	// handedOver is when this leader last handed leadership over because
	// its log refused a write (handOver), in Unix nanoseconds.
	handedOver atomic.Int64
	// tenants is a client node's copy of the token table (TenantFor).
	tenants tenantTable

	// feed is the shared replay behind the server's event streams
	// (logfiles.go), started by the first; feedStopped once Shutdown began.
	feedMu      sync.Mutex
	feed        *events.Feed
	feedStopped bool

	shutdownOnce sync.Once
	shutdownErr  error
}

type forwarderBox struct{ f Forwarder }

// logCacheSize is how many of the latest log entries Raft keeps in memory
// (raft.LogCache): four AppendEntries' worth (MaxAppendEntries), enough for
// what is in flight to the followers and not yet applied.
const logCacheSize = 1024

// New opens (or creates) the node's data dir and starts its Raft server.
// With cfg.Bootstrap and no existing Raft state it forms a new cluster.
func New(cfg Config) (*Cluster, error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("cluster config: %w", err)
	}
	if err := os.MkdirAll(filepath.Join(cfg.DataDir, raftDir), 0o700); err != nil {
		return nil, fmt.Errorf("create data dir: %w", err)
	}
	if err := checkNodeID(cfg.DataDir, cfg.NodeName); err != nil {
		return nil, err
	}
	c := &Cluster{cfg: cfg, log: cfg.Logger.With("node", cfg.NodeName), fsm: newRaftFSM(), mem: newMemberState()}
	if !cfg.Server {
		c.log.Info("client node: no raft; requests go to the servers gossip finds")
		return c, nil
	}
	hlog := newHCLog(c.log, "raft", cfg.RaftLogLevel)

	var (
		err    error
		stable map[string][]byte
	)
	if cfg.Recover {
		if stable, err = setAsideRaftData(cfg.DataDir, c.log); err != nil {
			return nil, err
		}
	}
	if c.store, err = openLogStore(cfg.DataDir, hlog.Named("log"), cfg.logSegmentSize); err != nil {
		return nil, err
	}
	for k, v := range stable {
		if err := c.store.Set([]byte(k), v); err != nil {
			c.store.Close()
			return nil, fmt.Errorf("recover: keep %s: %w", k, err)
		}
	}
	if c.fsm.hashes, err = auditrec.OpenHashes(filepath.Join(RaftDir(cfg.DataDir), auditrec.HashesFile), false, c.log); err != nil {
		c.store.Close()
		return nil, err
	}
	if err := checkLogLength(c.store, c.fsm.hashes); err != nil {
		c.fsm.hashes.Close()
		c.store.Close()
		return nil, err
	}
	snaps, err := raft.NewFileSnapshotStoreWithLogger(filepath.Join(cfg.DataDir, raftDir), snapshotKeep, hlog.Named("snapshots"))
	if err != nil {
		c.store.Close()
		return nil, fmt.Errorf("open snapshot store: %w", err)
	}
	c.snaps = snaps
	if c.trans, err = newTransport(cfg.RaftBind, cfg.RaftAdvertise, cfg.TLS, hlog.Named("transport")); err != nil {
		c.store.Close()
		return nil, err
	}
	existing, err := raft.HasExistingState(c.store, c.store, snaps)
	if err != nil {
		c.trans.Close()
		c.store.Close()
		return nil, fmt.Errorf("read raft state: %w", err)
	}

	rc := raftConfig(cfg.NodeName)
	rc.Logger = hlog
	// Raft reads back every entry it has just stored: the leader to build
	// each follower's AppendEntries, a follower to apply the entries the
	// leader says are committed. From raft-boltdb that is a read transaction
	// and a msgpack decode per entry (8% of a leader's CPU in the commit
	// benchmark); the cache answers them from memory. It keeps an entry only
	// once the store has written it, so it never serves one that is not on
	// disk, and it holds the last logCacheSize entries.
	logs, err := raft.NewLogCache(logCacheSize, c.store)
	if err != nil {
		c.trans.Close()
		c.store.Close()
		return nil, fmt.Errorf("raft log cache: %w", err)
	}
	if c.raft, err = raft.NewRaft(rc, c.fsm, logs, c.store, snaps, c.trans); err != nil {
		c.trans.Close()
		c.store.Close()
		return nil, fmt.Errorf("start raft: %w", err)
	}
	if cfg.Bootstrap && !existing && !cfg.Recover {
		if err := c.bootstrap(); err != nil {
			c.Shutdown()
			return nil, err
		}
	}
	c.log.Info("raft started", "raft_addr", cfg.RaftAdvertise, "existing_state", existing,
		"applied_index", c.AppliedIndex(), "last_index", c.LastIndex())
	return c, nil
}

// checkLogLength refuses a log that ends before an entry this server has
// applied: the hash records (raft/hashes) are written only after an entry
// is in the log, on disk, and committed, so a log shorter than they are lost
// entries it had acknowledged. The log store detects damage inside its
// files; this catches what it cannot tell from a crash, its newest segment
// file emptied or removed.
func checkLogLength(store *raftstore.Store, hashes *auditrec.Hashes) error {
	last, err := store.LastIndex()
	if err != nil {
		return err
	}
	if applied := hashes.LastRecorded(); applied > last {
		return fmt.Errorf("%w: %s: the log ends at entry index %d but this server applied entries up to %d (raft/hashes): entries it held are lost\n%s",
			raftstore.ErrDamaged, store.Dir(), last, applied, damagedHint)
	}
	return nil
}

func (c *Cluster) bootstrap() error {
	peers := c.cfg.BootstrapPeers
	if len(peers) == 0 {
		peers = []Peer{{ID: c.cfg.NodeName, Address: c.cfg.RaftAdvertise}}
	}
	conf := raft.Configuration{}
	self := false
	for _, p := range peers {
		self = self || p.ID == c.cfg.NodeName
		conf.Servers = append(conf.Servers, raft.Server{
			Suffrage: raft.Voter, ID: raft.ServerID(p.ID), Address: raft.ServerAddress(p.Address),
		})
	}
	if !self {
		return fmt.Errorf("bootstrap cluster: this node, %s, is not among the bootstrap peers", c.cfg.NodeName)
	}
	if err := c.raft.BootstrapCluster(conf).Error(); errors.Is(err, raft.ErrCantBootstrap) {
		// Raft listens from NewRaft on: peers that bootstrapped first may
		// have elected a leader that reached this server (or a candidate
		// that made it store a term) before it got here. It is then part
		// of the cluster it was to bootstrap, and learns the configuration
		// from the leader. (TestNoLeader hit this on a loaded machine.)
		c.log.Info("a peer reached this server before it bootstrapped; joining its cluster")
		return nil
	} else if err != nil {
		return fmt.Errorf("bootstrap cluster: %w", err)
	}
	c.log.Info("bootstrapped a new cluster", "servers", len(peers))
	return nil
}

// Shutdown stops Raft and closes the data dir. It is safe to call more than
// once; later calls return the first call's result.
func (c *Cluster) Shutdown() error {
	c.shutdownOnce.Do(func() {
		c.stopFeed()
		c.stopMembership()
		if c.raft == nil {
			return
		}
		// Raft's shutdown also closes the transport.
		err := c.raft.Shutdown().Error()
		if herr := c.fsm.hashes.Close(); herr != nil {
			err = errors.Join(err, fmt.Errorf("close entry hashes: %w", herr))
		}
		if cerr := c.store.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("close raft log: %w", cerr))
		}
		c.shutdownErr = err
	})
	return c.shutdownErr
}

// SetForwarder installs what sends writes and read-index requests to the
// leader. Until one is set, a follower answers ErrNotLeader.
func (c *Cluster) SetForwarder(f Forwarder) { c.forwarder.Store(&forwarderBox{f}) }

func (c *Cluster) getForwarder() Forwarder {
	if b := c.forwarder.Load(); b != nil {
		return b.f
	}
	return nil
}

// NodeName is this node's name and Raft server id.
func (c *Cluster) NodeName() string { return c.cfg.NodeName }

// IsLeader reports whether this node currently believes it is the leader.
func (c *Cluster) IsLeader() bool { return c.raft != nil && c.raft.State() == raft.Leader }

// IsServer reports whether this node votes in Raft; client nodes do not.
func (c *Cluster) IsServer() bool { return c.raft != nil }

// Leader returns the current leader's server id (its node name) and Raft
// address, or empty strings when no leader is known.
func (c *Cluster) Leader() (id, raftAddr string) {
	if c.raft == nil {
		return c.mem.leaderHint()
	}
	addr, sid := c.raft.LeaderWithID()
	return string(sid), string(addr)
}

// WaitForLeader blocks until a leader is known or ctx ends. A client node
// asks the servers gossip has found.
func (c *Cluster) WaitForLeader(ctx context.Context) error {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		if c.raft == nil {
			c.refreshLeaderHint(ctx)
		}
		if id, _ := c.Leader(); id != "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %w", ErrNoLeader, ctx.Err())
		case <-t.C:
		}
	}
}

// View calls fn with the local state under the read lock, without any
// consistency check (a stale read). fn must not keep the *fsm.FSM or call
// into the Cluster.
func (c *Cluster) View(fn func(*fsm.FSM)) { c.fsm.view(fn) }

// APIAddress returns the API address of node id, which is where its Connect
// services answer (what a Forwarder dials): what gossip announces for it, or
// else what it registered in the log.
func (c *Cluster) APIAddress(id string) (string, bool) {
	if addr := c.mem.apiAddress(id); addr != "" {
		return addr, true
	}
	var addr string
	c.View(func(f *fsm.FSM) {
		if n, ok := f.Node(id); ok {
			addr = n.GetAddress()
		}
	})
	return addr, addr != ""
}

// AppliedIndex is the index of the last entry applied to the local state.
func (c *Cluster) AppliedIndex() uint64 {
	applied, _ := c.fsm.progress()
	return applied
}

// LastIndex is the index of the last entry in the local log (or snapshot).
func (c *Cluster) LastIndex() uint64 {
	if c.raft == nil {
		return 0
	}
	return c.raft.LastIndex()
}

// Status reports this node's view of Raft and of the replicated state. The
// leader address is the leader's API address once it has registered, its
// Raft address before that.
//
// Last contact: on the leader, each follower's is the time since it last
// answered an AppendEntries (heartbeats go out every HeartbeatTimeout/10), -1
// if it never has since this node became leader or started. On a follower
// only the link to the leader is known: the leader's and this node's entries
// carry the time since the leader was last heard from, the others -1.
func (c *Cluster) Status() *pb.StatusResponse {
	if c.raft == nil {
		id, _ := c.Leader()
		return &pb.StatusResponse{Node: c.cfg.NodeName, Leader: id, RaftState: "None"}
	}
	// Entries the state machine never sees (a new leader's no-op,
	// barriers) count as applied once raft has passed them, as a
	// linearizable read finds (caughtUp): on an idle cluster nothing else
	// moves the applied index past them, and a server that serves no such
	// read (client nodes read their snapshots as of an event's index,
	// ReadNode) would otherwise report an applied index behind its peers'
	// for the same state.
	if applied, passed := c.AppliedIndex(), c.raft.AppliedIndex(); passed > applied {
		c.caughtUp(applied, passed)
	}
	leaderAddr, leaderID := c.raft.LeaderWithID()
	st := &pb.StatusResponse{
		Node:         c.cfg.NodeName,
		Leader:       string(leaderID),
		Term:         c.raft.CurrentTerm(),
		CommitIndex:  c.raft.CommitIndex(),
		AppliedIndex: c.AppliedIndex(),
		RaftState:    c.raft.State().String(),
	}
	if leaderID != "" {
		if addr, ok := c.APIAddress(string(leaderID)); ok {
			st.LeaderAddress = addr
		} else {
			st.LeaderAddress = string(leaderAddr)
		}
	}
	c.View(func(f *fsm.FSM) { st.StateHash = f.Hash() })
	st.Resources = c.Resources()

	fut := c.raft.GetConfiguration()
	if err := fut.Error(); err != nil {
		return st
	}
	isLeader := c.IsLeader()
	sinceLeader := int64(-1)
	if last := c.raft.LastContact(); !isLeader && !last.IsZero() {
		sinceLeader = time.Since(last).Milliseconds()
	}
	for _, s := range fut.Configuration().Servers {
		ss := &pb.ServerStatus{Id: string(s.ID), Address: string(s.Address), Suffrage: events.Suffrage(s.Suffrage), LastContactMs: -1}
		switch {
		case isLeader && s.ID == raft.ServerID(c.cfg.NodeName):
			ss.LastContactMs = 0
		case isLeader:
			if at, ok := c.trans.lastContact(s.ID); ok {
				ss.LastContactMs = time.Since(at).Milliseconds()
			}
		case s.ID == leaderID || s.ID == raft.ServerID(c.cfg.NodeName):
			ss.LastContactMs = sinceLeader
		}
		st.Servers = append(st.Servers, ss)
	}
	return st
}
