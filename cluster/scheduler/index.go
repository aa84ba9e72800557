package scheduler

import (
	"sort"
	"strings"
)

// Node indexes: the fragmentation-aware policies score a request on a node
// from that node's state, the request's shape and the target workload
// alone. Within a State a placement changes one node, so for each request
// shape the scheduler keeps every node's score in a heap and, when the
// shape comes again, rescores only the nodes that changed since. A common
// request then costs a few rescorings and a heap look-up whatever the
// cluster's size; a shape seen for the first time scores every node once.
// Decisions are exactly those of a scan (same score, lowest node on ties).
//
// The workload must stay put between decisions, so indexes serve only
// when it is fixed (SetWorkload) or during Plan, which adds all of its
// requests to the workload before placing any; a change of the workload
// rebuilds them.

// shapeKey is what a node's score for a request depends on, besides the
// node and the deployment's replicas on it. Indexes score nodes as if the
// deployment had no replicas there; the deployment only breaks ties, after
// the rest of the score (see bestIndexed).
type shapeKey struct {
	pol      policyImpl
	acc      int32
	milli    int32
	res      Residency
	cpu, mem int64
	kinds    string
	sel      string
}

// nodeIndex holds the scores of one shape on the nodes that could ever take
// it, in a heap ordered as a scan would prefer them.
type nodeIndex struct {
	gen   uint64
	total int64
	seen  int     // entries of State.changed replayed
	slot  []int32 // node → slot, -1 when the node can never take the shape
	nodes []int32 // slot → node, ascending
	sc    []score
	ok    []bool
	heap  []int32 // slots
	pos   []int32 // slot → heap position
}

// maxIndexes bounds the shapes indexed at once; past it the State scans.
const maxIndexes = 4096

func (s *State) indexed(pol policyImpl) bool {
	return (pol == implDefault || pol == implFGD) && (s.wl.fixed || s.planning) && !s.scanOnly
}

func selectorKey(sel map[string]string) string {
	if len(sel) == 0 {
		return ""
	}
	ks := make([]string, 0, len(sel))
	for k, v := range sel {
		ks = append(ks, k+"="+v)
	}
	sort.Strings(ks)
	return strings.Join(ks, ",")
}

// bestIndexed returns the node a scan would choose, or -1 when none can
// take the request.
func (s *State) bestIndexed(q *request, pol policyImpl, dn map[int32]int32, only []int32) int32 {
	k := shapeKey{pol: pol, acc: q.acc, milli: q.milli, res: q.res, cpu: q.CPUMilli, mem: q.MemoryMiB,
		kinds: kindsKey(q.kinds), sel: selectorKey(q.Selector)}
	if s.indexes == nil {
		s.indexes = map[shapeKey]*nodeIndex{}
	}
	x := s.indexes[k]
	if x == nil {
		if len(s.indexes) >= maxIndexes {
			clear(s.indexes)
		}
		x = s.newIndex(q, only)
		s.indexes[k] = x
	}
	ws := pol.weighting()
	switch {
	case x.gen != s.wl.gen || x.total != s.wl.total[ws] || len(s.changed)-x.seen > len(x.nodes):
		for i, ni := range x.nodes {
			x.sc[i], x.ok[i] = s.evalNode(q, ni, pol, nil)
		}
		x.heapify()
	default:
		for _, ni := range s.changed[x.seen:] {
			if i := x.slot[ni]; i >= 0 {
				x.sc[i], x.ok[i] = s.evalNode(q, ni, pol, nil)
				x.fix(x.pos[i])
			}
		}
	}
	x.gen, x.total, x.seen = s.wl.gen, s.wl.total[ws], len(s.changed)
	if len(x.heap) == 0 || !x.ok[x.heap[0]] {
		return -1
	}
	top := x.heap[0]
	if len(dn) == 0 {
		return x.nodes[top]
	}
	// The deployment has replicas: on their nodes its score is the indexed
	// one plus a positive spread term placed after it, so the choice is
	// the first node in index order, among those tied with the best, that
	// holds none of them; failing that the best of the tied ones that do.
	best := x.sc[top]
	var held []int32
	var found int32 = -1
	x.walk(func(i int32) bool {
		if !x.ok[i] || x.sc[i] != best {
			return false
		}
		ni := x.nodes[i]
		if _, ok := dn[ni]; !ok {
			found = ni
			return false
		}
		held = append(held, ni)
		return true
	})
	if found >= 0 {
		return found
	}
	bestNode := int32(-1)
	var bestSc score
	for _, ni := range held {
		if sco, ok := s.evalNode(q, ni, pol, dn); ok && (bestNode < 0 || sco.less(bestSc) || sco == bestSc && ni < bestNode) {
			bestNode, bestSc = ni, sco
		}
	}
	return bestNode
}

// walk visits slots in heap order (best first) while visit returns true.
func (x *nodeIndex) walk(visit func(slot int32) bool) {
	if len(x.heap) == 0 {
		return
	}
	frontier := []int{0} // heap positions, kept ordered by before
	for len(frontier) > 0 {
		m := 0
		for i := range frontier {
			if x.before(x.heap[frontier[i]], x.heap[frontier[m]]) {
				m = i
			}
		}
		p := frontier[m]
		frontier = append(frontier[:m], frontier[m+1:]...)
		if !visit(x.heap[p]) {
			return
		}
		for _, c := range []int{2*p + 1, 2*p + 2} {
			if c < len(x.heap) {
				frontier = append(frontier, c)
			}
		}
	}
}

func (s *State) newIndex(q *request, only []int32) *nodeIndex {
	x := &nodeIndex{slot: make([]int32, len(s.nodes)), gen: s.wl.gen - 1}
	for i := range x.slot {
		x.slot[i] = -1
	}
	add := func(ni int32) {
		if s.fitsStatic(q, ni) {
			x.slot[ni] = int32(len(x.nodes))
			x.nodes = append(x.nodes, ni)
		}
	}
	if only != nil {
		for _, ni := range only {
			add(ni)
		}
	} else {
		for ni := range s.nodes {
			add(int32(ni))
		}
	}
	n := len(x.nodes)
	x.sc, x.ok = make([]score, n), make([]bool, n)
	x.heap, x.pos = make([]int32, n), make([]int32, n)
	for i := range x.heap {
		x.heap[i], x.pos[i] = int32(i), int32(i)
	}
	return x
}

// before orders slots: nodes that can take the shape first, then by score,
// then the lower node (slots ascend with nodes).
func (x *nodeIndex) before(a, b int32) bool {
	if x.ok[a] != x.ok[b] {
		return x.ok[a]
	}
	if x.sc[a] != x.sc[b] {
		return x.sc[a].less(x.sc[b])
	}
	return a < b
}

func (x *nodeIndex) swap(i, j int) {
	x.heap[i], x.heap[j] = x.heap[j], x.heap[i]
	x.pos[x.heap[i]], x.pos[x.heap[j]] = int32(i), int32(j)
}

func (x *nodeIndex) up(i int) bool {
	moved := false
	for i > 0 {
		p := (i - 1) / 2
		if !x.before(x.heap[i], x.heap[p]) {
			break
		}
		x.swap(i, p)
		i, moved = p, true
	}
	return moved
}

func (x *nodeIndex) down(i int) {
	n := len(x.heap)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && x.before(x.heap[r], x.heap[l]) {
			m = r
		}
		if !x.before(x.heap[m], x.heap[i]) {
			return
		}
		x.swap(i, m)
		i = m
	}
}

func (x *nodeIndex) fix(i int32) {
	if !x.up(int(i)) {
		x.down(int(i))
	}
}

func (x *nodeIndex) heapify() {
	for i := len(x.heap)/2 - 1; i >= 0; i-- {
		x.down(i)
	}
}

// reasonMemo is a failure's explanation and how much of State.changed it
// had seen.
type reasonMemo struct {
	seen int
	text string
}

// reasonMemo is reason, reused while no node with cards the request could
// use has changed: past the cluster's capacity the same shapes fail again
// and again, and explaining a failure scans every node.
func (s *State) reasonMemo(q *request) string {
	k := shapeKey{acc: q.acc, milli: q.milli, res: q.res, cpu: q.CPUMilli, mem: q.MemoryMiB,
		kinds: kindsKey(q.kinds), sel: selectorKey(q.Selector)}
	if m, ok := s.reasons[k]; ok {
		valid := true
		for _, ni := range s.changed[m.seen:] {
			if q.mode == modeHost || q.kinds.intersects(s.nodes[ni].kinds) {
				valid = false
				break
			}
		}
		if valid {
			s.reasons[k] = reasonMemo{seen: len(s.changed), text: m.text}
			return m.text
		}
	}
	if s.reasons == nil || len(s.reasons) >= maxIndexes {
		s.reasons = map[shapeKey]reasonMemo{}
	}
	text := s.reason(q)
	s.reasons[k] = reasonMemo{seen: len(s.changed), text: text}
	return text
}
