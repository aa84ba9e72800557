package scheduler

import (
	"fmt"
	"sort"

	"github.com/gpuplane/gpuplane/internal/cardfit"
)

// State is the scheduler's working copy of the cluster. Place and Plan
// commit each successful decision into it, so later requests see earlier
// ones. It is not safe for concurrent use; the leader builds one per
// scheduling pass from the fsm's state.
type State struct {
	nodes   []nodeState
	cards   []cardState // each node's cards are contiguous: cards[first:first+n]
	nodeIdx map[string]int32

	kindIdx   map[string]int32
	kindNames []string

	accIdx map[string]int32
	accs   []accInfo

	replicas    map[string]*placement
	deployNodes map[string]map[int32]int32 // deployment → node → replicas there

	gpuCap  int64 // milli-cards over all cards
	gpuUsed int64

	wl        workload
	fcache    []fragCache // per node, see fgd.go
	kindNodes [][]int32   // kind → nodes with cards of it
	scratch   scratch

	// Per-request-shape node indexes (index.go): changed lists the nodes
	// in the order their state changed, which each index replays.
	changed  []int32
	indexes  map[shapeKey]*nodeIndex
	reasons  map[shapeKey]reasonMemo
	planning bool
	scanOnly bool // tests: score every node on every decision

	healthyCards int64
	cpuCapTotal  int64 // CPU over the nodes that track it (balance.go)

	// Caches of the workload's kind pressure and CPU per card (balance.go),
	// valid for the workload generation and total they were built for.
	press            []int64
	pressOK, rhoOK   bool
	pressGen, rhoGen uint64
	pressTot, rhoTot int64
	rhoCPU, rhoMilli int64
	rhoAllCPU        int64   // CPU of every type, host-only ones too
	usable           []int64 // per workload group: healthy cards of its kinds
	usableGen        uint64
	scarce           map[scarcityKey]int64 // see fgd.go
	reservedFor      []bool                // per node: whole, it is kept for a host-scarce type (balance.go)
	reservedOK       bool
	reservedGen      uint64
	reservedTot      int64
}

type accInfo struct {
	spec Accelerator
	kind int32 // -1: any kind
}

type cardState struct {
	index   int
	kind    int32
	healthy bool
	memMiB  int64
	acc     int32 // bound accelerator, -1 when unbound
	shares  []Share

	// Load is what the card holds, by the card-fit rule the state machine
	// checks placements with (docs/residency.md).
	cardfit.Load
}

type nodeState struct {
	name     string
	alive    bool
	labels   map[string]string
	first, n int32
	kinds    kindSet // kinds of its cards
	cpuCap   int64
	memCap   int64
	cpuUsed  int64
	memUsed  int64
	gpuCap   int64 // milli over healthy cards
	gpuUsed  int64 // milli reserved on healthy cards
	version  uint64
}

func (n *nodeState) cpuFree() int64 { return free(n.cpuCap, n.cpuUsed) }
func (n *nodeState) memFree() int64 { return free(n.memCap, n.memUsed) }

// unlimited stands for an untracked host resource.
const unlimited = int64(1) << 60

func free(capacity, used int64) int64 {
	if capacity <= 0 {
		return unlimited
	}
	return capacity - used
}

type placement struct {
	node       int32
	cards      []int32 // indices into State.cards
	milli      int32
	res        Residency
	acc        int32 // -1 for host-only
	deployment string
	cpu, mem   int64
}

// kindSet is a bit set of device kind ids; nil means every kind.
type kindSet []uint64

func (k kindSet) has(id int32) bool {
	if k == nil {
		return true
	}
	w := int(id >> 6)
	return w < len(k) && k[w]&(1<<(uint(id)&63)) != 0
}

func (k kindSet) add(id int32) kindSet {
	w := int(id >> 6)
	for len(k) <= w {
		k = append(k, 0)
	}
	k[w] |= 1 << (uint(id) & 63)
	return k
}

// single returns the only kind in the set, or -1.
func (k kindSet) single() int32 {
	if k == nil {
		return -1
	}
	id := int32(-1)
	for w, bits := range k {
		for b := 0; b < 64; b++ {
			if bits&(1<<uint(b)) != 0 {
				if id >= 0 {
					return -1
				}
				id = int32(w*64 + b)
			}
		}
	}
	return id
}

func (k kindSet) intersects(o kindSet) bool {
	if k == nil || o == nil {
		return true
	}
	for i := 0; i < len(k) && i < len(o); i++ {
		if k[i]&o[i] != 0 {
			return true
		}
	}
	return false
}

// NewState builds a State from the cluster view. It fails when the view
// itself breaks rule 11 (see Check) or names a node twice; the scheduler
// never builds on a state it cannot trust.
func NewState(nodes []Node, accelerators []Accelerator) (*State, error) {
	if err := Check(nodes, accelerators); err != nil {
		return nil, fmt.Errorf("scheduler state: %w", err)
	}
	s := &State{
		nodeIdx:     make(map[string]int32, len(nodes)),
		kindIdx:     map[string]int32{},
		accIdx:      map[string]int32{},
		replicas:    map[string]*placement{},
		deployNodes: map[string]map[int32]int32{},
	}
	s.wl.init()
	for _, a := range accelerators {
		if _, dup := s.accIdx[a.Name]; dup {
			return nil, fmt.Errorf("scheduler state: accelerator %q listed twice", a.Name)
		}
		k := int32(-1)
		if a.Device != "" {
			k = s.kind(a.Device)
		}
		s.accIdx[a.Name] = int32(len(s.accs))
		s.accs = append(s.accs, accInfo{spec: a, kind: k})
	}
	ncards := 0
	for _, n := range nodes {
		ncards += len(n.Cards)
	}
	var pendingShapes []request // existing replicas join the workload once all cards are known
	s.nodes = make([]nodeState, 0, len(nodes))
	s.cards = make([]cardState, 0, ncards)
	for _, n := range nodes {
		ni := int32(len(s.nodes))
		s.nodeIdx[n.Name] = ni
		ns := nodeState{
			name: n.Name, alive: n.Alive, labels: n.Labels,
			first: int32(len(s.cards)), n: int32(len(n.Cards)),
			cpuCap: n.CPUMilli, memCap: n.MemoryMiB,
			cpuUsed: n.CPUUsedMilli, memUsed: n.MemoryUsedMiB,
		}
		cards := append([]Card(nil), n.Cards...)
		sort.SliceStable(cards, func(i, j int) bool { return cards[i].Index < cards[j].Index })
		for _, c := range cards {
			ci := int32(len(s.cards))
			cs := cardState{
				index: c.Index, kind: s.kind(c.Device), healthy: c.Healthy,
				memMiB: c.MemoryMiB, acc: -1,
				shares: append([]Share(nil), c.Shares...),
			}
			ns.kinds = ns.kinds.add(cs.kind)
			if len(c.Shares) > 0 {
				cs.acc = s.accIdx[c.Accelerator] // known: Check passed
			}
			for _, sh := range c.Shares {
				cs.Add(sh.Residency, int32(sh.Milli))
				p := s.replicas[sh.Replica]
				if p == nil {
					p = &placement{node: ni, milli: int32(sh.Milli), res: sh.Residency, acc: cs.acc, deployment: sh.Deployment}
					s.replicas[sh.Replica] = p
					s.noteDeployment(sh.Deployment, ni, 1)
					q := s.shapeOf(cs.acc, sh.Milli, sh.Residency)
					pendingShapes = append(pendingShapes, q)
				}
				p.cards = append(p.cards, ci)
			}
			s.gpuCap += FullCard
			s.gpuUsed += int64(cs.Reserved)
			if cs.healthy {
				ns.gpuCap += FullCard
				ns.gpuUsed += int64(cs.Reserved)
			}
			s.cards = append(s.cards, cs)
		}
		s.nodes = append(s.nodes, ns)
	}
	for ci := range s.cards {
		if s.cards[ci].healthy {
			s.healthyCards++
		}
	}
	for ni := range s.nodes {
		if c := s.nodes[ni].cpuCap; c > 0 {
			s.cpuCapTotal += c
		}
	}
	for i := range pendingShapes {
		s.wl.observe(&pendingShapes[i], 0, 0, s.scarcity(&pendingShapes[i], 0, 0))
	}
	s.fcache = make([]fragCache, len(s.nodes))
	s.kindNodes = make([][]int32, len(s.kindNames))
	for ni := range s.nodes {
		for k := range s.kindNames {
			if s.nodes[ni].kinds.has(int32(k)) {
				s.kindNodes[k] = append(s.kindNodes[k], int32(ni))
			}
		}
	}
	return s, nil
}

func (s *State) kind(slug string) int32 {
	if k, ok := s.kindIdx[slug]; ok {
		return k
	}
	k := int32(len(s.kindNames))
	s.kindIdx[slug] = k
	s.kindNames = append(s.kindNames, slug)
	return k
}

func (s *State) noteDeployment(dep string, node int32, delta int32) {
	m := s.deployNodes[dep]
	if m == nil {
		m = map[int32]int32{}
		s.deployNodes[dep] = m
	}
	m[node] += delta
	if m[node] <= 0 {
		delete(m, node)
		if len(m) == 0 {
			delete(s.deployNodes, dep)
		}
	}
}

// Nodes returns a copy of the current cluster view, with every placement
// committed so far; Check(s.Nodes(), accelerators) must always pass.
func (s *State) Nodes() []Node {
	out := make([]Node, len(s.nodes))
	for i := range s.nodes {
		n := &s.nodes[i]
		nn := Node{
			Name: n.name, Alive: n.alive, Labels: n.labels,
			CPUMilli: n.cpuCap, MemoryMiB: n.memCap,
			CPUUsedMilli: n.cpuUsed, MemoryUsedMiB: n.memUsed,
			Cards: make([]Card, n.n),
		}
		for j := range nn.Cards {
			c := &s.cards[n.first+int32(j)]
			cc := Card{
				Node: n.name, Index: c.index, Device: s.kindNames[c.kind],
				MemoryMiB: c.memMiB, Healthy: c.healthy,
				Shares: append([]Share(nil), c.shares...),
			}
			if c.acc >= 0 {
				cc.Accelerator = s.accs[c.acc].spec.Name
			}
			nn.Cards[j] = cc
		}
		out[i] = nn
	}
	return out
}

// Allocated returns the milli-cards reserved and the total over all cards.
func (s *State) Allocated() (used, capacity int64) { return s.gpuUsed, s.gpuCap }

// Plan places the requests in order, committing each success before the next
// one is tried, and returns one Decision per request. The requests also join
// the target workload that the fragmentation-aware policies pack for (unless
// SetWorkload fixed it).
func (s *State) Plan(reqs []Request, p Policy) []Decision {
	if !s.wl.fixed {
		for i := range reqs {
			s.observe(&reqs[i])
		}
	}
	out := make([]Decision, len(reqs))
	s.planning = true // the workload stays as it is until the plan ends
	defer func() { s.planning = false }()
	for i := range reqs {
		out[i] = s.place(&reqs[i], p)
	}
	return out
}

// Place places one request and commits it when it succeeds. It is Plan for
// a single request.
func (s *State) Place(r Request, p Policy) Decision {
	if !s.wl.fixed {
		s.observe(&r)
	}
	return s.place(&r, p)
}

// Remove takes a placed replica off its cards and frees its host
// reservation (as recorded when this State placed it). It reports whether
// the replica was placed.
func (s *State) Remove(replica string) bool {
	p := s.replicas[replica]
	if p == nil {
		return false
	}
	delete(s.replicas, replica)
	n := &s.nodes[p.node]
	for _, ci := range p.cards {
		c := &s.cards[ci]
		for i, sh := range c.shares {
			if sh.Replica == replica {
				c.shares = append(c.shares[:i], c.shares[i+1:]...)
				break
			}
		}
		// Recount from the shares: the largest onDemand share cannot be
		// undone by subtraction.
		c.Load = cardfit.Load{}
		for _, sh := range c.shares {
			c.Add(sh.Residency, int32(sh.Milli))
		}
		if c.Replicas == 0 {
			c.acc = -1
		}
		reserve := p.reserve()
		s.gpuUsed -= reserve
		if c.healthy {
			n.gpuUsed -= reserve
		}
	}
	n.cpuUsed -= p.cpu
	n.memUsed -= p.mem
	n.version++
	s.changed = append(s.changed, p.node)
	s.noteDeployment(p.deployment, p.node, -1)
	return true
}

// reserve is the milli-cards a placement reserves on each of its cards.
func (p *placement) reserve() int64 {
	if p.res.Reserves() {
		return int64(p.milli)
	}
	return 0
}

// request is a Request resolved against the state.
type request struct {
	*Request
	mode    mode
	acc     int32 // -1 for host-only
	maxMM   int32 // maxModels, 0 unbounded
	milli   int32 // per card
	reserve int32 // per card: milli, or 0 for an onDemand share
	res     Residency
	k       int // cards
	kinds   kindSet
}

func (q *request) singleKind() int32 { return q.kinds.single() }

type mode uint8

const (
	modeShared mode = iota
	modeWhole
	modeHost
)

// resolve checks a request and works out what it needs; the string is the
// reason when the request cannot be placed anywhere.
func (s *State) resolve(r *Request) (request, string) {
	q := request{Request: r, acc: -1}
	if r.Replica == "" {
		return q, "replica has no id"
	}
	if p, ok := s.replicas[r.Replica]; ok {
		return q, fmt.Sprintf("replica %s is already placed on node %s", r.Replica, s.nodes[p.node].name)
	}
	return s.resolveDemand(r)
}

// resolveDemand works out what a request needs, whatever its replica id.
func (s *State) resolveDemand(r *Request) (request, string) {
	q := request{Request: r, acc: -1}
	if r.CPUMilli < 0 || r.MemoryMiB < 0 {
		return q, fmt.Sprintf("negative host request: %dm CPU, %d MiB memory", r.CPUMilli, r.MemoryMiB)
	}
	if r.Accelerator == "" {
		q.mode = modeHost
		return q, ""
	}
	ai, ok := s.accIdx[r.Accelerator]
	if !ok {
		return q, fmt.Sprintf("accelerator %q does not exist", r.Accelerator)
	}
	a := s.accs[ai]
	q.acc = ai
	if a.spec.Tenancy == Shared {
		if r.Milli < 1 || r.Milli > FullCard {
			return q, fmt.Sprintf("share of %d milli-cards is outside 1..%d", r.Milli, FullCard)
		}
		q.mode, q.milli, q.k = modeShared, int32(r.Milli), 1
		if a.spec.MaxModels > 0 {
			q.maxMM = int32(a.spec.MaxModels)
		}
		q.res = r.Residency
	} else {
		if r.Residency != Pinned {
			return q, fmt.Sprintf("an onDemand or warm replica needs a shared accelerator: %q is dedicated", r.Accelerator)
		}
		q.mode, q.milli, q.k = modeWhole, FullCard, a.spec.cardsPerReplica()
	}
	q.reserve = q.milli
	if !q.res.Reserves() {
		q.reserve = 0
	}
	q.kinds = s.kindsFor(a.kind, r.Devices)
	return q, ""
}

// kindsFor intersects an accelerator's kind with a request's device list.
func (s *State) kindsFor(accKind int32, devices []string) kindSet {
	if len(devices) == 0 {
		if accKind < 0 {
			return nil
		}
		return kindSet{}.add(accKind)
	}
	ks := kindSet{0} // non-nil: an empty set allows nothing
	for _, d := range devices {
		k := s.kind(d)
		if accKind < 0 || k == accKind {
			ks = ks.add(k)
		}
	}
	return ks
}

// shapeOf resolves the workload shape of an existing share.
func (s *State) shapeOf(acc int32, milli int, res Residency) request {
	a := s.accs[acc]
	q := request{acc: acc, kinds: s.kindsFor(a.kind, nil)}
	if a.spec.Tenancy == Shared {
		q.mode, q.milli, q.k, q.res = modeShared, int32(milli), 1, res
		if a.spec.MaxModels > 0 {
			q.maxMM = int32(a.spec.MaxModels)
		}
	} else {
		q.mode, q.milli, q.k = modeWhole, FullCard, a.spec.cardsPerReplica()
	}
	q.reserve = q.milli
	if !q.res.Reserves() {
		q.reserve = 0
	}
	return q
}

func (s *State) observe(r *Request) {
	q, reason := s.resolveDemand(r)
	if reason != "" {
		return
	}
	s.wl.observe(&q, r.CPUMilli, r.MemoryMiB, s.scarcity(&q, r.CPUMilli, r.MemoryMiB))
}

func selectorMatches(sel, labels map[string]string) bool {
	for k, v := range sel {
		if lv, ok := labels[k]; !ok || lv != v {
			return false
		}
	}
	return true
}

func (n *nodeState) hostFits(cpu, mem int64) bool {
	return cpu <= n.cpuFree() && mem <= n.memFree()
}

// fitsShared reports whether a card can take a share of the request.
func (c *cardState) fitsShared(q *request) bool {
	return c.healthy && q.kinds.has(c.kind) &&
		(c.acc < 0 || c.acc == q.acc) &&
		c.Fits(q.res, q.milli, q.maxMM)
}

// freeWhole reports whether a card is a whole free card for the request.
func (c *cardState) freeWhole(q *request) bool {
	return c.healthy && q.kinds.has(c.kind) && c.Replicas == 0
}

type cardSig struct{ kind, acc, used, pinned, odMax, count int32 }

type scratch struct {
	seen  []cardSig
	cards []int32
	cand  []int32 // evalNode's choice
	after []cardState
	best  []int32
}

func (s *State) place(r *Request, p Policy) Decision {
	q, reason := s.resolve(r)
	if reason != "" {
		return s.failed(r, reason)
	}
	pol := p.impl()
	var only []int32 // the nodes that have the one kind the request allows
	if k := q.singleKind(); k >= 0 && q.mode != modeHost {
		if int(k) >= len(s.kindNodes) || len(s.kindNodes[k]) == 0 {
			return s.failed(r, s.reason(&q))
		}
		only = s.kindNodes[k]
	}
	dn := s.deployNodes[r.Deployment]
	if s.indexed(pol) {
		if ni := s.bestIndexed(&q, pol, dn, only); ni >= 0 {
			s.evalNode(&q, ni, pol, dn)
			return s.commit(&q, ni, s.scratch.cand)
		}
		return s.failed(r, s.reasonMemo(&q))
	}
	sc := &s.scratch
	bestNode := int32(-1)
	var best score
	count := len(s.nodes)
	if only != nil {
		count = len(only)
	}
	for i := 0; i < count; i++ {
		ni := int32(i)
		if only != nil {
			ni = only[i]
		}
		sco, ok := s.evalNode(&q, ni, pol, dn)
		if ok && (bestNode < 0 || sco.less(best)) {
			bestNode, best = ni, sco
			sc.best = append(sc.best[:0], sc.cand...)
		}
	}
	if bestNode < 0 {
		return s.failed(r, s.reason(&q))
	}
	return s.commit(&q, bestNode, sc.best)
}

// fitsStatic reports whether the node could ever take the request: what
// never changes in a State (alive, device kinds, labels).
func (s *State) fitsStatic(q *request, ni int32) bool {
	n := &s.nodes[ni]
	if !n.alive {
		return false
	}
	if q.mode != modeHost && (n.n == 0 || !q.kinds.intersects(n.kinds)) {
		return false
	}
	return len(q.Selector) == 0 || selectorMatches(q.Selector, n.labels)
}

// evalNode scores the best choice for the request on one node and leaves
// its cards in s.scratch.cand; ok is false when the node cannot take it.
func (s *State) evalNode(q *request, ni int32, pol policyImpl, dn map[int32]int32) (best score, ok bool) {
	n := &s.nodes[ni]
	if !s.fitsStatic(q, ni) || !n.hostFits(q.CPUMilli, q.MemoryMiB) {
		return best, false
	}
	sc := &s.scratch
	ev := evaluator{s: s, q: q, n: n, ni: ni, pol: pol, nodeDep: dn[ni], ws: pol.weighting()}
	switch q.mode {
	case modeShared:
		sc.seen = sc.seen[:0]
	cards:
		for ci := n.first; ci < n.first+n.n; ci++ {
			c := &s.cards[ci]
			if !c.fitsShared(q) {
				continue
			}
			if ev.nodeDep == 0 {
				// A card just like one already scored scores the same
				// and loses the tie to it.
				sig := cardSig{c.kind, c.acc, c.Reserved, c.Pinned, c.OnDemandMax, c.Replicas}
				for _, o := range sc.seen {
					if o == sig {
						continue cards
					}
				}
				sc.seen = append(sc.seen, sig)
			}
			sc.cards = append(sc.cards[:0], ci)
			sco := ev.score(sc.cards)
			if !ok || sco.less(best) {
				best, ok = sco, true
				sc.cand = append(sc.cand[:0], ci)
			}
		}
	case modeWhole:
		sc.cards = sc.cards[:0]
		for ci := n.first; ci < n.first+n.n && len(sc.cards) < q.k; ci++ {
			if s.cards[ci].freeWhole(q) {
				sc.cards = append(sc.cards, ci)
			}
		}
		if len(sc.cards) < q.k {
			return best, false
		}
		best, ok = ev.score(sc.cards), true
		sc.cand = append(sc.cand[:0], sc.cards...)
	case modeHost:
		best, ok = ev.score(nil), true
		sc.cand = sc.cand[:0]
	}
	return best, ok
}

func (s *State) failed(r *Request, reason string) Decision {
	return Decision{Replica: r.Replica, Deployment: r.Deployment, Accelerator: r.Accelerator,
		Milli: r.Milli, CPUMilli: r.CPUMilli, MemoryMiB: r.MemoryMiB, Reason: reason}
}

func (s *State) commit(q *request, ni int32, cards []int32) Decision {
	n := &s.nodes[ni]
	p := &placement{node: ni, cards: append([]int32(nil), cards...), milli: q.milli, res: q.res, acc: q.acc,
		deployment: q.Deployment, cpu: q.CPUMilli, mem: q.MemoryMiB}
	d := Decision{Replica: q.Replica, Deployment: q.Deployment, Accelerator: q.Accelerator,
		Node: n.name, CPUMilli: q.CPUMilli, MemoryMiB: q.MemoryMiB}
	if q.mode != modeHost {
		d.Milli = int(q.milli)
		d.Cards = make([]int, len(cards))
		for i, ci := range cards {
			c := &s.cards[ci]
			c.acc = q.acc
			c.Add(q.res, q.milli)
			c.shares = append(c.shares, Share{Replica: q.Replica, Deployment: q.Deployment,
				Accelerator: q.Accelerator, Milli: int(q.milli), Residency: q.res})
			s.gpuUsed += int64(q.reserve)
			n.gpuUsed += int64(q.reserve) // candidates are healthy
			d.Cards[i] = c.index
		}
	}
	n.cpuUsed += q.CPUMilli
	n.memUsed += q.MemoryMiB
	n.version++
	s.changed = append(s.changed, ni)
	s.replicas[q.Replica] = p
	s.noteDeployment(q.Deployment, ni, 1)
	return d
}
