package cluster

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/gpuplane/gpuplane/fsm"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// reconcileInterval is how often the leader reconciles membership when
// gossip reports nothing (gossip changes wake it at once).
const reconcileInterval = time.Second

// absentGrace is how long a new leader waits before marking down a node
// that is alive in the log but unknown to its gossip: time for push/pull to
// tell it about every member.
const absentGrace = 5 * time.Second

// membershipActor is the actor of the entries the leader writes for gossip.
const membershipActor = "system/membership"

// leaderLoop runs on every server: it starts the leader's duties when this
// server becomes leader and stops them when it steps down. It watches
// leadership with a raft observer plus a short poll rather than LeaderCh,
// which only one reader may consume.
func (c *Cluster) leaderLoop() {
	obs := make(chan raft.Observation, 8)
	o := raft.NewObserver(obs, false, func(o *raft.Observation) bool {
		_, ok := o.Data.(raft.LeaderObservation)
		return ok
	})
	c.raft.RegisterObserver(o)
	defer c.raft.DeregisterObserver(o)
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()

	// run is the current term's leader duties, nil when not leading.
	type leaderRun struct {
		cancel context.CancelFunc
		done   chan struct{}
	}
	var run *leaderRun
	stopLeading := func() {
		if run != nil {
			run.cancel()
			<-run.done
			run = nil
		}
	}
	announced := false
	for {
		select {
		case <-c.mem.stop:
			stopLeading()
			return
		case <-obs:
		case <-t.C:
		}
		if !announced && c.hasRaftState() {
			// Servers waiting on --bootstrap-expect must see that this one
			// belongs to a cluster and wait to be added instead of forming
			// another.
			announced = c.Announce() == nil
		}
		switch leading := c.IsLeader(); {
		case leading && run == nil:
			ctx, cancel := context.WithCancel(context.Background())
			run = &leaderRun{cancel: cancel, done: make(chan struct{})}
			go func(done chan struct{}) {
				defer close(done)
				c.lead(ctx)
			}(run.done)
		case !leading && run != nil:
			stopLeading()
		}
	}
}

// lead runs the leader's duties until ctx ends: after a barrier (so that its
// state reflects every entry committed before it led), it reconciles gossip
// into Raft's configuration and the log whenever gossip changes, and every
// reconcileInterval.
func (c *Cluster) lead(ctx context.Context) {
	c.log.Info("leading", "term", c.raft.CurrentTerm())
	if err := wait(ctx, c.raft.Barrier(10*time.Second)); err != nil {
		c.log.Warn("leader barrier", "err", err)
		return
	}
	since := time.Now()
	t := time.NewTicker(reconcileInterval)
	defer t.Stop()
	leftSince := map[string]time.Time{}
	for {
		began := time.Now()
		c.reconcile(ctx, time.Since(since))
		c.reapLeft(ctx, leftSince)
		c.recordReconcile(time.Since(began))
		select {
		case <-ctx.Done():
			return
		case <-c.mem.leaderWake:
		case <-t.C:
		}
	}
}

func (c *Cluster) recordReconcile(d time.Duration) {
	m := c.mem
	m.reconciles.Add(1)
	m.reconcileLast.Store(int64(d))
	for {
		old := m.reconcileMax.Load()
		if int64(d) <= old || m.reconcileMax.CompareAndSwap(old, int64(d)) {
			return
		}
	}
}

// ReconcileStats is how many reconcile rounds this server ran as leader,
// and how long the last and the longest took (the writes they made
// included): what bench/fleet reports per round.
func (c *Cluster) ReconcileStats() (rounds int64, last, longest time.Duration) {
	return c.mem.reconciles.Load(), time.Duration(c.mem.reconcileLast.Load()), time.Duration(c.mem.reconcileMax.Load())
}

func (c *Cluster) reconcile(ctx context.Context, leading time.Duration) {
	g := c.mem.gossip.Load()
	if g == nil {
		return
	}
	members := g.Members()
	c.reconcileRaft(ctx, members)
	c.reconcileNodes(ctx, members, leading)
}

// reconcileRaft adds servers gossip sees alive to Raft as voters, first
// removing stale entries with the same id (a server back on a new address)
// or the same address (a new server on a reused address), and removes
// servers that left gracefully. Failed servers stay: their loss may be
// brief, and removing one needs an operator (remove-peer).
func (c *Cluster) reconcileRaft(ctx context.Context, members []GossipMember) {
	f := c.raft.GetConfiguration()
	if f.Error() != nil {
		return
	}
	byID := map[raft.ServerID]raft.Server{}
	byAddr := map[raft.ServerAddress]raft.Server{}
	for _, s := range f.Configuration().Servers {
		byID[s.ID], byAddr[s.Address] = s, s
	}
	self := raft.ServerID(c.cfg.NodeName)
	for _, m := range members {
		id, addr := raft.ServerID(m.Name), raft.ServerAddress(m.Meta.Raft)
		if m.Meta.Role != RoleServer || id == self || addr == "" || ctx.Err() != nil {
			continue
		}
		switch m.Status {
		case GossipAlive:
			if s, ok := byID[id]; ok && s.Address == addr {
				continue
			}
			if _, ok := byID[id]; ok {
				c.removeServer(ctx, id, "its address changed")
			}
			if s, ok := byAddr[addr]; ok && s.ID != id && s.ID != self {
				c.removeServer(ctx, s.ID, "its address now belongs to "+m.Name)
			}
			if err := wait(ctx, c.raft.AddVoter(id, addr, 0, 0)); err != nil {
				c.log.Warn("add server to raft", "server", m.Name, "err", err)
				continue
			}
			c.log.Info("added server to raft", "server", m.Name, "raft_addr", addr)
		case GossipLeft:
			if _, ok := byID[id]; ok {
				c.removeServer(ctx, id, "it left")
			}
		}
	}
}

func (c *Cluster) removeServer(ctx context.Context, id raft.ServerID, why string) {
	if err := wait(ctx, c.raft.RemoveServer(id, 0, 0)); err != nil {
		c.log.Warn("remove server from raft", "server", id, "err", err)
		return
	}
	c.log.Info("removed server from raft", "server", id, "reason", why)
}

// reconcileNodes writes into the log what gossip says about each node, only
// where the log says otherwise: a node gossip sees alive that the log does
// not know, or whose inventory digest moved, is fetched whole from its API
// and registered; a status change (alive, down, left) becomes
// SetNodeStatus. A node the log has alive but gossip has never heard of is
// marked down once this leader has led long enough to know every member.
func (c *Cluster) reconcileNodes(ctx context.Context, members []GossipMember, leading time.Duration) {
	// What the round needs of each node (its status and its inventory's
	// digest), read without copying the nodes: with a thousand nodes, a
	// copy of each, and a digest hashed anew, every round was most of it.
	nodes := make(map[string]nodeBrief, len(members))
	c.View(func(f *fsm.FSM) {
		f.RangeNodes(func(n *pb.Node) {
			nodes[n.GetName()] = nodeBrief{status: n.GetStatus(), digest: c.mem.digests.of(n, c.cfg.Digest)}
		})
	})
	// Every change this round is proposed together and waited for once
	// (leaderApplyAll): a fleet's registration, or a tenth of it dying,
	// is one round of a few appends, not one commit wait per node.
	var envs []*pb.Envelope
	var register []GossipMember
	for _, m := range members {
		want := gossipStatus(m.Status)
		n, known := nodes[m.Name]
		delete(nodes, m.Name)
		if want == pb.NodeStatus_NODE_STATUS_ALIVE && m.Meta.API != "" &&
			(!known || n.digest != m.Meta.Digest) {
			register = append(register, m)
			continue
		}
		if known && n.status != want {
			envs = append(envs, statusEnvelope(m.Name, want))
		}
	}
	for i, node := range c.fetchMembers(ctx, register) {
		m := register[i]
		if node != nil {
			node.Status = pb.NodeStatus_NODE_STATUS_ALIVE
			envs = append(envs, &pb.Envelope{Command: &pb.Envelope_RegisterNode{RegisterNode: &pb.RegisterNode{Node: node}}})
			continue
		}
		// Not fetched: its status still follows gossip.
		if n, known := c.nodeIn(m.Name); known && n.GetStatus() != pb.NodeStatus_NODE_STATUS_ALIVE {
			envs = append(envs, statusEnvelope(m.Name, pb.NodeStatus_NODE_STATUS_ALIVE))
		}
	}
	if leading >= absentGrace {
		for name, n := range nodes {
			if n.status == pb.NodeStatus_NODE_STATUS_ALIVE {
				envs = append(envs, statusEnvelope(name, pb.NodeStatus_NODE_STATUS_DOWN))
			}
		}
	}
	c.leaderApplyAll(ctx, envs)
}

// nodeBrief is what a reconcile round reads of a node from the state.
type nodeBrief struct {
	status pb.NodeStatus
	digest string
}

// digestCache remembers each node's inventory digest, keyed by the cards
// it was computed from: the state replaces a node's cards (a new slice of
// new cards) whenever its inventory changes, so the same first card and
// count mean the same inventory. Only the leader's reconcile uses it, from
// one goroutine at a time.
type digestCache struct {
	mu      sync.Mutex
	entries map[string]cachedDigest
}

type cachedDigest struct {
	first  *pb.Card
	n      int
	digest string
}

// of returns the digest of n's cards, computing it with digest only when
// they changed since the last call for n.
func (d *digestCache) of(n *pb.Node, digest func([]*pb.Card) string) string {
	cards := n.GetCards()
	var first *pb.Card
	if len(cards) > 0 {
		first = cards[0]
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if e, ok := d.entries[n.GetName()]; ok && e.first == first && e.n == len(cards) {
		return e.digest
	}
	if d.entries == nil {
		d.entries = map[string]cachedDigest{}
	}
	e := cachedDigest{first: first, n: len(cards), digest: digest(cards)}
	d.entries[n.GetName()] = e
	return e.digest
}

// nodeIn returns a node as this server's state has it.
func (c *Cluster) nodeIn(name string) (n *pb.Node, ok bool) {
	c.View(func(f *fsm.FSM) { n, ok = f.Node(name) })
	return n, ok
}

func (c *Cluster) setStatus(ctx context.Context, name string, s pb.NodeStatus) {
	c.leaderApply(ctx, statusEnvelope(name, s))
}

func statusEnvelope(name string, s pb.NodeStatus) *pb.Envelope {
	return &pb.Envelope{Command: &pb.Envelope_SetNodeStatus{SetNodeStatus: &pb.SetNodeStatus{Node: name, Status: s}}}
}

// fetchMembers fetches the descriptions of members from their APIs, a few
// at a time (registerFetches): nil for one that could not be fetched.
func (c *Cluster) fetchMembers(ctx context.Context, members []GossipMember) []*pb.Node {
	out := make([]*pb.Node, len(members))
	sem := make(chan struct{}, registerFetches)
	var wg sync.WaitGroup
	for i, m := range members {
		if ctx.Err() != nil {
			break
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			out[i] = c.fetchMember(ctx, m)
		})
	}
	wg.Wait()
	return out
}

// registerFetches bounds how many node descriptions the leader fetches at
// once when many nodes join together.
const registerFetches = 16

// reapLeft deregisters the nodes that have been left for
// Config.ReapLeftAfter, as this leader has seen them: leftSince holds when
// it first saw each left node, so a new leader waits the whole time again
// (it never reaps early). A server still in Raft's configuration is kept.
func (c *Cluster) reapLeft(ctx context.Context, leftSince map[string]time.Time) {
	if c.cfg.ReapLeftAfter < 0 {
		return
	}
	left := map[string]bool{}
	c.View(func(f *fsm.FSM) {
		for _, n := range f.Nodes() {
			if n.GetStatus() == pb.NodeStatus_NODE_STATUS_LEFT {
				left[n.GetName()] = true
			}
		}
	})
	now := time.Now()
	for name := range leftSince {
		if !left[name] {
			delete(leftSince, name) // back, or gone
		}
	}
	var due []string
	for name := range left {
		first, ok := leftSince[name]
		if !ok {
			leftSince[name] = now
		} else if now.Sub(first) >= c.cfg.ReapLeftAfter {
			due = append(due, name)
		}
	}
	if len(due) == 0 {
		return
	}
	f := c.raft.GetConfiguration()
	if f.Error() != nil {
		return
	}
	voters := map[string]bool{}
	for _, s := range f.Configuration().Servers {
		voters[string(s.ID)] = true
	}
	for _, name := range due {
		if voters[name] || ctx.Err() != nil {
			continue
		}
		c.log.Info("deregistering node", "node", name, "left_for", now.Sub(leftSince[name]).Round(time.Second))
		c.leaderApply(ctx, &pb.Envelope{Command: &pb.Envelope_DeregisterNode{DeregisterNode: &pb.DeregisterNode{Node: name}}})
	}
}

func gossipStatus(s string) pb.NodeStatus {
	switch s {
	case GossipFailed:
		return pb.NodeStatus_NODE_STATUS_DOWN
	case GossipLeft:
		return pb.NodeStatus_NODE_STATUS_LEFT
	}
	return pb.NodeStatus_NODE_STATUS_ALIVE
}

// fetchMember fetches a node's description from its API (this node's
// own, locally); nil when it cannot.
func (c *Cluster) fetchMember(ctx context.Context, m GossipMember) *pb.Node {
	fw := c.getForwarder()
	if fw == nil {
		return nil
	}
	fctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var node *pb.Node
	var err error
	if m.Name == c.cfg.NodeName {
		node = c.LocalNode()
	} else {
		node, err = fw.LocalNode(fctx, m.Name)
	}
	if err != nil || node == nil || node.GetName() != m.Name {
		c.log.Warn("fetch node to register", "node", m.Name, "err", err)
		return nil
	}
	return node
}

// leaderApplyAll is leaderApply of each of envs, all proposed before any
// is waited for, so that Raft appends them together.
func (c *Cluster) leaderApplyAll(ctx context.Context, envs []*pb.Envelope) {
	var (
		worth   []*pb.Envelope
		checks  []*pb.Result
		futures []raft.ApplyFuture
	)
	for _, env := range envs {
		env.Actor, env.RequestId = membershipActor, NewRequestID()
		var dry *pb.Result
		c.View(func(f *fsm.FSM) { dry = f.DryRun(env) })
		if worthAnEntry(dry) {
			worth, checks = append(worth, env), append(checks, dry)
		}
	}
	if len(worth) == 0 {
		return
	}
	actx, cancel := context.WithTimeout(ctx, 5*time.Second+time.Duration(len(worth))*10*time.Millisecond)
	defer cancel()
	for _, env := range worth {
		f, err := c.propose(actx, env)
		if err != nil {
			c.log.Warn("membership entry", "command", checks[len(futures)].GetMessage(), "err", err)
			break
		}
		futures = append(futures, f)
	}
	w := waitAll(futures)
	select {
	case <-w.done:
	case <-actx.Done():
	}
	for i, f := range futures[:w.resolved()] {
		if err := f.Error(); err != nil {
			c.log.Warn("membership entry", "command", checks[i].GetMessage(), "err", c.raftError(err))
			continue
		}
		res, err := futureResult(f)
		if err == nil && res.GetCode() != pb.Code_CODE_OK {
			err = fmt.Errorf("%s: %s", res.GetCode(), res.GetMessage())
		}
		if err != nil {
			c.log.Warn("membership entry", "command", checks[i].GetMessage(), "err", err)
			continue
		}
		c.log.Info("membership entry", "result", res.GetMessage(), "index", res.GetIndex())
	}
}

// leaderApply commits a membership command unless the leader's own state
// (current: it leads and has passed its barrier) says it would change nothing.
func (c *Cluster) leaderApply(ctx context.Context, env *pb.Envelope) {
	env.Actor, env.RequestId = membershipActor, NewRequestID()
	var dry *pb.Result
	c.View(func(f *fsm.FSM) { dry = f.DryRun(env) })
	// Checked on this leader's applied state only (unlike Propose): a
	// reconciliation repeats while gossip and the log disagree, and a stale
	// check costs at most an entry that changes nothing.
	if !worthAnEntry(dry) {
		return
	}
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	res, err := c.applyLocal(actx, env)
	if err == nil && res.GetCode() != pb.Code_CODE_OK {
		err = fmt.Errorf("%s: %s", res.GetCode(), res.GetMessage())
	}
	if err != nil {
		c.log.Warn("membership entry", "command", dry.GetMessage(), "err", err)
		return
	}
	c.log.Info("membership entry", "result", res.GetMessage(), "index", res.GetIndex())
}
