package cluster

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"time"

	"github.com/hashicorp/raft"

	"github.com/gpuplane/gpuplane/cluster/tlsutil"
	"github.com/gpuplane/gpuplane/fsm"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// Config says who this node is and where it keeps its data.
type Config struct {
	// NodeName is the node's name and its Raft server id. A data dir is bound
	// to the first name it was used with.
	NodeName string
	// DataDir holds the Raft log, snapshots and the node id (see DESIGN.md).
	DataDir string
	// RaftBind is the host:port the Raft transport listens on.
	RaftBind string
	// RaftAdvertise is the host:port other servers reach this one at; it
	// defaults to RaftBind, which must then not be a wildcard address.
	RaftAdvertise string
	// Server says whether this node votes in Raft. A client node runs no
	// Raft and keeps no replicated state: it sends writes and reads to a
	// server that gossip found (see membership.go).
	Server bool
	// Bootstrap forms a new cluster from BootstrapPeers (this node alone when
	// empty) if the data dir has no Raft state yet; on later starts it does
	// nothing. --dev uses it for a single-node cluster.
	Bootstrap bool
	// BootstrapPeers is the initial voter set used with Bootstrap. Every
	// server bootstrapped together must be given the same set.
	BootstrapPeers []Peer
	// BootstrapExpect makes a server with no Raft state wait until gossip
	// shows that many servers, none of them part of a cluster yet, and then
	// form the cluster from them. A server that finds an existing cluster
	// instead waits for its leader to add it; one with Raft state on disk
	// just restarts. So one command line serves first start, restart and
	// scale-up.
	BootstrapExpect int
	// Join lists gossip addresses (host or host:port) to join, retried with
	// jitter until one answers.
	Join []string
	// GossipBind is the host:port memberlist listens on (TCP and UDP); the
	// port may be 0 to pick a free one. GossipAdvertise defaults to it.
	GossipBind, GossipAdvertise string
	// Gateway is the host:port of this node's OpenAI-compatible gateway
	// (docs/gateway.md), gossiped so that any node can forward requests to it;
	// empty when it serves none.
	Gateway string
	// TLS, when set, runs Raft over mutual TLS: servers accept and dial only
	// peers whose certificates chain to its CA.
	TLS *tlsutil.TLS
	// GossipKey, when set, encrypts and authenticates gossip (memberlist's
	// keyring, AES-GCM); a node without the same key cannot join.
	GossipKey []byte
	// Digest summarises an inventory for gossip (node/inventory.Digest); the
	// leader compares it with the cards in the log to notice changes.
	Digest func([]*pb.Card) string
	// ReapLeftAfter is how long a node stays in the state as left (a
	// graceful leave, or remove-peer) before the leader deregisters it
	// (DeregisterNode): 0 means DefaultReapLeftAfter, a negative value never.
	// A node that comes back meanwhile is alive again; one that comes back
	// later registers anew.
	ReapLeftAfter time.Duration
	// RequestWindow is how long, in log time, the state machine remembers a
	// request id (fsm.DefaultRequestWindow when 0). It takes effect through
	// the log: a leader whose window differs from the state machine's
	// stamps it on the entries it proposes until one is applied, so every
	// server and every replay applies the same window at the same entry,
	// whatever their own settings. Give every server the same value, or the
	// window changes with the leader.
	RequestWindow time.Duration

	// Logger receives the cluster's logs, raft's included; slog.Default when nil.
	Logger *slog.Logger
	// RaftLogLevel filters raft's own logs; warn when nil, because raft logs
	// every state change at info.
	RaftLogLevel slog.Leveler

	// Recover sets this server's Raft data (log, snapshots, hash records)
	// aside, under <data-dir>/raft.damaged-<time>, and starts with none: it
	// rejoins as the server it was and receives the whole log from the
	// leader. For a server whose log is damaged, while the other servers
	// hold the log; it keeps the term and vote it had when they are
	// readable, and never bootstraps.
	Recover bool

	// logSegmentSize overrides the log's segment size (raftstore): tests
	// fill small disks with small segments.
	logSegmentSize int
}

// DefaultReapLeftAfter is Config.ReapLeftAfter's default: a day, as serf
// (Consul) keeps a left member's tombstone.
const DefaultReapLeftAfter = 24 * time.Hour

// MinRequestWindow is the shortest request window a server accepts: clients
// retry a request for up to about half a minute (a request's default
// timeout), and a retry must find its id.
const MinRequestWindow = time.Second

// Peer is one Raft server: its node name and Raft address.
type Peer struct {
	ID      string
	Address string
}

func (c *Config) validate() error {
	var errs []error
	if c.NodeName == "" {
		errs = append(errs, errors.New("node name is required"))
	}
	if c.DataDir == "" {
		errs = append(errs, errors.New("data dir is required"))
	}
	if c.Server && c.RaftBind == "" {
		errs = append(errs, errors.New("raft bind address is required"))
	}
	if c.BootstrapExpect < 0 || (c.BootstrapExpect > 0 && !c.Server) {
		errs = append(errs, errors.New("bootstrap expect is for servers and must not be negative"))
	}
	if n := len(c.GossipKey); n != 0 && n != 16 && n != 24 && n != 32 {
		errs = append(errs, fmt.Errorf("gossip key must be 16, 24 or 32 bytes, got %d", n))
	}
	if c.Digest == nil {
		c.Digest = defaultDigest
	}
	if c.ReapLeftAfter == 0 {
		c.ReapLeftAfter = DefaultReapLeftAfter
	}
	switch {
	case c.RequestWindow == 0:
		c.RequestWindow = fsm.DefaultRequestWindow
	case c.RequestWindow < MinRequestWindow:
		errs = append(errs, fmt.Errorf("request window must be at least %s (longer than any client retries a request), got %s", MinRequestWindow, c.RequestWindow))
	}
	if c.RaftAdvertise == "" {
		c.RaftAdvertise = c.RaftBind
	}
	if !c.Server {
		c.RaftBind, c.RaftAdvertise = "", "" // a client runs no Raft
	} else if host, _, err := net.SplitHostPort(c.RaftAdvertise); err != nil {
		errs = append(errs, err)
	} else if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		errs = append(errs, errors.New("raft advertise address "+c.RaftAdvertise+" is not reachable by other servers: set an advertise address"))
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.RaftLogLevel == nil {
		c.RaftLogLevel = slog.LevelWarn
	}
	return errors.Join(errs...)
}

// raftConfig tunes raft for servers on one LAN (sub-millisecond RTT, few
// servers) where failover speed matters more than tolerance of slow links.
//
//   - HeartbeatTimeout 250ms / ElectionTimeout 250ms. hashicorp/raft's
//     follower wakes every rand[HB, 2HB) and starts an election only if the
//     leader has been silent for HB; a survivor's pre-vote is refused by the
//     other survivor until that one has timed out too (it still "has a
//     leader"), so an election completes at about the later of the two
//     followers' wake-ups: HB..3HB after the kill, ≈2.2×HB on average, so
//     HB bounds failover; 250ms keeps it under a second on a LAN
//     (bench/cluster's failover benchmark measured both HBs tried). The leader heartbeats every HB/10 = 25ms, from a goroutine of
//     its own, so a follower times out only after ten missed heartbeats,
//     which a loaded machine does not cause by itself. Pre-vote (on by default) keeps a flapping follower from
//     deposing a healthy leader. ElectionTimeout is the wait before a
//     candidate whose round failed tries again; raft requires it >= HB.
//   - LeaderLeaseTimeout 250ms (raft requires <= HB): a leader cut off from
//     a quorum steps down within a quarter second, bounding how long it may
//     believe it leads.
//   - CommitTimeout 20ms: when no new entries flow, the leader still tells
//     followers the commit index this often, so a read on a follower after a
//     write waits at most about this long.
//   - BatchApplyCh with MaxAppendEntries 256: concurrent Applies are gathered
//     into one log append, one fsync and one AppendEntries per follower (group
//     commit); the FSM then applies them as a batch.
//   - TrailingLogs = MaxUint64: the log is never compacted (docs/audit.md).
//     Snapshots are still taken (SnapshotThreshold entries) so that a restart
//     restores the latest snapshot and replays only the entries after it; and
//     because every server keeps every entry, a lagging or new follower is
//     sent log entries from index 1, never only a snapshot, so it too holds
//     the full history.
func raftConfig(id string) *raft.Config {
	c := raft.DefaultConfig()
	c.LocalID = raft.ServerID(id)
	c.HeartbeatTimeout = 250 * time.Millisecond
	c.ElectionTimeout = 250 * time.Millisecond
	c.LeaderLeaseTimeout = 250 * time.Millisecond
	c.CommitTimeout = 20 * time.Millisecond
	c.BatchApplyCh = true
	c.MaxAppendEntries = 256
	c.TrailingLogs = math.MaxUint64
	c.SnapshotThreshold = 8192
	c.SnapshotInterval = 2 * time.Minute
	c.ShutdownOnRemove = true
	c.NoLegacyTelemetry = true
	return c
}
