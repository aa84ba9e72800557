package cluster

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/gpuplane/gpuplane/fsm"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// ErrPeerAlive is returned by RemovePeer for a server that gossip still sees
// alive: removing it would only have the leader add it back. Run `cluster
// leave` on it instead.
var ErrPeerAlive = errors.New("server is alive")

// ErrUnknownPeer is returned by RemovePeer for a name that is not a Raft
// server.
var ErrUnknownPeer = errors.New("no such raft server")

var errClientNoState = errors.New("a client node keeps no replicated state: read through Read")

// Roles as gossip and users name them.
const (
	RoleServer = "server"
	RoleClient = "client"
)

// memberState is the gossip side of a Cluster.
type memberState struct {
	gossip atomic.Pointer[Gossip]

	// reconciles counts the leader's reconcile rounds on this server;
	// reconcileLast and reconcileMax are their durations in nanoseconds.
	reconciles, reconcileLast, reconcileMax atomic.Int64
	// digests caches the inventory digests the reconcile rounds compare.
	digests digestCache
	self    func() *pb.Node

	hint atomic.Pointer[[2]string] // client: last leader (id, raft address) a server named

	// failedMu guards failed: servers a client's request could not reach
	// lately, avoided for a while (gossip takes seconds to call them failed).
	failedMu sync.Mutex
	failed   map[string]time.Time

	stop     chan struct{}
	stopOnce sync.Once
	stopped  atomic.Bool
	wg       sync.WaitGroup
	left     chan struct{}
	leftOnce sync.Once

	// leaderWake and bootWake are poked (without blocking) on every gossip
	// change, for the leader and bootstrap loops.
	leaderWake chan struct{}
	bootWake   chan struct{}
}

func newMemberState() *memberState {
	return &memberState{
		stop: make(chan struct{}), left: make(chan struct{}),
		leaderWake: make(chan struct{}, 1), bootWake: make(chan struct{}, 1),
	}
}

func poke(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

func (m *memberState) isStopped() bool { return m.stopped.Load() }

// avoidFor is how long a client avoids a server it could not reach.
const avoidFor = 5 * time.Second

// unreachable records that a request to server failed to reach it.
func (m *memberState) unreachable(server string) {
	m.failedMu.Lock()
	defer m.failedMu.Unlock()
	if m.failed == nil {
		m.failed = map[string]time.Time{}
	}
	m.failed[server] = time.Now()
	if h := m.hint.Load(); h != nil && h[0] == server {
		m.hint.Store(nil)
	}
}

func (m *memberState) avoid(server string) bool {
	m.failedMu.Lock()
	defer m.failedMu.Unlock()
	at, ok := m.failed[server]
	return ok && time.Since(at) < avoidFor
}

func (m *memberState) leaderHint() (string, string) {
	if h := m.hint.Load(); h != nil {
		return h[0], h[1]
	}
	return "", ""
}

func (m *memberState) apiAddress(id string) string {
	if g := m.gossip.Load(); g != nil {
		if mem, ok := g.Member(id); ok {
			return mem.Meta.API
		}
	}
	return ""
}

// StartGossip starts this node's memberlist on Config.GossipBind, announcing
// what self describes (role, API and Raft addresses, inventory digest),
// joins Config.Join in the background (retried with jitter until one
// answers), and starts the loops a server runs: bootstrap-expect until the
// cluster forms, and the leader's duties whenever it leads. self is also
// what LocalNode returns to the leader.
func (c *Cluster) StartGossip(self func() *pb.Node) error {
	if c.mem.gossip.Load() != nil {
		return errors.New("gossip already started")
	}
	c.mem.self = self
	g, err := NewGossip(GossipConfig{
		Name: c.cfg.NodeName, Bind: c.cfg.GossipBind, Advertise: c.cfg.GossipAdvertise,
		SecretKey: c.cfg.GossipKey,
		Meta:      c.localMeta(),
		Logger:    c.log,
		LogLevel:  c.cfg.RaftLogLevel,
		OnChange:  func() { poke(c.mem.leaderWake); poke(c.mem.bootWake) },
	})
	if err != nil {
		return err
	}
	c.mem.gossip.Store(g)
	c.log.Info("gossip started", "addr", g.Addr(), "role", c.role())
	if len(c.cfg.Join) > 0 {
		c.mem.wg.Go(func() { g.JoinRetry(c.cfg.Join, c.mem.stop, c.log) })
	}
	if c.raft != nil {
		if c.cfg.BootstrapExpect > 0 {
			c.mem.wg.Go(c.bootstrapLoop)
		}
		c.mem.wg.Go(c.leaderLoop)
	}
	return nil
}

// Gossip is this node's gossip, nil before StartGossip.
func (c *Cluster) Gossip() *Gossip { return c.mem.gossip.Load() }

func (c *Cluster) role() string {
	if c.cfg.Server {
		return RoleServer
	}
	return RoleClient
}

func (c *Cluster) localMeta() Meta {
	n := c.mem.self()
	return Meta{
		Role: c.role(), API: n.GetAddress(), Raft: c.cfg.RaftAdvertise, Digest: c.cfg.Digest(n.GetCards()),
		Expect: c.cfg.BootstrapExpect, Version: n.GetVersion(), Bootstrapped: c.hasRaftState(),
		Gateway: c.cfg.Gateway,
	}
}

// Announce gossips what self now says (after an inventory change, say); the
// leader notices the new digest and registers the new inventory.
func (c *Cluster) Announce() error {
	g := c.mem.gossip.Load()
	if g == nil {
		return nil
	}
	meta := c.localMeta()
	return g.SetMeta(func(m *Meta) { *m = meta })
}

// hasRaftState reports whether this server belongs to a cluster: it has a
// configuration with at least one server (bootstrapped, added by a leader,
// or restored from its data dir).
func (c *Cluster) hasRaftState() bool {
	if c.raft == nil {
		return false
	}
	f := c.raft.GetConfiguration()
	return f.Error() == nil && len(f.Configuration().Servers) > 0
}

// LocalNode is this node as it describes itself, inventory included.
func (c *Cluster) LocalNode() *pb.Node {
	if c.mem.self == nil {
		return nil
	}
	return proto.Clone(c.mem.self()).(*pb.Node)
}

func (c *Cluster) stopMembership() {
	c.mem.stopOnce.Do(func() {
		c.mem.stopped.Store(true)
		close(c.mem.stop)
		c.mem.wg.Wait()
		if g := c.mem.gossip.Load(); g != nil {
			// No leave message: to the others this looks like a crash, and the
			// leader marks the node down. Leave says goodbye first.
			if err := g.Shutdown(); err != nil {
				c.log.Warn("stop gossip", "err", err)
			}
		}
	})
}

// bootstrapLoop waits, on a server started with BootstrapExpect and no Raft
// state, until gossip shows that many servers, then forms the cluster from
// them, the way Consul and Nomad do. Every server started with the same
// expectation sees the same set and bootstraps the same configuration, which
// raft accepts as one cluster. If any server it sees is already part of a
// cluster (a restart, or scale-up) it does nothing: that cluster's leader
// adds it.
func (c *Cluster) bootstrapLoop() {
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		if c.hasRaftState() {
			return // the leader loop announces it
		}
		if c.tryBootstrap() {
			return
		}
		select {
		case <-c.mem.stop:
			return
		case <-c.mem.bootWake:
		case <-t.C:
		}
	}
}

// tryBootstrap bootstraps when gossip shows enough servers and none in a
// cluster; it reports whether it did.
func (c *Cluster) tryBootstrap() bool {
	g := c.mem.gossip.Load()
	var peers []Peer
	for _, m := range g.Servers() {
		if m.Status != GossipAlive {
			continue
		}
		if m.Meta.Bootstrapped {
			return false // a cluster exists: its leader will add this server
		}
		if m.Meta.Expect != 0 && m.Meta.Expect != c.cfg.BootstrapExpect {
			c.log.Warn("servers disagree on --bootstrap-expect", "server", m.Name, "expects", m.Meta.Expect, "this", c.cfg.BootstrapExpect)
			return false
		}
		peers = append(peers, Peer{ID: m.Name, Address: m.Meta.Raft})
	}
	if len(peers) < c.cfg.BootstrapExpect {
		return false
	}
	conf := raft.Configuration{}
	for _, p := range peers {
		conf.Servers = append(conf.Servers, raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(p.ID), Address: raft.ServerAddress(p.Address)})
	}
	if err := c.raft.BootstrapCluster(conf).Error(); err != nil && !errors.Is(err, raft.ErrCantBootstrap) {
		c.log.Warn("bootstrap", "err", err)
		return false
	}
	c.log.Info("bootstrapped a new cluster", "servers", len(peers))
	return true
}

// pickServer chooses the server a client node sends a request to: the last
// known leader when gossip sees it alive (saving the server a hop), else
// any live server.
func (c *Cluster) pickServer() string {
	g := c.mem.gossip.Load()
	if g == nil {
		return ""
	}
	leader, _ := c.mem.leaderHint()
	var live, avoided []string
	for _, m := range g.Servers() {
		if m.Meta.API == "" || m.Status != GossipAlive {
			continue
		}
		switch {
		case c.mem.avoid(m.Name):
			avoided = append(avoided, m.Name)
		case m.Name == leader:
			return leader
		default:
			live = append(live, m.Name)
		}
	}
	if len(live) == 0 {
		live = avoided
	}
	if len(live) == 0 {
		return ""
	}
	return live[rand.IntN(len(live))]
}

// refreshLeaderHint asks a server who leads (client nodes).
func (c *Cluster) refreshLeaderHint(ctx context.Context) {
	st, err := c.serverStatus(ctx)
	if err == nil && st.GetLeader() != "" {
		c.mem.hint.Store(&[2]string{st.GetLeader(), ""})
	}
}

func (c *Cluster) serverStatus(ctx context.Context) (*pb.StatusResponse, error) {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	return onLeader(ctx, c, nil, func(f Forwarder, server string) (*pb.StatusResponse, error) {
		return f.Status(ctx, server)
	})
}

// ClusterStatus is Status as the servers see it: this node's own on a
// server, a server's on a client node.
func (c *Cluster) ClusterStatus(ctx context.Context) (*pb.StatusResponse, error) {
	if c.raft != nil {
		return c.Status(), nil
	}
	st, err := c.serverStatus(ctx)
	if err == nil && st.GetLeader() != "" {
		c.mem.hint.Store(&[2]string{st.GetLeader(), ""})
	}
	return st, err
}

// readViaServer is Read on a client node: a server reads its state (as a
// linearizable read unless stale) and sends it without the request ids
// (ReadState); fn runs on a copy. A client reads rarely (CLI requests it
// serves, token checks).
func (c *Cluster) readViaServer(ctx context.Context, stale bool, fn func(*fsm.FSM) error) error {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	data, err := onLeader(ctx, c, nil, func(f Forwarder, server string) ([]byte, error) {
		return f.ReadState(ctx, server, stale)
	})
	if err != nil {
		return err
	}
	st := fsm.New()
	if err := st.Restore(data); err != nil {
		return fmt.Errorf("read state from a server: %w", err)
	}
	return fn(st)
}

// ReadState returns the state as snapshot bytes, read as Read reads it: what
// a server sends a client node. It leaves out the applied request ids
// (fsm.ViewSnapshot), which no read consults and which are most of a
// long-lived cluster's state.
func (c *Cluster) ReadState(ctx context.Context, stale bool) ([]byte, uint64, error) {
	var data []byte
	var idx uint64
	err := c.Read(ctx, stale, func(f *fsm.FSM) error {
		var err error
		data, err = f.ViewSnapshot()
		idx = f.AppliedIndex()
		return err
	})
	return data, idx, err
}

// Members lists every node gossip knows, with its Raft suffrage and which
// one leads; Raft servers gossip has not heard of are listed too.
func (c *Cluster) Members(ctx context.Context) ([]*pb.Member, error) {
	g := c.mem.gossip.Load()
	if g == nil {
		return nil, errors.New("gossip is not running")
	}
	st, err := c.ClusterStatus(ctx)
	if err != nil {
		return nil, fmt.Errorf("raft configuration: %w", err)
	}
	suffrage := map[string]*pb.ServerStatus{}
	for _, s := range st.GetServers() {
		suffrage[s.GetId()] = s
	}
	var out []*pb.Member
	for _, m := range g.Members() {
		mm := &pb.Member{
			Name: m.Name, Address: m.Meta.API, GossipAddress: m.Addr, RaftAddress: m.Meta.Raft,
			Role: m.Meta.Role, Status: m.Status, Raft: "none", Leader: m.Name == st.GetLeader(),
			InventoryDigest: m.Meta.Digest,
		}
		if s, ok := suffrage[m.Name]; ok {
			mm.Raft = s.GetSuffrage()
			delete(suffrage, m.Name)
		}
		out = append(out, mm)
	}
	for _, s := range st.GetServers() {
		if _, unseen := suffrage[s.GetId()]; unseen {
			out = append(out, &pb.Member{Name: s.GetId(), RaftAddress: s.GetAddress(), Role: RoleServer,
				Status: "unknown", Raft: s.GetSuffrage(), Leader: s.GetId() == st.GetLeader()})
		}
	}
	return out, nil
}

// Join makes this node's gossip join the given addresses now and returns how
// many answered.
func (c *Cluster) Join(ctx context.Context, addrs []string) (int, error) {
	g := c.mem.gossip.Load()
	if g == nil {
		return 0, errors.New("gossip is not running")
	}
	return g.Join(addrs)
}

// Left is closed once Leave has finished; the agent then stops.
func (c *Cluster) Left() <-chan struct{} { return c.mem.left }

// Leave takes this node out of the cluster gracefully. A server first hands
// leadership to another voter if it leads, then announces its leave through
// gossip; the leader removes it from Raft and marks it left in the log, and
// Leave waits (up to ctx) until the servers' configuration no longer holds
// it. A client node announces its leave; the leader marks it left.
func (c *Cluster) Leave(ctx context.Context) error {
	g := c.mem.gossip.Load()
	if g == nil {
		return errors.New("gossip is not running")
	}
	if c.raft != nil && c.IsLeader() && c.voters() > 1 {
		if err := c.raft.LeadershipTransfer().Error(); err != nil {
			return fmt.Errorf("hand over leadership: %w", err)
		}
	}
	if err := g.Leave(5 * time.Second); err != nil {
		return fmt.Errorf("leave gossip: %w", err)
	}
	if c.raft != nil && c.voters() > 1 {
		if err := c.waitRemoved(ctx); err != nil {
			return err
		}
	}
	c.mem.leftOnce.Do(func() { close(c.mem.left) })
	c.log.Info("left the cluster")
	return nil
}

func (c *Cluster) voters() int {
	f := c.raft.GetConfiguration()
	if f.Error() != nil {
		return 0
	}
	n := 0
	for _, s := range f.Configuration().Servers {
		if s.Suffrage == raft.Voter {
			n++
		}
	}
	return n
}

// waitRemoved waits until the leader's configuration no longer lists this
// server.
func (c *Cluster) waitRemoved(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	for {
		leader, _ := c.Leader()
		if f := c.getForwarder(); f != nil && leader != "" && leader != c.cfg.NodeName {
			if st, err := f.Status(ctx, leader); err == nil && st.GetLeader() == leader {
				gone := true
				for _, s := range st.GetServers() {
					gone = gone && s.GetId() != c.cfg.NodeName
				}
				if gone {
					return nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for the leader to remove %s from raft: %w", c.cfg.NodeName, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// RemovePeer removes a dead server from the Raft configuration (on the
// leader; other nodes forward it) and marks it left in the log. A server
// gossip sees alive is refused with ErrPeerAlive.
func (c *Cluster) RemovePeer(ctx context.Context, name string) error {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	_, err := onLeader(ctx, c,
		func() (struct{}, error) { return struct{}{}, c.removePeerLocal(ctx, name) },
		func(f Forwarder, leader string) (struct{}, error) { return struct{}{}, f.RemovePeer(ctx, leader, name) })
	return err
}

func (c *Cluster) removePeerLocal(ctx context.Context, name string) error {
	if name == c.cfg.NodeName {
		return fmt.Errorf("%w: %s is the leader: run 'gpuplane cluster leave' on it", ErrPeerAlive, name)
	}
	if g := c.mem.gossip.Load(); g != nil {
		if m, ok := g.Member(name); ok && m.Status == GossipAlive {
			return fmt.Errorf("%w: gossip sees %s %s: run 'gpuplane cluster leave' on it, or stop it first", ErrPeerAlive, name, m.Status)
		}
	}
	f := c.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return c.raftError(err)
	}
	found := false
	for _, s := range f.Configuration().Servers {
		found = found || s.ID == raft.ServerID(name)
	}
	if !found {
		return fmt.Errorf("%w: %q", ErrUnknownPeer, name)
	}
	if err := wait(ctx, c.raft.RemoveServer(raft.ServerID(name), 0, 0)); err != nil {
		return c.raftError(err)
	}
	c.log.Info("removed server from raft", "server", name)
	c.setStatus(ctx, name, pb.NodeStatus_NODE_STATUS_LEFT)
	return nil
}

// defaultDigest is the inventory digest when Config.Digest is not set.
func defaultDigest(cards []*pb.Card) string {
	h := sha256.New()
	for _, c := range cards {
		b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(c)
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil)[:8])
}

// ReadNode reads what node's executor runs (the replicas placed on it, with
// their deployments' specs), as Read reads; with stale and minIndex, once
// this server has applied minIndex. A client node's executor reads it after
// each event about its node, in place of the whole state (ReadState).
func (c *Cluster) ReadNode(ctx context.Context, node string, stale bool, minIndex uint64) (*pb.ReadNodeResponse, error) {
	if c.raft == nil {
		return nil, ErrNoLog
	}
	if stale && minIndex > 0 {
		wctx, cancel := withDefaultTimeout(ctx)
		err := c.WaitApplied(wctx, minIndex)
		cancel()
		if err != nil {
			return nil, err
		}
	}
	resp := &pb.ReadNodeResponse{Specs: map[string]*pb.ModelSpec{}}
	err := c.Read(ctx, stale, func(f *fsm.FSM) error {
		resp.AppliedIndex = f.AppliedIndex()
		resp.Replicas = f.ReplicasOn(node)
		for _, r := range resp.Replicas {
			if _, ok := resp.Specs[r.GetModel()]; !ok {
				if spec, ok := f.ModelSpec(r.GetModel()); ok {
					resp.Specs[r.GetModel()] = spec
				}
			}
		}
		return nil
	})
	return resp, err
}
