package queue_test

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/node/gateway/queue"
)

// TestConservationAndPreemption drives three engines with random traffic:
// requests of every class from five tenants, streamed or not, some with
// deadlines, random cancels, engines going cold and ready again, queues
// small enough to overflow. The engine harness checks every output as it
// applies it (each request dispatched only while queued, preempted only
// while in flight and only if background, requeued unless streamed, ended
// once). Here, after every operation: an interactive request never waits
// on a ready engine that holds background work (floors off, request caps
// only, so any background request in flight would make room); and at the
// end, with every engine ready and the traffic drained, every ID handed
// out has ended exactly once and the scheduler holds nothing.
func TestConservationAndPreemption(t *testing.T) {
	outcomes := map[queue.Outcome]int{}
	preemptions := 0
	for _, floors := range []bool{false, true} {
		for seed := uint64(1); seed <= 8; seed++ {
			t.Run(fmt.Sprintf("floors %v seed %d", floors, seed), func(t *testing.T) {
				n, _ := chaos(t, seed, floors, outcomes)
				preemptions += n
			})
		}
	}
	t.Logf("outcomes %v, preemptions %d", outcomes, preemptions)
	for _, o := range []queue.Outcome{queue.Finished, queue.Rejected, queue.Expired, queue.Cancelled, queue.Preempted} {
		if outcomes[o] == 0 {
			t.Fatalf("no request ended %v (%v): the traffic does not exercise every exit", o, outcomes)
		}
	}
	if preemptions < 20 {
		t.Fatalf("only %d preemptions in the runs: the traffic does not exercise them", preemptions)
	}
}

func chaos(t *testing.T, seed uint64, floors bool, outcomes map[queue.Outcome]int) (preemptions int, trace string) {
	cfg := queue.Config{ColdWait: time.Second, BackgroundFloor: -1, StandardFloor: -1}
	deps := []queue.Deployment{
		{Name: "a", MaxInFlight: 2, QueueLimit: 6, Ready: true},
		{Name: "b", MaxInFlight: 4, QueueLimit: 10, Ready: true},
		{Name: "c", MaxInFlight: 1, QueueLimit: 3},
	}
	if floors {
		cfg.BackgroundFloor, cfg.StandardFloor = 0.1, 0.1
		deps[1].MaxTokens = 200
	}
	e := newEngine(t, cfg, deps...)
	e.trace = &strings.Builder{}
	g := rnd(seed)
	ready := map[string]bool{"a": true, "b": true}
	var maxID queue.ID
	preemptions = 0
	for range 3000 {
		switch x := g.IntN(100); {
		case x < 30:
			out := 1 + g.IntN(16)
			r := queue.Request{Deployment: deps[g.IntN(3)].Name, Tenant: fmt.Sprint("t", g.IntN(5)),
				Class: queue.Class(g.IntN(3)), PromptTokens: g.IntN(maxPrompt + 1), MaxTokens: out, Streamed: g.IntN(3) == 0}
			if g.IntN(5) == 0 {
				r.Deadline = e.now.Add(time.Duration(g.IntN(2000)) * time.Millisecond)
			}
			if r.Deployment == "b" && floors && r.PromptTokens+r.MaxTokens > 200 {
				r.MaxTokens = 200 - r.PromptTokens
			}
			maxID = e.enqueue(r, out)
		case x < 35:
			if len(e.reqs) > 0 {
				ids := slices.Sorted(maps.Keys(e.reqs))
				e.cancel(ids[g.IntN(len(ids))])
			}
		case x < 38:
			d := deps[g.IntN(3)].Name
			if err := e.s.SetCold(d, e.now.Add(time.Duration(g.IntN(3000))*time.Millisecond), e.now); err != nil {
				t.Fatal(err)
			}
			ready[d] = false
		case x < 43:
			d := deps[g.IntN(3)].Name
			o, err := e.s.SetReady(d, e.now)
			if err != nil {
				t.Fatal(err)
			}
			e.apply(o)
			ready[d] = true
		default:
			e.step(stepDT)
		}
		preemptions = e.preemptions
		if !floors {
			noInteractiveBehindBackground(t, e, ready)
		}
	}
	for _, d := range deps {
		o, err := e.s.SetReady(d.Name, e.now)
		if err != nil {
			t.Fatal(err)
		}
		e.apply(o)
	}
	for i := 0; len(e.reqs) > 0; i++ {
		if i > 100000 {
			t.Fatalf("%d requests still held after %d steps with every engine ready", len(e.reqs), i)
		}
		e.step(stepDT)
	}
	if got := len(e.ended); got != int(maxID) {
		t.Fatalf("%d of %d requests ended", got, maxID)
	}
	if n := e.s.Len(); n != 0 {
		t.Fatalf("the scheduler still holds %d requests after all ended", n)
	}
	if _, ok := e.s.NextDeadline(); ok {
		t.Fatal("a deadline is pending with no request held")
	}
	for _, x := range e.ended {
		outcomes[x.Outcome]++
	}
	return preemptions, e.trace.String()
}

// TestDeterministic: the same calls at the same times give the same
// outputs, which is what lets the serving simulator replay the gateway.
func TestDeterministic(t *testing.T) {
	_, a := chaos(t, 5, true, map[queue.Outcome]int{})
	_, b := chaos(t, 5, true, map[queue.Outcome]int{})
	if a != b {
		t.Fatal("two runs of the same calls gave different outputs")
	}
	if strings.Count(a, "\n") < 1000 {
		t.Fatalf("the run produced only %d outputs", strings.Count(a, "\n"))
	}
}

func noInteractiveBehindBackground(t *testing.T, e *engine, ready map[string]bool) {
	t.Helper()
	waiting := map[string]bool{}
	for _, q := range e.reqs {
		if q.state == "queued" && q.r.Class == queue.Interactive {
			waiting[q.r.Deployment] = true
		}
	}
	for _, id := range e.inFlight {
		q := e.reqs[id]
		if q.r.Class == queue.Background && waiting[q.r.Deployment] && ready[q.r.Deployment] {
			t.Fatalf("an interactive request waits on %s while background request %d is in flight there", q.r.Deployment, id)
		}
	}
}
