package queue

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"
)

// ErrUnknownRequest is returned for an ID that the scheduler does not hold:
// never admitted, or already ended.
var ErrUnknownRequest = errors.New("unknown request")

// drainWindow is how many recent dispatches the drain-rate estimate uses.
const drainWindow = 32

// dep is one deployment (engine) on the card.
type dep struct {
	d       Deployment
	classes [numClasses]classQ
	queued  int
	// in flight on the engine: count and KV tokens reserved
	inFlight       int
	inFlightTokens int
	// bgInFlight lists background requests in flight, oldest first, as
	// preemption candidates (newest are cut first: least work lost).
	bgInFlight reqList
	// readyBy is the expected end of a load in progress (zero: unknown).
	readyBy time.Time
	// cardBy is when its controller promises it the card (SetCardBy;
	// zero: no promise).
	cardBy time.Time
	// bestEffort: its controller serves it best-effort (SetBestEffort):
	// requests of every class wait for its promised turn.
	bestEffort bool
	// yielding: its controller has it yield the card to another model's
	// turn (SetYielding): requests of every class wait for the card
	// promised back.
	yielding bool
	// recent dispatch times, a ring, for the drain-rate estimate
	drains  [drainWindow]time.Time
	nDrains int
	dirty   bool
}

func (d *dep) fits(r *req) bool {
	if d.inFlight >= d.d.MaxInFlight {
		return false
	}
	return d.d.MaxTokens == 0 || d.inFlightTokens+r.cost <= d.d.MaxTokens
}

// yieldsTo says q fits beside d's background requests in flight because
// d's engine pauses them for it (Deployment.Yields): the requests in
// flight that are not background, and q, stay within the caps.
func (d *dep) yieldsTo(q *req) bool {
	if !d.d.Yields {
		return false
	}
	n, tokens := d.inFlight, d.inFlightTokens
	for r := d.bgInFlight.head; r != nil; r = r.next {
		n--
		tokens -= r.cost
	}
	return n < d.d.MaxInFlight && (d.d.MaxTokens == 0 || tokens+q.cost <= d.d.MaxTokens)
}

// Scheduler is the gateway's queueing core for one card: the queues of the
// card's deployments, admission, dispatch and preemption. It is not safe
// for concurrent use: the gateway calls it from one goroutine (or under one
// lock), passing the time of each event.
type Scheduler struct {
	cfg     Config
	floors  [numClasses]float64
	deps    map[string]*dep
	tenants map[string]*tenant
	// made counts the flows made since the last prune; pruneAt is when
	// the next is due (zero: no flow to prune).
	made    int
	pruneAt time.Time
	reqs    map[ID]*req
	nextID  ID
	seq     uint64
	dl      deadlineHeap
	free    []*req
	out     Output
	dirty   []*dep
}

// New returns a scheduler with cfg's rules, or an error naming the field
// that is out of range.
func New(cfg Config) (*Scheduler, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &Scheduler{
		cfg:     cfg,
		deps:    map[string]*dep{},
		tenants: map[string]*tenant{},
		reqs:    map[ID]*req{},
	}
	s.floors[Background] = cfg.BackgroundFloor
	s.floors[Standard] = cfg.StandardFloor
	return s, nil
}

// AddDeployment adds an engine to the card, or changes the limits of one
// already there (its queue and in-flight work are kept; Ready is then
// ignored: use SetReady and SetCold).
func (s *Scheduler) AddDeployment(d Deployment, now time.Time) (Output, error) {
	s.out.reset()
	if err := d.validate(); err != nil {
		return s.out, err
	}
	if x, ok := s.deps[d.Name]; ok {
		x.d.MaxInFlight, x.d.MaxTokens, x.d.QueueLimit, x.d.Yields = d.MaxInFlight, d.MaxTokens, d.QueueLimit, d.Yields
		s.pump(x, now)
		return s.out, nil
	}
	x := &dep{d: d}
	for c := range x.classes {
		x.classes[c].flows = map[*tenant]*flow{}
	}
	s.deps[d.Name] = x
	return s.out, nil
}

// SetTenant sets a tenant's weight (1 for tenants never set). A weight
// change applies to service charged from now on.
func (s *Scheduler) SetTenant(name string, weight float64) error {
	if name == "" {
		return fmt.Errorf("queue tenant: name is empty")
	}
	if !(weight > 0) || math.IsInf(weight, 0) {
		return fmt.Errorf("queue tenant %q: weight is %g: it must be a positive number", name, weight)
	}
	s.tenant(name).weight = weight
	return nil
}

// Weight is a tenant's weight (1 for a tenant never set, or forgotten
// after it was idle).
func (s *Scheduler) Weight(name string) float64 {
	if t, ok := s.tenants[name]; ok {
		return t.weight
	}
	return 1
}

func (s *Scheduler) tenant(name string) *tenant {
	t, ok := s.tenants[name]
	if !ok {
		t = &tenant{name: name, weight: 1}
		s.tenants[name] = t
	}
	return t
}

// SetReady marks a deployment's engine resident: requests waiting for its
// load stop counting down ColdWait and are dispatched.
func (s *Scheduler) SetReady(name string, now time.Time) (Output, error) {
	s.out.reset()
	d, ok := s.deps[name]
	if !ok {
		return s.out, fmt.Errorf("queue: deployment %q is not on this card", name)
	}
	if !d.d.Ready {
		d.d.Ready = true
		d.readyBy, d.cardBy, d.yielding = time.Time{}, time.Time{}, false
		var late []*req
		s.eachQueued(d, func(r *req) {
			r.coldBy = time.Time{}
			s.dl.set(r)
			if !r.late && !now.Before(r.since.Add(s.coldWait(r.r.Class))) {
				late = append(late, r)
			}
		})
		// Those that waited past their cold wait for the card go behind
		// their flows' fresh requests (flow.late), in their order.
		for _, r := range late {
			r.fl.q.remove(r)
			r.fl.late.pushBack(r)
			r.late = true
		}
	}
	s.pump(d, now)
	return s.out, nil
}

// SetCold marks a deployment's engine not resident (evicted, asleep or
// loading). readyBy is when its load is expected to finish (zero if
// unknown); it sets the Retry-After of requests that give up waiting.
// Requests already queued start waiting ColdWait from now.
func (s *Scheduler) SetCold(name string, readyBy, now time.Time) error {
	d, ok := s.deps[name]
	if !ok {
		return fmt.Errorf("queue: deployment %q is not on this card", name)
	}
	d.readyBy = readyBy
	if d.d.Ready {
		d.d.Ready = false
		s.eachQueued(d, func(r *req) { r.coldBy = s.coldBy(r, now); s.dl.set(r) })
	}
	return nil
}

// coldWait is how long a request of class c waits for a deployment that
// is not ready.
func (s *Scheduler) coldWait(c Class) time.Duration {
	if c == Background {
		return s.cfg.ColdWaitBackground
	}
	return s.cfg.ColdWait
}

// coldBy is when q, waiting from now for its deployment that is not
// ready, is rejected: after its class's cold wait, and where the card
// promised to its deployment (SetCardBy) binds q's class (waitsForCard)
// not before that promise and ColdWait more.
func (s *Scheduler) coldBy(q *req, now time.Time) time.Time {
	by := now.Add(s.coldWait(q.r.Class))
	if p := q.dep.cardBy; waitsForCard(q) && !p.IsZero() {
		by = maxTime(by, p.Add(s.cfg.ColdWait))
	}
	return by
}

// waitsForCard reports whether q waits for the card its deployment's
// controller promises (SetCardBy) rather than only its class's cold
// wait: background work always; requests of every class when the
// deployment is served best-effort (SetBestEffort) or yields the card to
// another model's turn (SetYielding). An interactive request of a model
// that merely waits its turn still gets its 503 after ColdWait.
func waitsForCard(q *req) bool {
	return q.r.Class == Background || q.dep.bestEffort || q.dep.yielding
}

// SetCardBy records when the deployment, not ready, gets its card at the
// latest, as its residency controller promises (residency.Controller's
// CardBy: a lower-class model's turn on a busy card comes within hours,
// not minutes): its background requests wait for it and ColdWait more
// instead of giving up after ColdWaitBackground, and so do its requests
// of every class where it is best-effort (SetBestEffort) or yielding
// (SetYielding); call those first. A zero by withdraws the promise for
// requests that arrive from now; those waiting keep theirs.
func (s *Scheduler) SetCardBy(name string, by, now time.Time) error {
	d, ok := s.deps[name]
	if !ok {
		return fmt.Errorf("queue: deployment %q is not on this card", name)
	}
	d.cardBy = by
	if d.d.Ready || by.IsZero() {
		return nil
	}
	s.eachQueued(d, func(q *req) {
		if !waitsForCard(q) {
			return
		}
		if c := s.coldBy(q, now); c.After(q.coldBy) {
			q.coldBy = c
			s.dl.set(q)
		}
	})
	return nil
}

// SetBestEffort records whether the deployment's controller serves it
// best-effort (residency's protected set): its requests of every class
// then wait for the card it promises (SetCardBy) and ColdWait more, as
// background requests do, instead of giving up after their cold wait.
func (s *Scheduler) SetBestEffort(name string, on bool) error {
	d, ok := s.deps[name]
	if !ok {
		return fmt.Errorf("queue: deployment %q is not on this card", name)
	}
	d.bestEffort = on
	return nil
}

// SetYielding records whether the deployment, not ready, waits because
// its controller has it yield its share of the card to another model's
// turn (residency.Controller.Yielding: a warm owner serialized with that
// turn, promised the card back by its CardBy): its requests of every
// class then wait for the card promised (SetCardBy) and ColdWait more
// instead of giving up after their cold wait. SetReady clears it.
func (s *Scheduler) SetYielding(name string, on bool) error {
	d, ok := s.deps[name]
	if !ok {
		return fmt.Errorf("queue: deployment %q is not on this card", name)
	}
	d.yielding = on
	return nil
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func (s *Scheduler) eachQueued(d *dep, fn func(*req)) {
	for c := range d.classes {
		for _, f := range d.classes[c].heap {
			for r := f.q.head; r != nil; r = r.next {
				fn(r)
			}
			for r := f.late.head; r != nil; r = r.next {
				fn(r)
			}
		}
	}
}

// MaxRequestTokens bounds a request's PromptTokens and its MaxTokens, so
// that the sums the scheduler keeps (a request's cost, the tokens in
// flight) cannot wrap: no engine holds a context this long.
const MaxRequestTokens = 1 << 40

// Enqueue admits a request. It returns the request's ID and what to do:
// the request may be dispatched at once (possibly after preempting
// background work); when its deployment's queue is full it ends at once
// as Rejected (429), unless it outranks a waiting request, which is then
// rejected in its place. An error means bad input (it names the field);
// nothing was queued and no ID was used.
func (s *Scheduler) Enqueue(r Request, now time.Time) (ID, Output, error) {
	s.out.reset()
	d, ok := s.deps[r.Deployment]
	switch {
	case !ok:
		return 0, s.out, fmt.Errorf("queue request: Deployment %q is not on this card", r.Deployment)
	case r.Tenant == "":
		return 0, s.out, fmt.Errorf("queue request: Tenant is empty")
	case r.Class >= numClasses:
		return 0, s.out, fmt.Errorf("queue request: Class %d is not background, standard or interactive", r.Class)
	case r.PromptTokens < 0:
		return 0, s.out, fmt.Errorf("queue request: PromptTokens is %d: it must not be negative", r.PromptTokens)
	case r.MaxTokens < 0:
		return 0, s.out, fmt.Errorf("queue request: MaxTokens is %d: it must not be negative", r.MaxTokens)
	case r.PromptTokens > MaxRequestTokens || r.MaxTokens > MaxRequestTokens:
		return 0, s.out, fmt.Errorf("queue request: PromptTokens %d, MaxTokens %d: each must be at most %d", r.PromptTokens, r.MaxTokens, MaxRequestTokens)
	case d.d.MaxTokens > 0 && r.PromptTokens+r.MaxTokens > d.d.MaxTokens:
		return 0, s.out, fmt.Errorf("queue request: PromptTokens+MaxTokens is %d: deployment %q holds at most %d tokens in flight",
			r.PromptTokens+r.MaxTokens, d.d.Name, d.d.MaxTokens)
	}
	s.nextID++
	id := s.nextID
	if d.queued >= d.d.QueueLimit {
		victim := s.shedFor(d, r.Class)
		if victim == nil {
			s.out.Ended = append(s.out.Ended, End{ID: id, Outcome: Rejected, Status: 429, RetryAfter: s.drainEstimate(d, now)})
			return id, s.out, nil
		}
		s.dequeue(victim)
		s.end(victim, End{Outcome: Rejected, Status: 429, RetryAfter: s.drainEstimate(d, now)})
	}
	q := s.newReq()
	q.id, q.r, q.dep, q.cost, q.state = id, r, d, r.PromptTokens+r.MaxTokens, stQueued
	q.since = now
	cq := &d.classes[r.Class]
	t := s.tenant(r.Tenant)
	f, ok := cq.flows[t]
	if !ok {
		f = &flow{t: t, hidx: -1}
		cq.flows[t] = f
		t.flows++
		s.made++
		if s.pruneAt.IsZero() {
			s.pruneAt = now.Add(s.cfg.IdleTenant)
		}
	}
	f.idleSince = time.Time{}
	q.fl = f
	if !d.d.Ready {
		q.coldBy = s.coldBy(q, now)
	}
	s.reqs[id] = q
	s.enqueue(q, false)
	s.dl.set(q)
	s.pump(d, now)
	if s.made >= s.cfg.MaxIdleFlows/2 || !now.Before(s.pruneAt) {
		s.Prune(now)
	}
	return id, s.out, nil
}

// shedFor picks the queued request that a request of class c displaces
// from d's full queue: the newest request of the tenant with the largest
// counter in the lowest class below c, or nil if no class below c waits.
// A full queue of background work thus never turns interactive requests
// away.
func (s *Scheduler) shedFor(d *dep, c Class) *req {
	for k := Background; k < c; k++ {
		cq := &d.classes[k]
		if cq.queued == 0 {
			continue
		}
		worst := cq.heap[0]
		for _, f := range cq.heap[1:] {
			if flowLess(worst, f) {
				worst = f
			}
		}
		return worst.newest()
	}
	return nil
}

func (s *Scheduler) newReq() *req {
	if n := len(s.free); n > 0 {
		q := s.free[n-1]
		s.free = s.free[:n-1]
		return q
	}
	return &req{dlIdx: -1}
}

func (s *Scheduler) release(q *req) {
	delete(s.reqs, q.id)
	*q = req{dlIdx: -1}
	s.free = append(s.free, q)
}

// enqueue puts q on its flow's queue: at the back when new, at the front
// when a preempted request is re-queued. A flow that becomes backlogged
// with new work is lifted to the smallest counter among the backlogged
// flows (or the last to leave, when none is), so that it cannot spend
// service it did not claim while idle. A re-queued request is work the
// flow was already granted, so its flow is not lifted.
func (s *Scheduler) enqueue(q *req, front bool) {
	f, d := q.fl, q.dep
	cq := &d.classes[q.r.Class]
	if f.hidx < 0 {
		if !front {
			lift := math.Inf(-1)
			switch {
			case len(cq.heap) > 0:
				lift = cq.heap[0].counter
			case cq.hasLastLeft:
				lift = cq.lastLeft
			}
			f.counter = max(f.counter, lift)
		}
		s.seq++
		f.seq = s.seq
		cq.push(f)
	}
	if front {
		f.q.pushFront(q)
	} else {
		f.q.pushBack(q)
	}
	cq.queued++
	d.queued++
	q.state = stQueued
}

// dequeue takes a queued q off its flow's queue.
func (s *Scheduler) dequeue(q *req) {
	f, d := q.fl, q.dep
	cq := &d.classes[q.r.Class]
	if q.late {
		f.late.remove(q)
		q.late = false
	} else {
		f.q.remove(q)
	}
	cq.queued--
	d.queued--
	if cq.queued == 0 {
		cq.owed = 0 // a floor is owed only while the class waits
	}
	if f.queued() == 0 {
		cq.removeAt(f.hidx)
		if len(cq.heap) == 0 {
			cq.lastLeft, cq.hasLastLeft = f.counter, true
		}
	}
	s.dl.remove(q)
	q.coldBy = time.Time{}
}

// charge adds cost tokens at price to q's flow.
func (s *Scheduler) charge(q *req, tokens int, price float64) {
	f := q.fl
	f.counter += float64(tokens) * price / f.t.weight
	q.dep.classes[q.r.Class].fix(f)
}

// pickClass chooses the class to serve next on d: a class whose floor
// account covers its head request (the lowest such first), else the
// highest backlogged. byFloor says the floor chose it.
func (s *Scheduler) pickClass(d *dep) (c Class, byFloor, ok bool) {
	top := Class(numClasses)
	for c := Interactive; ; c-- {
		if d.classes[c].queued > 0 {
			top = c
			break
		}
		if c == Background {
			return 0, false, false
		}
	}
	for c := Background; c < top; c++ {
		cq := &d.classes[c]
		if cq.queued > 0 && cq.owed > 0 && cq.owed >= (1-s.floors[c])*float64(cq.heap[0].head().cost) {
			return c, true, true
		}
	}
	return top, false, true
}

// account updates the floors' accounts for a dispatch of cost tokens in
// class k (called before the request leaves the queue).
func (s *Scheduler) account(d *dep, k Class, cost int) {
	higher := false // some class above c is backlogged
	for c := Interactive; ; c-- {
		cq := &d.classes[c]
		if s.floors[c] > 0 {
			switch {
			case cq.queued == 0 || !higher:
				cq.owed = 0
			case k > c:
				cq.owed += s.floors[c] * float64(cost)
			case k == c:
				cq.owed -= (1 - s.floors[c]) * float64(cost)
			}
		}
		if cq.queued > 0 {
			higher = true
		}
		if c == Background {
			return
		}
	}
}

// pump dispatches from d's queues while its engine has room, preempting
// background work for interactive requests that do not fit.
func (s *Scheduler) pump(d *dep, now time.Time) {
	for d.d.Ready {
		c, byFloor, ok := s.pickClass(d)
		if !ok {
			return
		}
		cq := &d.classes[c]
		f := cq.heap[0]
		q := f.head()
		// An interactive head that does not fit takes the room of
		// background work, and is dispatched into it at once.
		if !d.fits(q) && (c != Interactive || s.cfg.NoPreemption || !d.yieldsTo(q) && !s.preemptFor(d, q)) {
			return
		}
		s.account(d, c, q.cost)
		s.dequeue(q)
		q.state = stInFlight
		q.protected = byFloor
		d.inFlight++
		d.inFlightTokens += q.cost
		f.inFlight++
		if c == Background {
			d.bgInFlight.pushBack(q)
		}
		if !q.inputCharged {
			q.inputCharged = true
			s.charge(q, q.r.PromptTokens, s.cfg.InputPrice)
		}
		d.drains[d.nDrains%drainWindow] = now
		d.nDrains++
		s.out.Dispatched = append(s.out.Dispatched, q.id)
	}
}

// preemptFor cuts off the newest unprotected background requests in
// flight on d until q fits. It preempts nothing, and reports false, if
// even all of them would not make room.
func (s *Scheduler) preemptFor(d *dep, q *req) bool {
	n, tokens := d.inFlight, d.inFlightTokens
	var last *req
	for r := d.bgInFlight.tail; r != nil; r = r.prev {
		if r.protected {
			continue
		}
		n--
		tokens -= r.cost
		if n < d.d.MaxInFlight && (d.d.MaxTokens == 0 || tokens+q.cost <= d.d.MaxTokens) {
			last = r
			break
		}
	}
	if last == nil {
		return false
	}
	for r := d.bgInFlight.tail; ; {
		prev := r.prev
		if !r.protected {
			s.preempt(r)
		}
		if r == last {
			return true
		}
		r = prev
	}
}

// preempt takes a background request off its engine. A streamed one ends:
// its client received what was generated, so that stays charged. Any other
// goes back to the front of its tenant's queue, refunded the output of the
// cut run (the re-run generates it again); its prompt stays charged and is
// not charged again.
func (s *Scheduler) preempt(q *req) {
	s.leaveEngine(q)
	if q.r.Streamed {
		s.out.Preempted = append(s.out.Preempted, Preemption{ID: q.id})
		s.end(q, End{Outcome: Preempted, WasInFlight: true})
		return
	}
	s.out.Preempted = append(s.out.Preempted, Preemption{ID: q.id, Requeued: true})
	s.requeue(q)
}

// requeue puts q, off its engine, back at the front of its tenant's queue,
// refunded the output of the cut run (the re-run generates it again); its
// prompt stays charged and is not charged again.
func (s *Scheduler) requeue(q *req) {
	q.fl.counter -= float64(q.outCharged) * s.cfg.OutputPrice / q.fl.t.weight
	q.dep.classes[q.r.Class].fix(q.fl)
	q.outCharged = 0
	s.enqueue(q, true)
	s.dl.set(q)
}

// Requeue puts an in-flight background request that is not streamed back
// at the front of its tenant's queue, as a preemption does, when its
// engine went away (asleep or stopped) before answering it: it runs
// again once its deployment is ready, waiting for it as a new background
// request would (no client saw any of it). For any other request it
// reports false and changes nothing; the caller ends it.
func (s *Scheduler) Requeue(id ID, now time.Time) (bool, Output, error) {
	s.out.reset()
	q, err := s.inFlight(id, 0)
	if err != nil {
		return false, s.out, err
	}
	if q.r.Class != Background || q.r.Streamed {
		return false, s.out, nil
	}
	s.leaveEngine(q)
	if !q.dep.d.Ready {
		q.coldBy = s.coldBy(q, now)
	}
	s.requeue(q)
	s.pump(q.dep, now)
	return true, s.out, nil
}

func (s *Scheduler) leaveEngine(q *req) {
	d := q.dep
	d.inFlight--
	d.inFlightTokens -= q.cost
	q.fl.inFlight--
	if q.r.Class == Background {
		d.bgInFlight.remove(q)
	}
	q.protected = false
}

func (s *Scheduler) end(q *req, e End) {
	e.ID = q.id
	s.out.Ended = append(s.out.Ended, e)
	s.release(q)
}

// Progress reports that an in-flight request has generated `generated`
// tokens so far; the new ones are charged to its tenant now, so fairness
// follows service as it is delivered.
func (s *Scheduler) Progress(id ID, generated int) error {
	q, err := s.inFlight(id, generated)
	if err != nil {
		return err
	}
	s.chargeOutput(q, generated)
	return nil
}

// chargeOutput charges q's tenant for the output generated since the last
// report.
func (s *Scheduler) chargeOutput(q *req, generated int) {
	if delta := generated - q.outCharged; delta > 0 {
		q.outCharged = generated
		s.charge(q, delta, s.cfg.OutputPrice)
	}
}

func (s *Scheduler) inFlight(id ID, generated int) (*req, error) {
	q, ok := s.reqs[id]
	switch {
	case !ok:
		return nil, fmt.Errorf("queue: request %d: %w", id, ErrUnknownRequest)
	case q.state != stInFlight:
		return nil, fmt.Errorf("queue: request %d is queued, not in flight", id)
	case generated < 0:
		return nil, fmt.Errorf("queue: request %d: generated is %d: it must not be negative", id, generated)
	}
	return q, nil
}

// Finish reports that an in-flight request completed with `generated`
// output tokens in all; its engine slot goes to the next request.
func (s *Scheduler) Finish(id ID, generated int, now time.Time) (Output, error) {
	s.out.reset()
	q, err := s.inFlight(id, generated)
	if err != nil {
		return s.out, err
	}
	s.chargeOutput(q, generated)
	d := q.dep
	s.leaveEngine(q)
	s.end(q, End{Outcome: Finished, WasInFlight: true})
	s.pump(d, now)
	return s.out, nil
}

// Cancel reports that a request's client went away. A queued request
// leaves the queue; one in flight frees its slot (the gateway aborts it on
// the engine) and keeps what it was charged: the engine did that work.
func (s *Scheduler) Cancel(id ID, now time.Time) (Output, error) {
	s.out.reset()
	q, ok := s.reqs[id]
	if !ok {
		return s.out, fmt.Errorf("queue: request %d: %w", id, ErrUnknownRequest)
	}
	d := q.dep
	inFlight := q.state == stInFlight
	if inFlight {
		s.leaveEngine(q)
	} else {
		s.dequeue(q)
	}
	s.end(q, End{Outcome: Cancelled, WasInFlight: inFlight})
	s.pump(d, now)
	return s.out, nil
}

// NextDeadline is when Tick next has something to do: the earliest queued
// request's deadline or cold wait.
func (s *Scheduler) NextDeadline() (time.Time, bool) {
	if len(s.dl) == 0 {
		return time.Time{}, false
	}
	return s.dl[0].deadline(), true
}

// Tick ends the queued requests whose time is up: those waiting for a
// deployment that did not become ready within ColdWait are Rejected
// (503), those past their own Deadline Expired.
func (s *Scheduler) Tick(now time.Time) Output {
	s.out.reset()
	for len(s.dl) > 0 {
		q := s.dl[0]
		if q.deadline().After(now) {
			break
		}
		d := q.dep
		e := End{Outcome: Expired}
		if !q.coldBy.IsZero() && !q.coldBy.After(now) {
			e = End{Outcome: Rejected, Status: 503, RetryAfter: s.coldEstimate(d, now)}
		}
		s.dequeue(q)
		s.end(q, e)
		if !d.dirty {
			d.dirty = true
			s.dirty = append(s.dirty, d)
		}
	}
	// A head that did not fit may have left, so what is behind it may fit.
	for _, d := range s.dirty {
		d.dirty = false
		s.pump(d, now)
	}
	s.dirty = s.dirty[:0]
	return s.out
}

func (s *Scheduler) clampRetry(d time.Duration) time.Duration {
	d = d.Round(time.Second)
	return min(max(d, minRetryAfter), s.cfg.MaxRetryAfter)
}

// drainEstimate is how long the requests queued on d take to drain at the
// rate d dispatched its recent requests: the Retry-After of a 429.
func (s *Scheduler) drainEstimate(d *dep, now time.Time) time.Duration {
	if !d.d.Ready {
		return s.coldEstimate(d, now)
	}
	n := min(d.nDrains, drainWindow)
	if n == 0 {
		return minRetryAfter
	}
	oldest := d.drains[(d.nDrains-n)%drainWindow]
	span := now.Sub(oldest)
	if span <= 0 {
		return minRetryAfter
	}
	perReq := span / time.Duration(n)
	return s.clampRetry(perReq * time.Duration(d.queued))
}

// coldEstimate is the Retry-After for a deployment that is not ready: the
// rest of its load, or ColdWait when that is unknown.
func (s *Scheduler) coldEstimate(d *dep, now time.Time) time.Duration {
	if d.readyBy.After(now) {
		return s.clampRetry(d.readyBy.Sub(now))
	}
	return s.clampRetry(s.cfg.ColdWait)
}

// RemoveDeployment takes an engine off the card. Its queued requests are
// Rejected (503: another replica may serve them) and those in flight end as
// Cancelled (the engine is gone).
func (s *Scheduler) RemoveDeployment(name string, now time.Time) (Output, error) {
	s.out.reset()
	d, ok := s.deps[name]
	if !ok {
		return s.out, fmt.Errorf("queue: deployment %q is not on this card", name)
	}
	var doomed []*req
	s.eachQueued(d, func(r *req) { doomed = append(doomed, r) })
	for _, q := range doomed {
		s.dequeue(q)
		s.end(q, End{Outcome: Rejected, Status: 503, RetryAfter: minRetryAfter})
	}
	doomed = doomed[:0]
	for _, q := range s.reqs {
		if q.dep == d {
			doomed = append(doomed, q)
		}
	}
	slices.SortFunc(doomed, func(a, b *req) int { return cmp.Compare(a.id, b.id) })
	for _, q := range doomed {
		s.leaveEngine(q)
		s.end(q, End{Outcome: Cancelled, WasInFlight: true})
	}
	delete(s.deps, name)
	return s.out, nil
}

// Queued is the number of requests waiting for the deployment.
func (s *Scheduler) Queued(deployment string) int {
	if d, ok := s.deps[deployment]; ok {
		return d.queued
	}
	return 0
}

// InFlight is the number of requests the deployment's engine holds.
func (s *Scheduler) InFlight(deployment string) int {
	if d, ok := s.deps[deployment]; ok {
		return d.inFlight
	}
	return 0
}

// Len is the number of requests the scheduler holds, queued or in flight.
func (s *Scheduler) Len() int { return len(s.reqs) }

// Counter is a tenant's virtual token counter in one class of a
// deployment: the service charged to it divided by its weight, as lifted.
// It is for metrics and tests; zero if the tenant never queued there.
func (s *Scheduler) Counter(deployment string, c Class, tenant string) float64 {
	d, ok := s.deps[deployment]
	if !ok || c >= numClasses {
		return 0
	}
	t, ok := s.tenants[tenant]
	if !ok {
		return 0
	}
	if f, ok := d.classes[c].flows[t]; ok {
		return f.counter
	}
	return 0
}

// NextPrune is when Prune is next due: a flow made since the last one may
// have gone idle by then. false: no flow is kept.
func (s *Scheduler) NextPrune() (time.Time, bool) {
	return s.pruneAt, !s.pruneAt.IsZero()
}

// Prune forgets the tenants' records (flows) that hold no request and
// whose counter says nothing a new flow would not: at or below what a new
// one is lifted to; those idle Config.IdleTenant; and, past half of
// Config.MaxIdleFlows idle flows, those whose counter is closest to the
// lift (they lose least: a flood of made-up names goes before a tenant
// served much more than the rest). A tenant without a flow left is
// forgotten with its weight (the gateway sets weights with each request).
// Enqueue calls it when due; call it at NextPrune when no request comes. A
// tenant that returns after its flow was forgotten starts at the lift, as
// a new one does.
func (s *Scheduler) Prune(now time.Time) {
	s.made = 0
	type idleFlow struct {
		f      *flow
		cq     *classQ
		excess float64
	}
	var idle []idleFlow
	kept := false
	for _, d := range s.deps {
		for c := range d.classes {
			cq := &d.classes[c]
			lift := math.Inf(-1)
			switch {
			case len(cq.heap) > 0:
				lift = cq.heap[0].counter
			case cq.hasLastLeft:
				lift = cq.lastLeft
			}
			for t, f := range cq.flows {
				if !f.idle() {
					f.idleSince = time.Time{}
					kept = true
					continue
				}
				if f.idleSince.IsZero() {
					f.idleSince = now
				}
				if f.counter <= lift || now.Sub(f.idleSince) >= s.cfg.IdleTenant {
					s.forget(cq, t)
					continue
				}
				idle = append(idle, idleFlow{f, cq, f.counter - lift})
			}
		}
	}
	// Half the bound is kept, so that the flows made before the next
	// prune (half the bound at most) keep the idle ones within it.
	if over := len(idle) - s.cfg.MaxIdleFlows/2; over > 0 {
		slices.SortFunc(idle, func(a, b idleFlow) int { return cmp.Compare(a.excess, b.excess) })
		for _, x := range idle[:over] {
			s.forget(x.cq, x.f.t)
		}
		idle = idle[over:]
	}
	for name, t := range s.tenants {
		if t.flows == 0 {
			delete(s.tenants, name)
		}
	}
	s.pruneAt = time.Time{}
	switch {
	case len(idle) > 0:
		// The oldest idle flow is forgotten IdleTenant after it was found
		// idle.
		first := idle[0].f.idleSince
		for _, x := range idle {
			if x.f.idleSince.Before(first) {
				first = x.f.idleSince
			}
		}
		s.pruneAt = first.Add(s.cfg.IdleTenant)
	case kept:
		s.pruneAt = now.Add(s.cfg.IdleTenant)
	}
}

// forget drops t's flow in cq (it holds no request).
func (s *Scheduler) forget(cq *classQ, t *tenant) {
	delete(cq.flows, t)
	t.flows--
}

// Tenants is how many tenants the scheduler keeps a record of (for tests
// and metrics).
func (s *Scheduler) Tenants() int { return len(s.tenants) }
