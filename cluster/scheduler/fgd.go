package scheduler

import (
	"math"
	"math/bits"
	"slices"
	"strconv"
)

// Fragmentation, after Weng et al., "Beware of Fragmentation: Scheduling
// GPU-Sharing Workloads with Fragmentation Gradient Descent" (ATC'23).
//
// The target workload is a distribution over task types; a type is a demand
// shape (a share of one card, or k whole cards, or host resources only, on
// some device kinds) plus its host request. For a node and a type, the
// fragment is the free card capacity the type cannot use:
//
//   - if the node lacks the host CPU or memory for the type, all free capacity;
//   - for a share of d milli: every card that cannot take it (free < d, wrong
//     kind, bound to another accelerator, at maxModels);
//   - for k whole cards: when fewer than k cards are whole and free, all
//     free capacity, else the free capacity of the other cards;
//   - for host-only types, nothing.
//
// A node's fragmentation is the expected fragment over the workload (here a
// count-weighted sum, kept in integers so decisions are exact everywhere).
// FGD places a request where this grows least.
//
// Types that share a demand shape form a group: the per-card part depends
// only on the group, the host part only on the type. A node's group
// statistics are cached until the node or the set of groups changes.

// workload is the target workload: counts per type.
type workload struct {
	groups     []wgroup
	types      []wtype
	gidx       map[groupKey]int32
	tidx       map[typeKey]int32
	total      [numWeights]int64 // sum of all weights
	maxCPU     int64             // largest host request among the types
	maxMem     int64
	fixed      bool
	hostGroups []int32
	gen        uint64 // bumped when a group is added; invalidates node caches

	// Feasibility by host room: a type fits a node's free CPU and memory
	// when its request is at most that, so what fits depends only on how
	// many of the types' distinct CPU and memory requests the free room
	// reaches. feas caches, per weighting and that pair of ranks, the
	// weight of every group's fitting types; it is rebuilt when a type is
	// added or a weight changes.
	cpuVals, memVals []int64 // distinct type requests, ascending
	feas             map[feasKey][]int64
	feasTab          [][]int64 // the same, dense by (ws, rc, rm) where small enough (feasTabMax)
	feasDirty        bool
}

// feasTabMax bounds the dense feasibility table, in entries; a workload
// with more distinct CPU × memory requests uses the map.
const feasTabMax = 1 << 18

type feasKey struct {
	ws     int8
	rc, rm int32
}

type wgroup struct {
	mode  mode
	res   Residency
	acc   int32
	milli int32
	k     int32
	maxMM int32
	kinds kindSet
	w     [numWeights]int64 // total weight of its types
	types []int32           // its types
}

type wtype struct {
	g          int32
	cpu, mem   int64
	w          [numWeights]int64
	rcpu, rmem int32 // ranks of cpu and mem in cpuVals and memVals
}

// Weightings of the workload's types.
const (
	// byCount weighs a type by how many requests have it: the paper's
	// task-type popularity. Fragmentation reports use it.
	byCount = iota
	// byCountPaper is byCount as the paper's FGD scores decisions, used by
	// PolicyFGD: a host-only type can use no card, so all free card
	// capacity is its fragment whether or not its host request fits (its
	// share of the measure then moves alike for every choice of a request,
	// and host room never steers PolicyFGD).
	byCountPaper
	// byScarcity weighs a type by the card capacity its requests ask for,
	// in milli-cards (a host-only request as one card), times how scarce
	// the cards it could use are (State.scarcity). Used by PolicyDefault;
	// see DESIGN.md.
	byScarcity
	numWeights
)

// scarcityScale is the fixed point of the byScarcity multiplier.
const scarcityScale = 16

// demandWeight is the card capacity a request asks for, in milli-cards, a
// host-only request counting as one card.
func demandWeight(q *request) int64 {
	if q.mode == modeHost {
		return FullCard
	}
	return int64(q.milli) * int64(q.k)
}

type groupKey struct {
	mode  mode
	res   Residency
	acc   int32
	milli int32
	kinds string
}

type typeKey struct {
	g        int32
	cpu, mem int64
}

func (wl *workload) init() {
	*wl = workload{gidx: map[groupKey]int32{}, tidx: map[typeKey]int32{}, gen: wl.gen + 1, feasDirty: true}
}

// refreshFeas rebuilds the request ranks and empties the cache after the
// workload changed.
func (wl *workload) refreshFeas() {
	if !wl.feasDirty {
		return
	}
	wl.feasDirty = false
	wl.cpuVals, wl.memVals = wl.cpuVals[:0], wl.memVals[:0]
	for i := range wl.types {
		wl.cpuVals = append(wl.cpuVals, wl.types[i].cpu)
		wl.memVals = append(wl.memVals, wl.types[i].mem)
	}
	wl.cpuVals, wl.memVals = sortedUnique(wl.cpuVals), sortedUnique(wl.memVals)
	for i := range wl.types {
		t := &wl.types[i]
		t.rcpu, t.rmem = int32(rankOf(wl.cpuVals, t.cpu)), int32(rankOf(wl.memVals, t.mem))
	}
	if wl.feas == nil {
		wl.feas = map[feasKey][]int64{}
	} else {
		clear(wl.feas)
	}
	wl.feasTab = wl.feasTab[:0]
	if n := numWeights * (len(wl.cpuVals) + 1) * (len(wl.memVals) + 1); n <= feasTabMax {
		wl.feasTab = slices.Grow(wl.feasTab, n)[:n]
		clear(wl.feasTab)
	}
}

func sortedUnique(v []int64) []int64 {
	slices.Sort(v)
	return slices.Compact(v)
}

// rankOf is the number of values in the ascending vals that are at most x.
func rankOf(vals []int64, x int64) int {
	i, found := slices.BinarySearch(vals, x)
	if found {
		i++
	}
	return i
}

func kindsKey(k kindSet) string {
	if k == nil {
		return "*"
	}
	var b []byte
	for _, w := range k {
		b = strconv.AppendUint(b, w, 16)
		b = append(b, '.')
	}
	return string(b)
}

func (wl *workload) observe(q *request, cpu, mem int64, scarcity int64) {
	gk := groupKey{mode: q.mode, res: q.res, acc: q.acc, milli: q.milli, kinds: kindsKey(q.kinds)}
	g, ok := wl.gidx[gk]
	if !ok {
		g = int32(len(wl.groups))
		wl.gidx[gk] = g
		wl.groups = append(wl.groups, wgroup{mode: q.mode, res: q.res, acc: q.acc, milli: q.milli,
			k: int32(q.k), maxMM: q.maxMM, kinds: q.kinds})
		if q.mode == modeHost {
			wl.hostGroups = append(wl.hostGroups, g)
		}
		wl.gen++
	}
	tk := typeKey{g: g, cpu: cpu, mem: mem}
	t, ok := wl.tidx[tk]
	if !ok {
		t = int32(len(wl.types))
		wl.tidx[tk] = t
		wl.types = append(wl.types, wtype{g: g, cpu: cpu, mem: mem})
		wl.groups[g].types = append(wl.groups[g].types, t)
	}
	wl.maxCPU = max(wl.maxCPU, cpu)
	wl.maxMem = max(wl.maxMem, mem)
	wl.feasDirty = true
	for ws, w := range [numWeights]int64{1, 1, demandWeight(q) * scarcity / scarcityScale} {
		wl.types[t].w[ws] += w
		wl.groups[g].w[ws] += w
		wl.total[ws] += w
	}
}

// SetWorkload fixes the target workload that PolicyFGD and PolicyDefault
// pack for to the demands of reqs, as the paper does with a trace's task
// popularity; Place and Plan then stop adding their requests to it. Without
// it the target is every request seen so far plus the replicas the State
// was built with.
func (s *State) SetWorkload(reqs []Request) {
	s.wl.init() // a new generation: node caches of the old workload are stale
	for i := range reqs {
		if q, reason := s.resolveDemand(&reqs[i]); reason == "" {
			s.wl.observe(&q, reqs[i].CPUMilli, reqs[i].MemoryMiB, s.scarcity(&q, reqs[i].CPUMilli, reqs[i].MemoryMiB))
		}
	}
	s.wl.fixed = true
}

// fragCache holds a node's statistics for the groups that concern it: a
// group whose device kinds the node lacks sees all its free capacity as
// fragment whatever happens, so it only adds weight × free.
type fragCache struct {
	version uint64
	gen     uint64
	valid   bool
	rel     []int32 // groups that concern the node
	oneKind bool    // the node's cards are of one kind
	tot     int64   // free milli on healthy cards
	cpuU    int64   // free CPU in milli-cards at the cluster's ratio
	fok     []int64 // per rel group: fragment when the host fits the type
	e       []int32 // per rel whole group: whole free usable cards
	nef     []int64 // per rel whole group: free milli not on those cards

	// The node's fragmentation for the workload weights of total.
	fragValid  [numWeights]bool
	fragTotal  [numWeights]int64
	fragBefore [numWeights]int64
}

// contribShared is a healthy card's fragment for a share group: its
// unreserved capacity, unless the group's shares fit there (docs/residency.md's
// rules for the group's residency).
func (g *wgroup) contribShared(c *cardState) int64 {
	if (c.acc < 0 || c.acc == g.acc) && c.Fits(g.res, g.milli, g.maxMM) && g.kinds.has(c.kind) {
		return 0
	}
	return int64(FullCard - c.Reserved)
}

// cardChange is a card before and after a placement, as share groups see
// it: its kind, binding, replicas, free capacity and room for each
// residency.
type cardChange struct {
	kind         int32
	accB, accA   int32
	repB, repA   int32
	freeB, freeA int64
	roomB, roomA [OnDemand + 1]int32
	kindIn       bool // every group asked about allows kind
}

func (o *cardChange) set(before, after *cardState) {
	o.kind = before.kind
	o.accB, o.accA = before.acc, after.acc
	o.repB, o.repA = before.Replicas, after.Replicas
	o.freeB, o.freeA = int64(FullCard-before.Reserved), int64(FullCard-after.Reserved)
	for r := Pinned; r <= OnDemand; r++ {
		o.roomB[r], o.roomA[r] = before.Room(r), after.Room(r)
	}
}

// delta is g.contribShared(after) - g.contribShared(before).
func (o *cardChange) delta(g *wgroup) int64 {
	if !o.kindIn && !g.kinds.has(o.kind) {
		return o.freeA - o.freeB
	}
	var d int64
	if !((o.accA < 0 || o.accA == g.acc) && (g.maxMM == 0 || o.repA < g.maxMM) && g.milli <= o.roomA[g.res]) {
		d = o.freeA
	}
	if !((o.accB < 0 || o.accB == g.acc) && (g.maxMM == 0 || o.repB < g.maxMM) && g.milli <= o.roomB[g.res]) {
		d -= o.freeB
	}
	return d
}

func (g *wgroup) wholeFree(kind int32, count int32) bool {
	return count == 0 && g.kinds.has(kind)
}

func (s *State) nodeStats(ni int32) *fragCache {
	n := &s.nodes[ni]
	fc := &s.fcache[ni]
	if fc.valid && fc.version == n.version && fc.gen == s.wl.gen {
		return fc
	}
	if !fc.valid || fc.gen != s.wl.gen {
		fc.oneKind = n.kinds.single() >= 0
		fc.rel = fc.rel[:0]
		for gi := range s.wl.groups {
			if g := &s.wl.groups[gi]; g.mode == modeHost || g.kinds.intersects(n.kinds) {
				fc.rel = append(fc.rel, int32(gi))
			}
		}
	}
	nr := len(fc.rel)
	fc.fok = resize64(fc.fok, nr)
	fc.nef = resize64(fc.nef, nr)
	if cap(fc.e) < nr {
		fc.e = make([]int32, nr)
	}
	fc.e = fc.e[:nr]
	clear(fc.fok)
	clear(fc.nef)
	clear(fc.e)
	fc.tot = 0
	for ci := n.first; ci < n.first+n.n; ci++ {
		c := &s.cards[ci]
		if !c.healthy {
			continue
		}
		free := int64(FullCard - c.Reserved)
		fc.tot += free
		for j, gi := range fc.rel {
			g := &s.wl.groups[gi]
			switch g.mode {
			case modeShared:
				fc.fok[j] += g.contribShared(c)
			case modeWhole:
				if g.wholeFree(c.kind, c.Replicas) {
					fc.e[j]++
				} else {
					fc.nef[j] += free
				}
			}
		}
	}
	for j, gi := range fc.rel {
		if g := &s.wl.groups[gi]; g.mode == modeWhole {
			if fc.e[j] >= g.k {
				fc.fok[j] = fc.nef[j]
			} else {
				fc.fok[j] = fc.tot
			}
		}
	}
	fc.cpuU = s.cpuUnits(n.cpuFree(), n)
	fc.version, fc.gen, fc.valid = n.version, s.wl.gen, true
	fc.fragValid = [numWeights]bool{}
	return fc
}

func resize64(b []int64, n int) []int64 {
	if cap(b) < n {
		return make([]int64, n)
	}
	return b[:n]
}

// feasibleWeights returns, per group of the workload, the weight of its
// types whose host request fits cpuFree and memFree. The slice is shared
// and valid until the workload changes.
func (wl *workload) feasibleWeights(ws int, cpuFree, memFree int64) []int64 {
	wl.refreshFeas()
	return wl.feasibleAt(ws, int32(rankOf(wl.cpuVals, cpuFree)), int32(rankOf(wl.memVals, memFree)))
}

// feasibleAt is feasibleWeights for free room whose ranks among the
// types' CPU and memory requests are rc and rm (after refreshFeas).
func (wl *workload) feasibleAt(ws int, rc, rm int32) []int64 {
	k := feasKey{ws: int8(ws), rc: rc, rm: rm}
	slot := -1
	if len(wl.feasTab) > 0 {
		slot = (ws*(len(wl.cpuVals)+1)+int(k.rc))*(len(wl.memVals)+1) + int(k.rm)
		if v := wl.feasTab[slot]; v != nil {
			return v
		}
	} else if v, ok := wl.feas[k]; ok {
		return v
	}
	v := make([]int64, len(wl.groups))
	for i := range wl.types {
		t := &wl.types[i]
		if t.rcpu <= k.rc && t.rmem <= k.rm && (ws != byCountPaper || wl.groups[t.g].mode != modeHost) {
			v[t.g] += t.w[ws]
		}
	}
	if slot >= 0 {
		wl.feasTab[slot] = v
	} else {
		wl.feas[k] = v
	}
	return v
}

// frag combines a node's statistics into its fragmentation.
func (wl *workload) frag(fc *fragCache, ws int, feasW []int64) int64 {
	f := wl.total[ws] * fc.tot // as if every group saw all free capacity as fragment
	for j, gi := range fc.rel {
		f -= feasW[gi] * (fc.tot - fc.fok[j])
	}
	return f + wl.hostCorr(ws, feasW, fc.tot, fc.cpuU)
}

// hostCorr is what the scarcity measure counts differently from the
// others for host-only types: their fragment is the node's free CPU (in
// milli-cards at the cluster's ratio of cards to CPU) when their request
// does not fit the node's host, not its free cards, which they could never
// use (see DESIGN.md). frag and fragDeltas count every type's fragment in
// free cards; this is the difference.
func (wl *workload) hostCorr(ws int, feasW []int64, tot, cpuU int64) int64 {
	if ws != byScarcity {
		return 0
	}
	var c int64
	for _, gi := range wl.hostGroups {
		c += (wl.groups[gi].w[ws] - feasW[gi]) * (cpuU - tot)
	}
	return c
}

// fragDelta returns how much the node's fragmentation grows when the
// request takes cards (none for host-only requests).
func (ev *evaluator) fragDelta(cards []int32) int64 {
	d, _ := ev.fragDeltas(cards, ev.ws, -1)
	return d
}

// prepare readies the node's fragmentation before the placement and the
// weights of the types that still fit its host after it, for weighting ws.
func (ev *evaluator) prepare(ws int) {
	if ev.fragReady[ws] {
		return
	}
	s, q, n := ev.s, ev.q, ev.n
	wl := &s.wl
	if ev.fc == nil {
		ev.fc = s.nodeStats(ev.ni)
	}
	fc := ev.fc
	if !fc.fragValid[ws] || fc.fragTotal[ws] != wl.total[ws] {
		feasW := wl.feasibleWeights(ws, n.cpuFree(), n.memFree())
		fc.fragBefore[ws], fc.fragTotal[ws], fc.fragValid[ws] = wl.frag(fc, ws, feasW), wl.total[ws], true
	}
	ev.fragBefore[ws] = fc.fragBefore[ws]
	if !ev.ranked {
		// The ranks of the room left after the placement, once for every
		// weighting.
		wl.refreshFeas()
		ev.rcNew, ev.rmNew = int32(rankOf(wl.cpuVals, n.cpuFree()-q.CPUMilli)), int32(rankOf(wl.memVals, n.memFree()-q.MemoryMiB))
		ev.ranked = true
	}
	ev.feasWNew[ws] = wl.feasibleAt(ws, ev.rcNew, ev.rmNew)
	ev.fragReady[ws] = true
}

// fragDeltas returns how much the node's fragmentation grows when the
// request takes cards (none for host-only requests), weighted by wa and,
// unless it is -1, by wb: the fragment each group sees after the placement
// does not depend on the weighting, so one pass serves both.
func (ev *evaluator) fragDeltas(cards []int32, wa, wb int) (da, db int64) {
	s, q := ev.s, ev.q
	wl := &s.wl
	ev.prepare(wa)
	fa, fb := ev.feasWNew[wa], []int64(nil)
	if wb >= 0 {
		ev.prepare(wb)
		fb = ev.feasWNew[wb]
	}
	// The cards as they would be after the placement.
	cs := s.scratch.after[:0]
	for _, ci := range cards {
		c := s.cards[ci]
		c.acc = q.acc
		c.Add(q.res, q.milli)
		cs = append(cs, c)
	}
	s.scratch.after = cs
	fc := ev.fc
	tot := fc.tot - int64(q.reserve)*int64(len(cards))
	afterA := wl.total[wa] * tot
	var afterB int64
	if wb >= 0 {
		afterB = wl.total[wb] * tot
	}
	// One card changes (a share): what a share group sees on it before and
	// after, computed once for every group (contribShared, unrolled).
	var one cardChange
	if len(cards) == 1 {
		one.set(&s.cards[cards[0]], &cs[0])
		// On a node of one kind every group that concerns it allows the
		// card's kind.
		one.kindIn = fc.oneKind
	}
	for j, gi := range fc.rel {
		wA := fa[gi]
		var wB int64
		if fb != nil {
			wB = fb[gi]
		}
		if wA == 0 && wB == 0 {
			continue // every type of the group sees all free capacity as fragment
		}
		g := &wl.groups[gi]
		fok := fc.fok[j]
		switch g.mode {
		case modeShared:
			if len(cards) == 1 {
				fok += one.delta(g)
				break
			}
			for i, ci := range cards {
				fok += g.contribShared(&cs[i]) - g.contribShared(&s.cards[ci])
			}
		case modeWhole:
			e, nef := fc.e[j], fc.nef[j]
			for _, ci := range cards {
				c := &s.cards[ci]
				if g.wholeFree(c.kind, c.Replicas) {
					e--
				} else {
					nef -= int64(FullCard - c.Reserved)
				}
				nef += int64(FullCard - c.Reserved - q.reserve) // never whole free after
			}
			if e >= g.k {
				fok = nef
			} else {
				fok = tot
			}
		}
		afterA -= wA * (tot - fok)
		afterB -= wB * (tot - fok)
	}
	afterA += wl.hostCorr(wa, fa, tot, ev.s.cpuUnits(ev.n.cpuFree()-q.CPUMilli, ev.n))
	if wb >= 0 {
		afterB += wl.hostCorr(wb, fb, tot, ev.s.cpuUnits(ev.n.cpuFree()-q.CPUMilli, ev.n))
	}
	da = afterA - ev.fragBefore[wa]
	if wb >= 0 {
		db = afterB - ev.fragBefore[wb]
	}
	return da, db
}

// Fragmentation returns the expected share of the cluster's card capacity
// that the target workload cannot use, over alive nodes (0..1), with the
// paper's weighting (task counts). With an empty workload it is 0.
func (s *State) Fragmentation() float64 {
	total := s.wl.total[byCount]
	if total == 0 || s.gpuCap == 0 {
		return 0
	}
	var f float64
	for ni := range s.nodes {
		n := &s.nodes[ni]
		if !n.alive {
			continue
		}
		fc := s.nodeStats(int32(ni))
		w := s.wl.feasibleWeights(byCount, n.cpuFree(), n.memFree())
		f += float64(s.wl.frag(fc, byCount, w))
	}
	return f / float64(total) / float64(s.gpuCap)
}

// scarcityKey is what a type's scarcity depends on: the nodes that could
// hold it empty.
type scarcityKey struct {
	kinds    string
	mode     mode
	k        int32
	cpu, mem int64
}

// scarcity is the byScarcity multiplier of a type, in 1/scarcityScale: the
// cluster's healthy cards over the healthy cards it could ever use (at
// least 1). A card is usable when it is of the type's kinds and on a node
// whose host capacity fits the type's request and that has the type's
// number of such cards (any card, for a host-only type). Kinds alone are
// not enough: an 8-card task asking 120 cores fits only the 128-core nodes
// of openb, however many 8-card nodes of other sizes there are, so breaking
// one of those nodes costs it as much as breaking a node of a scarce kind
// costs a typed task. It depends on capacities only, never on what is
// placed, so a node's score stays independent of the others (index.go).
func (s *State) scarcity(q *request, cpu, mem int64) int64 {
	if s.healthyCards == 0 {
		return scarcityScale
	}
	key := scarcityKey{kinds: kindsKey(q.kinds), mode: q.mode, k: int32(q.k), cpu: cpu, mem: mem}
	if v, ok := s.scarce[key]; ok {
		return v
	}
	var usable int64
	for ni := range s.nodes {
		n := &s.nodes[ni]
		if (n.cpuCap > 0 && cpu > n.cpuCap) || (n.memCap > 0 && mem > n.memCap) {
			continue
		}
		var c int64
		for ci := n.first; ci < n.first+n.n; ci++ {
			if card := &s.cards[ci]; card.healthy && (q.mode == modeHost || q.kinds.has(card.kind)) {
				c++
			}
		}
		if c >= int64(max(q.k, 1)) {
			usable += c
		}
	}
	v := int64(scarcityScale)
	if usable > 0 {
		v = max(v, scarcityScale*s.healthyCards/usable)
	}
	if s.scarce == nil {
		s.scarce = map[scarcityKey]int64{}
	}
	s.scarce[key] = v
	return v
}

// paperShare is how much the paper's count-weighted measure counts in the
// default policy's blend against the scarcity-weighted one (see DESIGN.md).
const paperShare = 6

// blendUnit is the fixed point of a blended fragmentation growth: the
// growth of each measure per unit of its workload weight, in milli-cards
// × 2^-24.
const blendUnit = 1 << 24

// blendDelta is the default policy's fragmentation growth: the expected
// growth for a task drawn by count, as the paper measures it (weighted
// paperShare), plus that for a unit of card demand drawn with the
// scarcity of the cards it could use, plus the capacity it leaves dead.
func (ev *evaluator) blendDelta(cards []int32) int64 {
	wl := &ev.s.wl
	ds, dp := ev.fragDeltas(cards, byScarcity, byCountPaper)
	b := perUnit(ds, wl.total[byScarcity]) + paperShare*perUnit(dp, wl.total[byCountPaper]) +
		deadShare*ev.deadDelta(cards, dp)*blendUnit
	b += strandShare*ev.strandDelta(cards)*blendUnit + ev.hostFitDelta()
	if len(cards) > 0 {
		b += kindShare * int64(ev.q.reserve) * int64(len(cards)) * ev.s.kindPressure(ev.s.cards[cards[0]].kind) / pressureScale * blendUnit / 16
	}
	return b
}

// deadShare is how much capacity left dead counts in the blend: in full in
// both measures, as if every type of each saw it as fragment.
const deadShare = 1 + paperShare

// deadDelta is how much free card capacity on the node the placement
// leaves dead: usable by no type of the workload that asks for a card,
// because the host has no room left for any of them or no card fits any
// (the paper measure's fragment is then all of the node's free capacity
// for every such type). Nothing departs in the measure's model, so dead
// capacity is lost for good; the expected fragment counts it only for the
// types that could have used it, and in the scarcity measure, where types
// that cannot use a small node carry most of the weight, stranding a small
// node's last card can even lower the fragment (see DESIGN.md). dp is the
// paper measure's growth from fragDeltas.
func (ev *evaluator) deadDelta(cards []int32, dp int64) int64 {
	fc := ev.fc
	total := ev.s.wl.total[byCountPaper]
	before := fc.fragBefore[byCountPaper]
	tot0 := fc.tot
	tot1 := tot0 - int64(ev.q.reserve)*int64(len(cards))
	var d int64
	if tot1 > 0 && total*tot1 == before+dp {
		d += tot1
	}
	if tot0 > 0 && total*tot0 == before {
		d -= tot0
	}
	return d
}

// perUnit is delta × blendUnit / total, rounded toward zero, with a 128-bit
// intermediate so that large workloads cannot overflow it.
func perUnit(delta, total int64) int64 {
	if total <= 0 {
		return 0
	}
	neg := delta < 0
	if neg {
		delta = -delta
	}
	hi, lo := bits.Mul64(uint64(delta), blendUnit)
	if hi >= uint64(total) {
		// Cannot happen: a node's growth per unit of weight is at most its
		// free card capacity. Saturate rather than wrap.
		if neg {
			return math.MinInt64 / 2
		}
		return math.MaxInt64 / 2
	}
	q, _ := bits.Div64(hi, lo, uint64(total))
	if neg {
		return -int64(q)
	}
	return int64(q)
}
