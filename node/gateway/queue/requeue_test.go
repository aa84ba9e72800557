package queue_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/node/gateway/queue"
)

// requeue re-queues id on e as its engine going away would, keeping the
// test engine's books; it reports what Requeue said.
func (e *engine) requeue(id queue.ID) bool {
	e.t.Helper()
	again, o, err := e.s.Requeue(id, e.now)
	if err != nil {
		e.t.Fatal(err)
	}
	if again {
		q := e.reqs[id]
		e.served[q.r.Tenant] -= float64(q.gen) * e.in.OutputPrice
		q.gen = 0
		e.inFlight = slices.DeleteFunc(e.inFlight, func(x queue.ID) bool { return x == id })
		e.set(q, "queued")
	}
	e.apply(o)
	return again
}

// TestRequeueWhenTheEngineGoesAway: a background request that is not
// streamed, cut off because its engine went to sleep, runs again once the
// model is back (no client saw any of it, as after a preemption); an
// interactive or a streamed one is not re-queued (the caller ends it),
// and a queued one is refused with an error.
func TestRequeueWhenTheEngineGoesAway(t *testing.T) {
	e := newEngine(t, queue.Config{}, queue.Deployment{Name: "m", MaxInFlight: 4, QueueLimit: 10, Ready: true})
	bg := queue.Request{Deployment: "m", Tenant: "t", Class: queue.Background, PromptTokens: 10, MaxTokens: 100}
	batch := e.enqueue(bg, 100)
	bg.Streamed = true
	stream := e.enqueue(bg, 100)
	fg := e.enqueue(queue.Request{Deployment: "m", Tenant: "u", Class: queue.Interactive, PromptTokens: 10, MaxTokens: 100}, 100)
	for range 5 {
		e.step(time.Second)
	}
	if err := e.s.SetCold("m", time.Time{}, e.now); err != nil {
		t.Fatal(err)
	}
	if !e.requeue(batch) {
		t.Fatal("the background request that is not streamed was not re-queued")
	}
	for _, id := range []queue.ID{stream, fg} {
		if e.requeue(id) {
			t.Fatalf("request %d (streamed or interactive) was re-queued: its client saw part of it, or it must not wait for a turn", id)
		}
	}
	if got := e.s.Queued("m"); got != 1 {
		t.Fatalf("queued after the cut: %d, want the one re-queued", got)
	}
	if _, _, err := e.s.Requeue(batch, e.now); err == nil {
		t.Fatal("re-queueing a queued request: no error")
	}
	e.now = e.now.Add(time.Minute)
	o, err := e.s.SetReady("m", e.now)
	if err != nil {
		t.Fatal(err)
	}
	e.apply(o)
	if !slices.Contains(o.Dispatched, batch) {
		t.Fatalf("model back: %+v, want the re-queued request %d dispatched again", o, batch)
	}
	for range 200 {
		e.step(time.Second)
	}
	if got := e.ended[batch].Outcome; got != queue.Finished {
		t.Fatalf("the re-queued request ended %v, want finished", got)
	}
}

// TestBackgroundWaitsForTheCardPromised: a background request for a cold
// model whose controller promises it the card in two hours waits for that
// (and ColdWait more) instead of being rejected after ColdWaitBackground;
// an interactive request still gets its 503 after ColdWait; without a
// promise the background request is rejected after ColdWaitBackground.
func TestBackgroundWaitsForTheCardPromised(t *testing.T) {
	cfg := queue.Config{ColdWait: time.Minute, ColdWaitBackground: 20 * time.Minute}
	for _, promised := range []bool{true, false} {
		e := newEngine(t, cfg, queue.Deployment{Name: "m", MaxInFlight: 4, QueueLimit: 10})
		if err := e.s.SetCold("m", time.Time{}, e.now); err != nil {
			t.Fatal(err)
		}
		r := queue.Request{Deployment: "m", Tenant: "t", Class: queue.Background, PromptTokens: 1, MaxTokens: 1}
		early := e.enqueue(r, 1)
		if promised {
			if err := e.s.SetCardBy("m", epoch.Add(2*time.Hour), e.now); err != nil {
				t.Fatal(err)
			}
		}
		late := e.enqueue(r, 1) // arrives after the promise
		r.Class = queue.Interactive
		fg := e.enqueue(r, 1)
		e.now = epoch.Add(30 * time.Minute)
		e.apply(e.s.Tick(e.now))
		if got := e.ended[fg]; got.Outcome != queue.Rejected || got.Status != 503 {
			t.Fatalf("promised %v: interactive request after 30 min: %+v, want rejected with 503", promised, got)
		}
		for _, id := range []queue.ID{early, late} {
			_, ended := e.ended[id]
			if ended == promised {
				t.Fatalf("promised %v: background request %d ended after 30 min: %v (want it waiting only with the promise)", promised, id, ended)
			}
		}
		if !promised {
			continue
		}
		e.now = epoch.Add(2*time.Hour + 30*time.Second)
		e.apply(e.s.Tick(e.now))
		if len(e.ended) != 1 {
			t.Fatalf("within ColdWait after the promised time: %d ended, want the background requests still waiting", len(e.ended))
		}
		e.now = epoch.Add(2*time.Hour + 61*time.Second)
		e.apply(e.s.Tick(e.now))
		for _, id := range []queue.ID{early, late} {
			if got := e.ended[id]; got.Outcome != queue.Rejected || got.Status != 503 {
				t.Fatalf("past the promise and ColdWait: request %d ended %+v, want rejected with 503", id, got)
			}
		}
	}
	e := newEngine(t, cfg, queue.Deployment{Name: "m", MaxInFlight: 4, QueueLimit: 10})
	if err := e.s.SetCardBy("x", epoch, epoch); err == nil {
		t.Fatal("SetCardBy for a deployment not on the card: no error")
	}
}

// TestBestEffortRequestsWaitForTheirTurn: a deployment its controller
// serves best-effort keeps its interactive requests waiting for the
// promised turn (and ColdWait more); without, they give up after their
// cold wait.
func TestBestEffortRequestsWaitForTheirTurn(t *testing.T) {
	cfg := queue.Config{ColdWait: time.Minute, ColdWaitBackground: 20 * time.Minute}
	for _, be := range []bool{true, false} {
		e := newEngine(t, cfg, queue.Deployment{Name: "m", MaxInFlight: 4, QueueLimit: 10})
		if err := e.s.SetCold("m", time.Time{}, e.now); err != nil {
			t.Fatal(err)
		}
		if err := e.s.SetBestEffort("m", be); err != nil {
			t.Fatal(err)
		}
		id := e.enqueue(queue.Request{Deployment: "m", Tenant: "t", Class: queue.Interactive, PromptTokens: 1, MaxTokens: 1}, 1)
		if err := e.s.SetCardBy("m", epoch.Add(10*time.Minute), e.now); err != nil {
			t.Fatal(err)
		}
		e.now = epoch.Add(5 * time.Minute)
		e.apply(e.s.Tick(e.now))
		if _, ended := e.ended[id]; ended == be {
			t.Fatalf("best-effort %v: ended after 5 min %v; want it waiting only when best-effort", be, ended)
		}
		e.now = epoch.Add(11*time.Minute + time.Second)
		e.apply(e.s.Tick(e.now))
		if got := e.ended[id]; got.Outcome != queue.Rejected || got.Status != 503 {
			t.Fatalf("best-effort %v: past the turn and ColdWait: %+v, want rejected with 503", be, got)
		}
	}
	e := newEngine(t, cfg, queue.Deployment{Name: "m", MaxInFlight: 4, QueueLimit: 10})
	if err := e.s.SetBestEffort("x", true); err == nil || !strings.Contains(err.Error(), `"x"`) {
		t.Fatalf("unknown deployment: %v", err)
	}
}

// TestYieldingOwnerWaitsForTheCardPromisedBack: a warm owner that yields
// its share to another model's turn has the card promised back by a time
// (its controller's serialize decision, "back by …"). Its interactive
// requests, those queued before the promise and those that come after,
// wait past their cold wait for it and are answered once the engine is
// back; a full queue still refuses the next request at once. A model whose
// controller promises it the card without yielding (it waits its turn)
// keeps the plain cold wait: its interactive requests get their 503 after
// ColdWait.
func TestYieldingOwnerWaitsForTheCardPromisedBack(t *testing.T) {
	cfg := queue.Config{ColdWait: time.Minute, ColdWaitBackground: 20 * time.Minute}
	e := newEngine(t, cfg,
		queue.Deployment{Name: "owner", MaxInFlight: 4, QueueLimit: 3},
		queue.Deployment{Name: "other", MaxInFlight: 4, QueueLimit: 3})
	for _, d := range []string{"owner", "other"} {
		if err := e.s.SetCold(d, time.Time{}, e.now); err != nil {
			t.Fatal(err)
		}
	}
	fg := func(d string) queue.Request {
		return queue.Request{Deployment: d, Tenant: "t", Class: queue.Interactive, PromptTokens: 1, MaxTokens: 4}
	}
	owner := []queue.ID{e.enqueue(fg("owner"), 4)}
	other := []queue.ID{e.enqueue(fg("other"), 4)}
	// The gateway's pass before it judges the cold waits, as the node's
	// and the simulator's do: whether each yields, then the card promised.
	back := epoch.Add(10 * time.Minute)
	for d, y := range map[string]bool{"owner": true, "other": false} {
		if err := e.s.SetYielding(d, y); err != nil {
			t.Fatal(err)
		}
		if err := e.s.SetCardBy(d, back, e.now); err != nil {
			t.Fatal(err)
		}
	}
	e.now = epoch.Add(10 * time.Second)
	owner = append(owner, e.enqueue(fg("owner"), 4), e.enqueue(fg("owner"), 4))
	other = append(other, e.enqueue(fg("other"), 4))
	full := e.enqueue(fg("owner"), 4)
	if got := e.ended[full]; got.Outcome != queue.Rejected || got.Status != 429 {
		t.Fatalf("a fourth request on a queue of 3 of a yielding model: %+v, want rejected at once with 429", got)
	}

	e.now = epoch.Add(2 * time.Minute)
	e.apply(e.s.Tick(e.now))
	for _, id := range other {
		if got := e.ended[id]; got.Outcome != queue.Rejected || got.Status != 503 {
			t.Fatalf("interactive request %d of a model that waits its turn, after 2 min: %+v, want rejected with 503 after its cold wait", id, got)
		}
	}
	e.now = epoch.Add(9 * time.Minute)
	e.apply(e.s.Tick(e.now))
	for _, id := range owner {
		if got, ended := e.ended[id]; ended {
			t.Fatalf("interactive request %d of the yielding owner, 9 min in with the card promised back by 10 min: ended %+v, want it waiting", id, got)
		}
	}
	o, err := e.s.SetReady("owner", e.now)
	if err != nil {
		t.Fatal(err)
	}
	e.apply(o)
	for range 10 {
		e.step(time.Second)
	}
	for _, id := range owner {
		if got := e.ended[id]; got.Outcome != queue.Finished {
			t.Fatalf("interactive request %d of the owner, back on the card: %+v, want finished", id, got)
		}
	}

	// Once back, the owner no longer yields: a later wait (no new word
	// from its controller) gives up after the cold wait.
	if err := e.s.SetCold("owner", time.Time{}, e.now); err != nil {
		t.Fatal(err)
	}
	later := e.enqueue(fg("owner"), 4)
	if err := e.s.SetCardBy("owner", e.now.Add(10*time.Minute), e.now); err != nil {
		t.Fatal(err)
	}
	e.now = e.now.Add(61 * time.Second)
	e.apply(e.s.Tick(e.now))
	if got := e.ended[later]; got.Outcome != queue.Rejected || got.Status != 503 {
		t.Fatalf("the owner's request in a later wait it does not yield in, after 61 s: %+v, want rejected with 503", got)
	}
	if err := e.s.SetYielding("x", true); err == nil || !strings.Contains(err.Error(), `"x"`) {
		t.Fatalf("unknown deployment: %v", err)
	}
}

// TestLateRequestsGoAfterFreshOnes: requests kept past their cold wait
// for the card promised back have missed what their class is for; once
// the engine is ready, a tenant's fresh requests go first (the one that
// came a minute before it was ready, and one that comes while the late
// ones queue), then the late ones in their order, all answered. So a
// backlog kept through another model's turn does not cost the requests
// after it their SLO too.
func TestLateRequestsGoAfterFreshOnes(t *testing.T) {
	cfg := queue.Config{ColdWait: time.Minute, ColdWaitBackground: 20 * time.Minute}
	e := newEngine(t, cfg, queue.Deployment{Name: "m", MaxInFlight: 1, QueueLimit: 10})
	if err := e.s.SetCold("m", time.Time{}, e.now); err != nil {
		t.Fatal(err)
	}
	if err := e.s.SetYielding("m", true); err != nil {
		t.Fatal(err)
	}
	if err := e.s.SetCardBy("m", epoch.Add(10*time.Minute), e.now); err != nil {
		t.Fatal(err)
	}
	fg := queue.Request{Deployment: "m", Tenant: "t", Class: queue.Interactive, PromptTokens: 1, MaxTokens: 2}
	var late []queue.ID
	for range 3 {
		late = append(late, e.enqueue(fg, 2))
		e.now = e.now.Add(time.Second)
	}
	e.now = epoch.Add(5 * time.Minute)
	e.apply(e.s.Tick(e.now))
	fresh := e.enqueue(fg, 2)
	e.now = e.now.Add(30 * time.Second)
	o, err := e.s.SetReady("m", e.now)
	if err != nil {
		t.Fatal(err)
	}
	e.apply(o)
	if !slices.Equal(o.Dispatched, []queue.ID{fresh}) {
		t.Fatalf("engine ready: dispatched %v, want the fresh request %d first (late %v)", o.Dispatched, fresh, late)
	}
	e.step(time.Second)
	fresh2 := e.enqueue(fg, 2) // comes while the late ones wait
	for range 20 {
		e.step(time.Second)
	}
	for _, id := range append(append([]queue.ID{fresh}, late...), fresh2) {
		if got := e.ended[id]; got.Outcome != queue.Finished {
			t.Fatalf("request %d: %+v, want finished", id, got)
		}
	}
	want := []queue.ID{fresh, fresh2, late[0], late[1], late[2]}
	if !slices.Equal(e.dispatchOrder, want) {
		t.Fatalf("dispatch order %v, want %v: fresh requests before the late ones, these in their order", e.dispatchOrder, want)
	}
}
