package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/hashicorp/memberlist"
)

// DefaultGossipPort is where a join address without a port is dialled.
const DefaultGossipPort = 7412

// Meta is what gossip says about a node: enough to reach it and to notice
// that its inventory changed. The inventory itself travels by RPC.
type Meta struct {
	Role    string `json:"r"`           // "server" or "client"
	API     string `json:"a"`           // API host:port
	Raft    string `json:"f,omitempty"` // Raft host:port (servers)
	Digest  string `json:"d,omitempty"` // inventory.Digest of the node's cards
	Expect  int    `json:"e,omitempty"` // --bootstrap-expect (servers)
	Version string `json:"v,omitempty"`
	Gateway string `json:"g,omitempty"` // gateway host:port (docs/gateway.md)
	// Bootstrapped is set once the server has Raft state (it bootstrapped,
	// was added by a leader, or restarted on a data dir): a server waiting on
	// --bootstrap-expect that sees it joins that cluster instead of forming one.
	Bootstrapped bool `json:"b,omitempty"`
	// Leaving is announced just before a graceful leave. memberlist's leave
	// events do not say whether a node left or failed (its Node.State is
	// never set), so the others tell by this.
	Leaving bool `json:"l,omitempty"`
}

// Gossip states as users see them.
const (
	GossipAlive  = "alive"
	GossipFailed = "failed"
	GossipLeft   = "left"
)

// GossipMember is one node as this node's gossip sees it.
type GossipMember struct {
	Name   string
	Addr   string // gossip host:port
	Status string // GossipAlive, GossipFailed or GossipLeft
	Meta   Meta
	// Since is when this node last saw the status change.
	Since time.Time
}

// GossipConfig configures one node's memberlist.
type GossipConfig struct {
	Name string
	// Bind and Advertise are host:port; port 0 picks a free port.
	Bind, Advertise string
	Meta            Meta
	Logger          *slog.Logger
	LogLevel        slog.Leveler
	// SecretKey, when set, encrypts gossip with memberlist's keyring and
	// drops every message not encrypted with it (16, 24 or 32 bytes: AES-128,
	// -192 or -256).
	SecretKey []byte
	// OnChange is called (from memberlist's goroutines: it must not block)
	// whenever a member joins, leaves, fails or updates its meta.
	OnChange func()
}

// Gossip is a node's membership: memberlist plus the dead and left members
// memberlist itself forgets. It is a hint about who is up; the log, written
// by the leader, is what the cluster decided.
type Gossip struct {
	ml       *memberlist.Memberlist
	onChange func()

	mu      sync.Mutex
	meta    Meta
	members map[string]*GossipMember
	// alive and failed count members by status, kept by update, so that
	// the reconnect loop's once-a-second look costs nothing while none
	// has failed (a scan of every member per member per second was
	// O(N²) across a fleet).
	alive, failed int
	// servers are the members whose meta says RoleServer, for clients
	// that look for a server on every request: copying and sorting every
	// member for it was O(N) per request in a fleet.
	servers map[string]*GossipMember
	left    bool

	stop     chan struct{}
	stopOnce sync.Once
}

// memberlistConfig tunes memberlist for a LAN of up to thousands of
// nodes, detecting failures faster than its LAN defaults (Consul's) and
// costing each member little when nothing changes:
//
//   - ProbeInterval 500ms / ProbeTimeout 400ms: each node probes one random
//     member every half second (with indirect probes through 3 others when
//     the direct one times out), so some node probes a failed one within
//     about one interval. When many fail at once, the last of them is first
//     probed after about ln(failed) intervals, hence the short interval.
//     The timeout leaves a busy member 400 ms to answer, so that members
//     sharing a loaded machine are not suspected faster than they can
//     refute it.
//   - SuspicionMult 3, SuspicionMaxTimeoutMult 2: a suspected node is declared
//     failed after 3 × max(1, log10 N) × 0.5s (1.5 s below 10 nodes, 3 s at
//     100, 4.5 s at 1,000), or up to twice that when no other member
//     confirms the suspicion. A live node that was only slow refutes within
//     that time.
//   - GossipInterval 500ms to 3 peers: a change spreads in O(log N) rounds
//     (about 3 s to a thousand members), and while broadcasts are queued
//     each member sends 6 packets a second, not the 15 of memberlist's
//     200ms. Gossip traffic is what grows when members are suspected, and
//     at 200ms it can feed itself (suspicions, refutations, more packets,
//     late acks, more suspicions) among members that share little CPU.
//   - PushPullInterval 30s (LAN default), which memberlist stretches by
//     log2(N/32) above 32 nodes: a full-state exchange is O(N) bytes.
//   - EnableCompression off: a gossip packet is at most a UDP datagram,
//     and LZW allocates a 64 KiB table per message it compresses, which at
//     a thousand members made garbage collection the largest cost of
//     gossip. Compressed messages from other nodes are still read.
//   - DeadNodeReclaimTime 5s: a node restarted on another address may take
//     its name back soon after it was declared failed.
//
// FailureDetectionTime states the resulting promise.
func memberlistConfig(c GossipConfig) (*memberlist.Config, error) {
	mc := memberlist.DefaultLANConfig()
	mc.Name = c.Name
	host, port, err := splitHostPort(c.Bind, DefaultGossipPort)
	if err != nil {
		return nil, fmt.Errorf("gossip bind address: %w", err)
	}
	mc.BindAddr, mc.BindPort = host, port
	if c.Advertise != "" {
		ahost, aport, err := splitHostPort(c.Advertise, port)
		if err != nil {
			return nil, fmt.Errorf("gossip advertise address: %w", err)
		}
		mc.AdvertiseAddr, mc.AdvertisePort = ahost, aport
	}
	mc.ProbeInterval = 500 * time.Millisecond
	mc.ProbeTimeout = 400 * time.Millisecond
	mc.SuspicionMult = 3
	mc.SuspicionMaxTimeoutMult = 2
	mc.GossipInterval = 500 * time.Millisecond
	mc.GossipNodes = 3
	mc.PushPullInterval = 30 * time.Second
	mc.EnableCompression = false
	mc.DeadNodeReclaimTime = 5 * time.Second
	// memberlist's LAN default (Consul and Nomad keep it): a join's or a
	// push/pull's full state exchange with many members, on a loaded
	// machine, outlasts 2 s (bench/cluster -gossip-nodes 128 failed to
	// join with "i/o timeout", 256 with "msgpack decode error").
	mc.TCPTimeout = 10 * time.Second
	if len(c.SecretKey) > 0 {
		kr, err := memberlist.NewKeyring(nil, c.SecretKey)
		if err != nil {
			return nil, fmt.Errorf("gossip key: %w", err)
		}
		mc.Keyring = kr
		mc.GossipVerifyIncoming, mc.GossipVerifyOutgoing = true, true
	}
	return mc, nil
}

// FailureDetectionTime bounds how long gossip takes, in a cluster of up to n
// nodes, to declare a node that stopped answering failed: one probe round
// to notice (interval plus timeout, doubled to allow for probing others
// first), plus the longest suspicion timeout memberlist sets.
func FailureDetectionTime(n int) time.Duration {
	mc, _ := memberlistConfig(GossipConfig{Bind: "127.0.0.1:0"})
	return 2*(mc.ProbeInterval+mc.ProbeTimeout) + maxSuspicion(mc, n)
}

// maxSuspicion is the longest suspicion timeout memberlist (v0.6.0,
// state.go suspectNode) sets in a cluster of n nodes: SuspicionMult ×
// max(1, log10 n) × ProbeInterval, times SuspicionMaxTimeoutMult while it
// still expects SuspicionMult-2 independent confirmations (it expects none
// when fewer than that many other members could give them).
func maxSuspicion(mc *memberlist.Config, n int) time.Duration {
	scale := max(1, math.Log10(float64(max(1, n))))
	suspicion := time.Duration(float64(mc.SuspicionMult) * scale * float64(mc.ProbeInterval))
	if k := mc.SuspicionMult - 2; k >= 1 && n-2 >= k {
		suspicion *= time.Duration(mc.SuspicionMaxTimeoutMult)
	}
	return suspicion
}

// NewGossip starts memberlist on c.Bind. It joins nobody: call Join.
func NewGossip(c GossipConfig) (*Gossip, error) {
	mc, err := memberlistConfig(c)
	if err != nil {
		return nil, err
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.LogLevel == nil {
		c.LogLevel = slog.LevelWarn
	}
	g := &Gossip{meta: c.Meta, members: map[string]*GossipMember{}, servers: map[string]*GossipMember{}, onChange: c.OnChange,
		stop: make(chan struct{})}
	if g.onChange == nil {
		g.onChange = func() {}
	}
	mc.Delegate = (*gossipDelegate)(g)
	mc.Events = (*gossipEvents)(g)
	mc.Logger = log.New(memberlistLogWriter{c.Logger.With("component", "memberlist"), c.LogLevel}, "", 0)
	tr, err := newGossipNet(mc.BindAddr, mc.BindPort, mc.Logger.Printf)
	if err != nil {
		return nil, fmt.Errorf("start gossip on %s: %w", c.Bind, err)
	}
	mc.Transport = tr
	if mc.BindPort == 0 {
		mc.BindPort = tr.Port()
	}
	if mc.AdvertisePort == 0 {
		mc.AdvertisePort = tr.Port()
	}
	ml, err := memberlist.Create(mc)
	if err != nil {
		tr.Shutdown()
		return nil, fmt.Errorf("start gossip on %s: %w", c.Bind, err)
	}
	g.ml = ml
	go g.reconnectLoop()
	return g, nil
}

// reconnectInterval is how often a node tries to reach one failed member
// again, and reconnectTimeout how long after its failure it stops trying.
// reconnectsPerInterval bounds how many members of the cluster, together,
// try in one interval.
const (
	reconnectInterval     = time.Second
	reconnectTimeout      = 72 * time.Hour
	reconnectsPerInterval = 3
)

// reconnectLoop heals partitions. memberlist sends nothing to a member it
// has declared dead (probes and push/pull pick live members only; gossip
// reaches the dead only while broadcasts are pending), so once a partition
// outlasts those broadcasts both sides hold the other dead forever. Like
// serf, every reconnectInterval (±50 %) this node may try a push/pull with
// one random member it holds failed (not left): if it answers, the two
// exchange state, each refutes the other's view of it, and both turn alive
// again. It tries with probability min(failed, reconnectsPerInterval) /
// alive (capped at 1), so that the cluster as a whole makes about that
// many tries per interval whatever its size: one push/pull across a healed
// partition is enough to start both sides refuting, and a member only
// slow, not parted, refutes its own failure when the news reaches it.
// Serf's failed/alive would have a fleet whose members were slow for a
// moment (hundreds held failed) push its whole state hundreds of times a
// second, keeping every member too busy to answer probes. A member failed
// for longer than reconnectTimeout is given up on.
func (g *Gossip) reconnectLoop() {
	for {
		select {
		case <-g.stop:
			return
		case <-time.After(time.Duration(float64(reconnectInterval) * (0.5 + rand.Float64()))):
		}
		addr, ok := g.reconnectTarget(rand.Float64())
		if !ok {
			continue
		}
		_, _ = g.ml.Join([]string{addr}) // failure is the common case: still partitioned
	}
}

// reconnectTarget picks the failed member to try this round, if any: with
// probability min(failed, reconnectsPerInterval)/alive (draw is uniform in
// [0, 1)), one of them at random.
func (g *Gossip) reconnectTarget(draw float64) (string, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.left || g.failed == 0 || draw >= float64(min(g.failed, reconnectsPerInterval))/float64(max(1, g.alive)) {
		return "", false
	}
	var failed []string
	for _, m := range g.members {
		if m.Status == GossipFailed && m.Addr != "" && time.Since(m.Since) < reconnectTimeout {
			failed = append(failed, m.Addr)
		}
	}
	if len(failed) == 0 {
		return "", false
	}
	return failed[rand.IntN(len(failed))], true
}

// Addr is the gossip address this node advertises.
func (g *Gossip) Addr() string { return g.ml.LocalNode().Address() }

// Join contacts the given gossip addresses (host or host:port) and returns
// how many answered. Addresses that are this node's own are skipped; a list
// holding only them succeeds with 0.
func (g *Gossip) Join(addrs []string) (int, error) {
	others := g.others(addrs)
	if len(others) == 0 {
		return 0, nil
	}
	n, err := g.ml.Join(others)
	if n > 0 {
		return n, nil
	}
	return 0, fmt.Errorf("join %v: %w", others, err)
}

// others drops this node's own address from addrs and adds the default port.
func (g *Gossip) others(addrs []string) []string {
	self := g.ml.LocalNode()
	var out []string
	for _, a := range addrs {
		host, port, err := splitHostPort(a, DefaultGossipPort)
		if err != nil {
			out = append(out, a) // let memberlist report it
			continue
		}
		if port == int(self.Port) {
			if ips, _ := net.LookupIP(host); slices.ContainsFunc(ips, func(ip net.IP) bool {
				return ip.Equal(self.Addr) || (ip.IsLoopback() && self.Addr.IsLoopback())
			}) {
				continue
			}
		}
		out = append(out, net.JoinHostPort(host, strconv.Itoa(port)))
	}
	return out
}

// JoinRetry joins addrs until one answers or stop is closed, waiting between
// attempts with jitter so that servers started together do not retry in
// lockstep (1 s, growing to 10 s, each ±50 %).
func (g *Gossip) JoinRetry(addrs []string, stop <-chan struct{}, log *slog.Logger) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	b := &backoff.ExponentialBackOff{InitialInterval: time.Second, RandomizationFactor: 0.5, Multiplier: 2, MaxInterval: 10 * time.Second}
	// Only stop ends the retries, hence no elapsed-time limit.
	_, _ = backoff.Retry(ctx, func() (int, error) { return g.Join(addrs) },
		backoff.WithBackOff(b), backoff.WithMaxElapsedTime(0),
		backoff.WithNotify(func(err error, wait time.Duration) {
			log.Warn("join failed, retrying", "addrs", addrs, "err", err, "in", wait)
		}))
}

// SetMeta changes what this node announces and gossips the change.
func (g *Gossip) SetMeta(fn func(*Meta)) error {
	g.mu.Lock()
	before := g.meta
	fn(&g.meta)
	changed := g.meta != before
	g.mu.Unlock()
	if !changed {
		return nil
	}
	err := g.ml.UpdateNode(2 * time.Second)
	if isUpdateBroadcastTimeout(err) {
		// memberlist has already taken the new meta and queued its
		// broadcast; it only did not finish retransmitting it in time,
		// which in a large cluster (many broadcasts queued, each sent
		// RetransmitMult·log(N+1) times) is normal. Push/pull repairs a
		// broadcast that is lost. Reporting it as a failure made callers
		// retry, each retry a new incarnation and another broadcast on
		// the queue: bench/cluster -gossip-nodes 128 stopped on it.
		return nil
	}
	return err
}

// isUpdateBroadcastTimeout says err is memberlist's (v0.6.0) error when
// UpdateNode's broadcast is still being retransmitted at its timeout.
// memberlist has no error value or type for it, only this text;
// TestUpdateBroadcastTimeoutText fails if an upgrade changes it.
func isUpdateBroadcastTimeout(err error) bool {
	return err != nil && err.Error() == "timeout waiting for update broadcast"
}

// LocalMeta is what this node announces.
func (g *Gossip) LocalMeta() Meta {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.meta
}

// Members returns every node this one has heard of, itself included, sorted
// by name, with failed and left nodes kept (memberlist forgets them).
func (g *Gossip) Members() []GossipMember {
	g.mu.Lock()
	defer g.mu.Unlock()
	return sortedMembers(g.members)
}

// Servers returns the members whose meta says they are servers, as
// Members does (sorted by name, failed and left ones kept).
func (g *Gossip) Servers() []GossipMember {
	g.mu.Lock()
	defer g.mu.Unlock()
	return sortedMembers(g.servers)
}

// sortedMembers copies ms sorted by name.
func sortedMembers(ms map[string]*GossipMember) []GossipMember {
	out := make([]GossipMember, 0, len(ms))
	for _, m := range ms {
		out = append(out, *m)
	}
	slices.SortFunc(out, func(a, b GossipMember) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Member returns one member by name.
func (g *Gossip) Member(name string) (GossipMember, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	m, ok := g.members[name]
	if !ok {
		return GossipMember{}, false
	}
	return *m, true
}

// Leave tells the others this node is leaving, waiting up to timeout for
// the message to go out. The node keeps answering gossip until Shutdown.
// It first gossips its intent (Meta.Leaving) and gives it a moment to
// spread, so that the others record a leave rather than a failure.
func (g *Gossip) Leave(timeout time.Duration) error {
	g.mu.Lock()
	if g.left {
		g.mu.Unlock()
		return nil
	}
	g.left = true
	g.mu.Unlock()
	if err := g.SetMeta(func(m *Meta) { m.Leaving = true }); err != nil {
		return err
	}
	time.Sleep(leaveSpread)
	return g.ml.Leave(timeout)
}

// leaveSpread is how long a leaving node lets its intent spread: a few
// gossip rounds, enough for O(log N) fan-out in clusters of hundreds.
const leaveSpread = 500 * time.Millisecond

// Shutdown stops gossip at once, without a leave message: the others will
// see the node fail.
func (g *Gossip) Shutdown() error {
	g.stopOnce.Do(func() { close(g.stop) })
	return g.ml.Shutdown()
}

// update records a member's state. gone says the node left or failed,
// which only its last meta tells apart.
func (g *Gossip) update(n *memberlist.Node, gone bool) {
	var meta Meta
	_ = json.Unmarshal(n.Meta, &meta) // a node with bad meta is listed without it
	g.mu.Lock()
	m := g.members[n.Name]
	if m == nil {
		m = &GossipMember{Name: n.Name}
		g.members[n.Name] = m
	}
	if len(n.Meta) > 0 {
		m.Meta = meta
	}
	if m.Meta.Role == RoleServer {
		g.servers[m.Name] = m
	} else {
		delete(g.servers, m.Name)
	}
	status := GossipAlive
	switch {
	case gone && m.Meta.Leaving:
		status = GossipLeft
	case gone:
		status = GossipFailed
	}
	if m.Status != status {
		m.Since = time.Now()
		g.count(m.Status, -1)
		g.count(status, +1)
	}
	m.Addr, m.Status = n.Address(), status
	g.mu.Unlock()
	g.onChange()
}

// count adds d to the number of members with status (g.mu held).
func (g *Gossip) count(status string, d int) {
	switch status {
	case GossipAlive:
		g.alive += d
	case GossipFailed:
		g.failed += d
	}
}

// gossipDelegate supplies this node's meta. Gossip carries nothing else: the
// inventory travels by RPC, so no user messages or push/pull state.
type gossipDelegate Gossip

func (d *gossipDelegate) NodeMeta(limit int) []byte {
	g := (*Gossip)(d)
	g.mu.Lock()
	b, _ := json.Marshal(g.meta)
	g.mu.Unlock()
	if len(b) > limit {
		return nil // cannot happen with our fields; memberlist would panic
	}
	return b
}
func (*gossipDelegate) NotifyMsg([]byte)                           {}
func (*gossipDelegate) GetBroadcasts(overhead, limit int) [][]byte { return nil }
func (*gossipDelegate) LocalState(join bool) []byte                { return nil }
func (*gossipDelegate) MergeRemoteState(buf []byte, join bool)     {}

type gossipEvents Gossip

func (e *gossipEvents) NotifyJoin(n *memberlist.Node)   { (*Gossip)(e).update(n, false) }
func (e *gossipEvents) NotifyLeave(n *memberlist.Node)  { (*Gossip)(e).update(n, true) }
func (e *gossipEvents) NotifyUpdate(n *memberlist.Node) { (*Gossip)(e).update(n, false) }

// memberlistLogWriter sends memberlist's "[LEVEL] memberlist: msg" lines to
// slog at the level they name.
type memberlistLogWriter struct {
	log   *slog.Logger
	level slog.Leveler
}

func (w memberlistLogWriter) Write(p []byte) (int, error) {
	for line := range bytes.Lines(p) {
		line = bytes.TrimSpace(line)
		level := slog.LevelInfo
		for prefix, l := range map[string]slog.Level{"[DEBUG]": slog.LevelDebug, "[WARN]": slog.LevelWarn, "[ERR]": slog.LevelError, "[ERROR]": slog.LevelError} {
			if bytes.HasPrefix(line, []byte(prefix)) {
				level = l
			}
		}
		if level < w.level.Level() || len(line) == 0 {
			continue
		}
		w.log.Log(context.Background(), level, string(line))
	}
	return len(p), nil
}

var _ io.Writer = memberlistLogWriter{}

// splitHostPort splits host[:port], using def when the port is missing.
func splitHostPort(addr string, def int) (string, int, error) {
	host, ps, err := net.SplitHostPort(addr)
	if err != nil {
		// No port: the whole thing is the host.
		if _, _, err2 := net.SplitHostPort(addr + ":0"); err2 != nil {
			return "", 0, err
		}
		return addr, def, nil
	}
	port, err := strconv.Atoi(ps)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("bad port in %q", addr)
	}
	return host, port, nil
}
