package queue

import "time"

type reqState uint8

const (
	stQueued reqState = iota + 1
	stInFlight
)

// req is the scheduler's record of one request. It sits on exactly one
// intrusive list at a time: its flow's queue while queued, its
// deployment's list of in-flight background work while a background
// request is in flight.
type req struct {
	id    ID
	r     Request
	dep   *dep
	fl    *flow
	cost  int // PromptTokens + MaxTokens: what it may hold of the KV budget
	state reqState
	// inputCharged: the prompt has been charged; a re-run after preemption
	// does not charge it again.
	inputCharged bool
	// outCharged is the output charged during the current run; a
	// preemption refunds it, because the re-run generates it again.
	outCharged int
	// protected: dispatched to honour a class floor, so never preempted
	// (otherwise the floor could be taken back as soon as it is given).
	protected bool
	// coldBy is when a request waiting for a deployment that is not ready
	// is rejected (zero while the deployment is ready).
	coldBy time.Time
	// since is when it was admitted; late is set when it had waited past
	// its class's cold wait by the time its deployment became ready: it
	// sits on its flow's late list, behind the flow's fresh requests.
	since      time.Time
	late       bool
	dlIdx      int // index in the deadline heap, -1 when absent
	prev, next *req
}

// deadline is the earliest of the request's own deadline and its cold
// wait, or zero if it has neither.
func (r *req) deadline() time.Time {
	d := r.r.Deadline
	if !r.coldBy.IsZero() && (d.IsZero() || r.coldBy.Before(d)) {
		d = r.coldBy
	}
	return d
}

type reqList struct {
	head, tail *req
	n          int
}

func (l *reqList) pushBack(r *req) {
	r.prev, r.next = l.tail, nil
	if l.tail != nil {
		l.tail.next = r
	} else {
		l.head = r
	}
	l.tail = r
	l.n++
}

func (l *reqList) pushFront(r *req) {
	r.prev, r.next = nil, l.head
	if l.head != nil {
		l.head.prev = r
	} else {
		l.tail = r
	}
	l.head = r
	l.n++
}

func (l *reqList) remove(r *req) {
	if r.prev != nil {
		r.prev.next = r.next
	} else {
		l.head = r.next
	}
	if r.next != nil {
		r.next.prev = r.prev
	} else {
		l.tail = r.prev
	}
	r.prev, r.next = nil, nil
	l.n--
}

type tenant struct {
	name   string
	weight float64
	// flows counts its flows; a tenant without any is forgotten by prune.
	flows int
}

// flow is one tenant's work in one class of one deployment, with its
// virtual token counter: the service charged to it divided by its weight,
// lifted when it becomes backlogged.
type flow struct {
	t       *tenant
	counter float64
	// q holds its queued requests in order, and late those that waited
	// past their cold wait for the card (kept for the card promised): they
	// have missed what their class is for, so the flow serves its fresh
	// requests first, and a backlog kept through another model's turn
	// does not cost the requests that come after it their SLO too.
	q        reqList
	late     reqList
	inFlight int
	hidx     int    // index in the class heap, -1 when not backlogged
	seq      uint64 // when it last became backlogged: ties go to the earlier
	// idleSince is when prune first found it idle (nothing queued or in
	// flight); zero while it is not.
	idleSince time.Time
}

// idle: the flow holds no request.
func (f *flow) idle() bool { return f.queued() == 0 && f.inFlight == 0 }

// queued is how many of its requests are queued.
func (f *flow) queued() int { return f.q.n + f.late.n }

// head is the request it serves next: its oldest fresh one, else its
// oldest late one.
func (f *flow) head() *req {
	if f.q.head != nil {
		return f.q.head
	}
	return f.late.head
}

// newest is the request it sheds first: its newest fresh one, else its
// newest late one.
func (f *flow) newest() *req {
	if f.q.tail != nil {
		return f.q.tail
	}
	return f.late.tail
}

// classQ is one class of one deployment: the backlogged flows in a heap
// by counter, and the floor's account.
type classQ struct {
	flows  map[*tenant]*flow
	heap   []*flow
	queued int
	// lastLeft is the counter of the flow that most recently left the
	// backlog when no other was backlogged (hasLastLeft: one did): a flow
	// arriving to an empty class is lifted to it, so idle time is never
	// banked. A value, so that the flow itself may be forgotten.
	lastLeft    float64
	hasLastLeft bool
	// owed is the service this class is owed under its floor: it grows by
	// floor×cost for each dispatch of a higher class while this one is
	// backlogged, and shrinks by (1−floor)×cost for each of its own.
	owed float64
}

func flowLess(a, b *flow) bool {
	if a.counter != b.counter {
		return a.counter < b.counter
	}
	return a.seq < b.seq
}

func (c *classQ) up(i int) {
	h := c.heap
	for i > 0 {
		p := (i - 1) / 2
		if !flowLess(h[i], h[p]) {
			break
		}
		h[i], h[p] = h[p], h[i]
		h[i].hidx, h[p].hidx = i, p
		i = p
	}
}

func (c *classQ) down(i int) bool {
	h := c.heap
	n, i0 := len(h), i
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && flowLess(h[r], h[l]) {
			m = r
		}
		if !flowLess(h[m], h[i]) {
			break
		}
		h[i], h[m] = h[m], h[i]
		h[i].hidx, h[m].hidx = i, m
		i = m
	}
	return i > i0
}

func (c *classQ) push(f *flow) {
	f.hidx = len(c.heap)
	c.heap = append(c.heap, f)
	c.up(f.hidx)
}

func (c *classQ) removeAt(i int) {
	h := c.heap
	n := len(h) - 1
	f := h[i]
	if i != n {
		h[i] = h[n]
		h[i].hidx = i
	}
	h[n] = nil
	c.heap = h[:n]
	if i != n {
		if !c.down(i) {
			c.up(i)
		}
	}
	f.hidx = -1
}

func (c *classQ) fix(f *flow) {
	if f.hidx < 0 {
		return
	}
	if !c.down(f.hidx) {
		c.up(f.hidx)
	}
}

// deadlineHeap orders queued requests by deadline, then ID.
type deadlineHeap []*req

func dlLess(a, b *req) bool {
	da, db := a.deadline(), b.deadline()
	if !da.Equal(db) {
		return da.Before(db)
	}
	return a.id < b.id
}

func (h *deadlineHeap) up(i int) {
	s := *h
	for i > 0 {
		p := (i - 1) / 2
		if !dlLess(s[i], s[p]) {
			break
		}
		s[i], s[p] = s[p], s[i]
		s[i].dlIdx, s[p].dlIdx = i, p
		i = p
	}
}

func (h *deadlineHeap) down(i int) bool {
	s := *h
	n, i0 := len(s), i
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && dlLess(s[r], s[l]) {
			m = r
		}
		if !dlLess(s[m], s[i]) {
			break
		}
		s[i], s[m] = s[m], s[i]
		s[i].dlIdx, s[m].dlIdx = i, m
		i = m
	}
	return i > i0
}

// set puts r in the heap, moves it, or takes it out, as its deadline says.
func (h *deadlineHeap) set(r *req) {
	has := !r.deadline().IsZero()
	switch {
	case has && r.dlIdx < 0:
		r.dlIdx = len(*h)
		*h = append(*h, r)
		h.up(r.dlIdx)
	case has:
		if !h.down(r.dlIdx) {
			h.up(r.dlIdx)
		}
	case r.dlIdx >= 0:
		h.remove(r)
	}
}

func (h *deadlineHeap) remove(r *req) {
	i := r.dlIdx
	if i < 0 {
		return
	}
	s := *h
	n := len(s) - 1
	if i != n {
		s[i] = s[n]
		s[i].dlIdx = i
	}
	s[n] = nil
	*h = s[:n]
	if i != n {
		if !h.down(i) {
			h.up(i)
		}
	}
	r.dlIdx = -1
}
