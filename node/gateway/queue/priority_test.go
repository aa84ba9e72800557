package queue_test

import (
	"slices"
	"testing"

	"github.com/gpuplane/gpuplane/node/gateway/queue"
)

// saturate runs an engine of 4 slots with interactive work always waiting
// (topped up to 20 queued every step) and 400 background requests queued
// behind it, and returns the engine after `steps` steps, checking at every
// step that background's dispatched tokens stay at or above floor×total
// less one request's cost.
func saturate(t *testing.T, cfg queue.Config, floor float64, steps int) *engine {
	t.Helper()
	// Not ready while the queues fill, so that the run starts with both
	// classes backlogged.
	e := newEngine(t, cfg, queue.Deployment{Name: "m", MaxInFlight: 4, QueueLimit: 1 << 20})
	g := rnd(3)
	send := func(tenant string, c queue.Class) {
		out := 1 + g.IntN(maxOutput)
		e.enqueue(queue.Request{Deployment: "m", Tenant: tenant, Class: c,
			PromptTokens: 1 + g.IntN(maxPrompt), MaxTokens: out}, out)
	}
	for range 20 {
		send("chat", queue.Interactive)
	}
	for range 400 {
		send("batch", queue.Background)
	}
	o, err := e.s.SetReady("m", e.now)
	if err != nil {
		t.Fatal(err)
	}
	e.apply(o)
	for range steps {
		for e.queuedBy("chat", queue.Interactive) < 20 {
			send("chat", queue.Interactive)
		}
		e.step(stepDT)
		total := e.dispatchedTokens[queue.Background] + e.dispatchedTokens[queue.Interactive]
		if bg := e.dispatchedTokens[queue.Background]; floor > 0 && bg < floor*total-(maxPrompt+maxOutput) {
			t.Fatalf("background was dispatched %.0f of %.0f tokens (%.1f%%), below its floor of %.0f%% less one request",
				bg, total, 100*bg/total, 100*floor)
		}
	}
	return e
}

// TestBackgroundFloorUnderSaturation: interactive work saturates the card,
// yet background keeps its floor (5% of dispatched tokens by default, 20%
// when configured) and finishes work: nothing it gets under the floor is
// preempted.
func TestBackgroundFloorUnderSaturation(t *testing.T) {
	for _, floor := range []float64{0.05, 0.2} {
		e := saturate(t, queue.Config{BackgroundFloor: floor}, floor, 3000)
		bg, total := e.dispatchedTokens[queue.Background], e.dispatchedTokens[queue.Background]+e.dispatchedTokens[queue.Interactive]
		finished := 400 - e.queuedBy("batch", queue.Background)
		if finished == 0 || e.preemptions > 0 {
			t.Fatalf("floor %g: background finished %d requests with %d preemptions: floor work must run to the end", floor, finished, e.preemptions)
		}
		if share := bg / total; share > floor+0.02 {
			t.Fatalf("floor %g: background got %.1f%% while interactive was backlogged: strict priority gives it only its floor", floor, 100*share)
		}
		t.Logf("floor %g: background dispatched %.1f%% of tokens", floor, 100*bg/total)
	}
	// Without a floor, strict priority starves background: the check above
	// is what the floor adds.
	e := saturate(t, queue.Config{BackgroundFloor: -1}, 0, 500)
	if bg := e.dispatchedTokens[queue.Background]; bg != 0 {
		t.Fatalf("with the floor disabled background was dispatched %.0f tokens under saturating interactive load", bg)
	}
}

// TestStrictPriority: with all classes queued, interactive is dispatched
// first, then standard, then background (the floors owe nothing before a
// higher class has been served).
func TestStrictPriority(t *testing.T) {
	e := newEngine(t, queue.Config{}, queue.Deployment{Name: "m", MaxInFlight: 1, QueueLimit: 100})
	var ids []queue.ID
	for _, c := range []queue.Class{queue.Background, queue.Standard, queue.Interactive} {
		ids = append(ids, e.enqueue(queue.Request{Deployment: "m", Tenant: "t", Class: c, PromptTokens: 1, MaxTokens: 1}, 1))
	}
	o, err := e.s.SetReady("m", e.now)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(o.Dispatched, []queue.ID{ids[2]}) {
		t.Fatalf("dispatched %v, want the interactive request %d first", o.Dispatched, ids[2])
	}
	e.apply(o)
	var order []queue.ID
	for len(e.ended) < 3 {
		order = append(order, e.inFlight...)
		e.step(stepDT)
	}
	if want := []queue.ID{ids[2], ids[1], ids[0]}; !slices.Equal(order, want) {
		t.Fatalf("ran %v, want interactive, standard, background %v", order, want)
	}
}

// TestPreemption: an interactive request arriving at a card full of
// background work takes the newest background request's slot at once. A
// streamed victim ends (its stream gets an error event); a non-streamed one
// goes back to the front of its tenant's queue, is refunded the output it
// generated, and is not charged its prompt again when it re-runs.
func TestPreemption(t *testing.T) {
	e := newEngine(t, queue.Config{}, queue.Deployment{Name: "m", MaxInFlight: 2, QueueLimit: 100, Ready: true})
	bg := func(streamed bool) queue.ID {
		return e.enqueue(queue.Request{Deployment: "m", Tenant: "batch", Class: queue.Background, PromptTokens: 100, MaxTokens: 50, Streamed: streamed}, 50)
	}
	job, stream, later := bg(false), bg(true), bg(false)
	if !slices.Equal(e.inFlight, []queue.ID{job, stream}) {
		t.Fatalf("in flight %v, want the first two background requests", e.inFlight)
	}
	for range 10 {
		e.step(stepDT)
	}
	counter := func() float64 { return e.s.Counter("m", queue.Background, "batch") }
	if got := counter(); got != 100+100+10+10 {
		t.Fatalf("batch's counter is %g after two prompts of 100 and 10 tokens each, want 220", got)
	}

	chat := func() (queue.ID, queue.Output) {
		id, o, err := e.s.Enqueue(queue.Request{Deployment: "m", Tenant: "chat", Class: queue.Interactive, PromptTokens: 10, MaxTokens: 5}, e.now)
		if err != nil {
			t.Fatal(err)
		}
		e.reqs[id] = &simReq{r: queue.Request{Deployment: "m", Tenant: "chat", Class: queue.Interactive, PromptTokens: 10, MaxTokens: 5}, out: 5}
		e.set(e.reqs[id], "queued")
		return id, o
	}
	c1, o := chat()
	if !slices.Equal(o.Preempted, []queue.Preemption{{ID: stream}}) || !slices.Equal(o.Dispatched, []queue.ID{c1}) ||
		len(o.Ended) != 1 || o.Ended[0].ID != stream || o.Ended[0].Outcome != queue.Preempted {
		t.Fatalf("first interactive arrival: %+v, want the streamed background %d preempted and ended, %d dispatched", o, stream, c1)
	}
	e.apply(o)
	c2, o := chat()
	if !slices.Equal(o.Preempted, []queue.Preemption{{ID: job, Requeued: true}}) || !slices.Equal(o.Dispatched, []queue.ID{c2}) || len(o.Ended) != 0 {
		t.Fatalf("second interactive arrival: %+v, want background %d preempted and requeued, %d dispatched", o, job, c2)
	}
	e.apply(o)
	if got := counter(); got != 210 {
		t.Fatalf("batch's counter is %g after both preemptions, want 210: the re-queued job's 10 generated tokens refunded, the stream's kept", got)
	}
	for e.reqs[c1] != nil || e.reqs[c2] != nil {
		e.step(stepDT)
	}
	if !slices.Contains(e.inFlight, job) || slices.Contains(e.inFlight, later) && len(e.inFlight) == 1 {
		t.Fatalf("after the interactive work, in flight %v: the preempted job %d must run before %d, queued after it", e.inFlight, job, later)
	}
	for e.reqs[job] != nil {
		e.step(stepDT)
	}
	if got := e.ended[job]; got.Outcome != queue.Finished {
		t.Fatalf("the preempted job ended %v, want finished after its re-run", got.Outcome)
	}
	// 210, then the prompt of `later` (100) when it ran, and the job's 50
	// output tokens: the job's prompt is not charged twice.
	if got, want := counter(), e.served["batch"]; got != want {
		t.Fatalf("batch's counter is %g, the service it received is %g: charged twice or refunded wrongly", got, want)
	}
}

// TestPreemptionOnlyWhenItMakesRoom: with no preemption configured, or with
// only floor work in flight, an interactive request waits instead.
func TestPreemptionOnlyWhenItMakesRoom(t *testing.T) {
	e := newEngine(t, queue.Config{NoPreemption: true}, queue.Deployment{Name: "m", MaxInFlight: 1, QueueLimit: 100, Ready: true})
	e.enqueue(queue.Request{Deployment: "m", Tenant: "batch", Class: queue.Background, PromptTokens: 1, MaxTokens: 5}, 5)
	_, o, err := e.s.Enqueue(queue.Request{Deployment: "m", Tenant: "chat", Class: queue.Interactive, PromptTokens: 1, MaxTokens: 1}, e.now)
	if err != nil {
		t.Fatal(err)
	}
	if len(o.Preempted)+len(o.Dispatched) != 0 {
		t.Fatalf("with NoPreemption an interactive arrival did %+v, want it queued", o)
	}
	// A token-capped engine: preempting the one small background request
	// cannot make room for a large interactive one, so nothing is cut.
	e = newEngine(t, queue.Config{}, queue.Deployment{Name: "m", MaxInFlight: 4, MaxTokens: 100, QueueLimit: 100, Ready: true})
	e.enqueue(queue.Request{Deployment: "m", Tenant: "chat", Class: queue.Standard, PromptTokens: 50, MaxTokens: 10}, 10)
	e.enqueue(queue.Request{Deployment: "m", Tenant: "batch", Class: queue.Background, PromptTokens: 20, MaxTokens: 10}, 10)
	_, o, err = e.s.Enqueue(queue.Request{Deployment: "m", Tenant: "chat", Class: queue.Interactive, PromptTokens: 50, MaxTokens: 20}, e.now)
	if err != nil {
		t.Fatal(err)
	}
	if len(o.Preempted)+len(o.Dispatched) != 0 {
		t.Fatalf("an interactive request that preemption cannot make room for did %+v, want it queued and nothing cut", o)
	}
}

// TestYieldingEngineTakesInteractiveBesideBackground: an engine that
// pauses background work for interactive work itself (Deployment.Yields)
// is sent an interactive request at once beside a full batch of
// background, and nothing is cut; background waits while the interactive
// work holds the room, and interactive work beyond the cap (counting only
// what does not yield) waits too.
func TestYieldingEngineTakesInteractiveBesideBackground(t *testing.T) {
	e := newEngine(t, queue.Config{}, queue.Deployment{Name: "m", MaxInFlight: 2, QueueLimit: 100, Ready: true, Yields: true})
	for range 2 {
		e.enqueue(queue.Request{Deployment: "m", Tenant: "batch", Class: queue.Background, PromptTokens: 10, MaxTokens: 50, Streamed: true}, 50)
	}
	later := e.enqueue(queue.Request{Deployment: "m", Tenant: "batch", Class: queue.Background, PromptTokens: 10, MaxTokens: 50, Streamed: true}, 50)
	chat := func() (queue.ID, queue.Output) {
		r := queue.Request{Deployment: "m", Tenant: "chat", Class: queue.Interactive, PromptTokens: 10, MaxTokens: 5}
		id, o, err := e.s.Enqueue(r, e.now)
		if err != nil {
			t.Fatal(err)
		}
		e.reqs[id] = &simReq{r: r, out: 5}
		e.set(e.reqs[id], "queued")
		return id, o
	}
	for i := range 3 {
		c, o := chat()
		want := []queue.ID{c}
		if i == 2 {
			want = nil // two interactive in flight fill the cap
		}
		if len(o.Preempted) != 0 || !slices.Equal(o.Dispatched, want) {
			t.Fatalf("interactive arrival %d beside a full batch of background on a yielding engine: %+v; want %v dispatched, nothing preempted", i+1, o, want)
		}
		e.apply(o)
	}
	if n := e.s.InFlight("m"); n != 4 {
		t.Fatalf("%d in flight, want the 2 background requests and 2 interactive ones", n)
	}
	if slices.Contains(e.inFlight, later) {
		t.Fatalf("background request %d was dispatched while the engine was over its cap", later)
	}
}
