package queue_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/node/gateway/queue"
)

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func rnd(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)) }

// engine is a virtual-time stand-in for the engines behind the scheduler:
// every step, each in-flight request generates one token, which is
// reported; a request that reaches its output length finishes. It checks
// the scheduler's outputs as it applies them: every request ends exactly
// once, only queued requests are dispatched, only in-flight background
// requests are preempted, and a requeued one is queued again.
type engine struct {
	t   testing.TB
	s   *queue.Scheduler
	now time.Time
	in  queue.Config

	reqs     map[queue.ID]*simReq
	inFlight []queue.ID // in dispatch order
	ended    map[queue.ID]queue.End
	// served is each tenant's charged service (input at the first
	// dispatch, output as reported, a preempted run's output refunded),
	// as the scheduler should count it.
	served map[string]float64
	// dispatched tokens (PromptTokens+MaxTokens) by class
	dispatchedTokens [3]float64
	preemptions      int
	queued           map[tenantClass]int
	// dispatchOrder lists every dispatch in order.
	dispatchOrder []queue.ID
	// trace, when set, records every output in order.
	trace *strings.Builder
}

type tenantClass struct {
	tenant string
	class  queue.Class
}

// set moves q to state, keeping the queued counts.
func (e *engine) set(q *simReq, state string) {
	k := tenantClass{q.r.Tenant, q.r.Class}
	if q.state == "queued" {
		e.queued[k]--
	}
	if state == "queued" {
		e.queued[k]++
	}
	q.state = state
}

type simReq struct {
	r         queue.Request
	out       int // output length it will generate
	gen       int
	state     string // queued, inflight
	dispatchN int
}

func newEngine(t testing.TB, cfg queue.Config, deps ...queue.Deployment) *engine {
	t.Helper()
	s, err := queue.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e := &engine{t: t, s: s, now: epoch, in: cfg, reqs: map[queue.ID]*simReq{}, ended: map[queue.ID]queue.End{}, served: map[string]float64{}, queued: map[tenantClass]int{}}
	if e.in.InputPrice == 0 {
		e.in.InputPrice = 1
	}
	if e.in.OutputPrice == 0 {
		e.in.OutputPrice = 1
	}
	for _, d := range deps {
		if _, err := s.AddDeployment(d, e.now); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

// enqueue submits r, which will generate out tokens if it runs to the end.
func (e *engine) enqueue(r queue.Request, out int) queue.ID {
	e.t.Helper()
	id, o, err := e.s.Enqueue(r, e.now)
	if err != nil {
		e.t.Fatal(err)
	}
	if _, dup := e.reqs[id]; dup || e.ended[id] != (queue.End{}) {
		e.t.Fatalf("ID %d handed out twice", id)
	}
	q := &simReq{r: r, out: out}
	e.set(q, "queued")
	e.reqs[id] = q
	e.apply(o)
	return id
}

func (e *engine) apply(o queue.Output) {
	e.t.Helper()
	if e.trace != nil {
		fmt.Fprintf(e.trace, "%v %+v\n", e.now.Sub(epoch), o)
	}
	for _, p := range o.Preempted {
		q := e.reqs[p.ID]
		if q == nil || q.state != "inflight" {
			e.t.Fatalf("preempted %d, which is not in flight", p.ID)
		}
		if q.r.Class != queue.Background {
			e.t.Fatalf("preempted %d of class %v: only background work may be preempted", p.ID, q.r.Class)
		}
		if p.Requeued == q.r.Streamed {
			e.t.Fatalf("preempted %d (streamed %v) with requeued %v: streamed requests end, others re-run", p.ID, q.r.Streamed, p.Requeued)
		}
		e.preemptions++
		if p.Requeued {
			e.served[q.r.Tenant] -= float64(q.gen) * e.in.OutputPrice
			q.gen = 0
		}
		e.inFlight = slices.DeleteFunc(e.inFlight, func(x queue.ID) bool { return x == p.ID })
		e.set(q, "queued")
		if !p.Requeued {
			e.set(q, "cut")
		}
	}
	for _, id := range o.Dispatched {
		q := e.reqs[id]
		if q == nil || q.state != "queued" {
			e.t.Fatalf("dispatched %d, which is not queued", id)
		}
		if q.dispatchN == 0 {
			e.served[q.r.Tenant] += float64(q.r.PromptTokens) * e.in.InputPrice
		}
		q.dispatchN++
		e.dispatchOrder = append(e.dispatchOrder, id)
		e.set(q, "inflight")
		e.dispatchedTokens[q.r.Class] += float64(q.r.PromptTokens + q.r.MaxTokens)
		e.inFlight = append(e.inFlight, id)
	}
	for _, x := range o.Ended {
		if prev, ok := e.ended[x.ID]; ok {
			e.t.Fatalf("request %d ended twice: %v then %v", x.ID, prev.Outcome, x.Outcome)
		}
		e.ended[x.ID] = x
		q := e.reqs[x.ID]
		if q == nil {
			// Rejected at admission: never queued.
			if x.Outcome != queue.Rejected || x.Status != 429 {
				e.t.Fatalf("request %d ended %v without being held", x.ID, x.Outcome)
			}
			continue
		}
		switch {
		case x.Outcome == queue.Preempted && q.state != "cut":
			e.t.Fatalf("request %d ended preempted without a preemption", x.ID)
		case x.Outcome == queue.Finished && q.state != "inflight":
			e.t.Fatalf("request %d finished while %s", x.ID, q.state)
		case (x.Outcome == queue.Expired || x.Outcome == queue.Rejected) && q.state != "queued":
			e.t.Fatalf("request %d %v while %s", x.ID, x.Outcome, q.state)
		case x.WasInFlight != (q.state == "inflight" || q.state == "cut"):
			e.t.Fatalf("request %d ended %v with WasInFlight %v while %s", x.ID, x.Outcome, x.WasInFlight, q.state)
		}
		if q.state == "inflight" {
			e.inFlight = slices.DeleteFunc(e.inFlight, func(y queue.ID) bool { return y == x.ID })
		}
		e.set(q, "ended")
		delete(e.reqs, x.ID)
	}
}

// step advances time by dt: every in-flight request generates one token;
// finished ones are reported in dispatch order; then deadlines are ticked.
func (e *engine) step(dt time.Duration) {
	e.t.Helper()
	e.now = e.now.Add(dt)
	var done []queue.ID
	for _, id := range e.inFlight {
		q := e.reqs[id]
		q.gen++
		e.served[q.r.Tenant] += e.in.OutputPrice
		if q.gen >= q.out {
			done = append(done, id)
			continue
		}
		if err := e.s.Progress(id, q.gen); err != nil {
			e.t.Fatal(err)
		}
	}
	for _, id := range done {
		q := e.reqs[id]
		if q == nil || q.state != "inflight" {
			continue // preempted by an earlier finish's dispatch
		}
		o, err := e.s.Finish(id, q.gen, e.now)
		if err != nil {
			e.t.Fatal(err)
		}
		e.apply(o)
	}
	e.apply(e.s.Tick(e.now))
}

func (e *engine) cancel(id queue.ID) {
	e.t.Helper()
	o, err := e.s.Cancel(id, e.now)
	if err != nil {
		e.t.Fatal(err)
	}
	e.apply(o)
}

// queuedBy counts the requests a tenant has waiting in a class.
func (e *engine) queuedBy(tenant string, c queue.Class) int {
	return e.queued[tenantClass{tenant, c}]
}
