package residency_test

import (
	"strings"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/node/residency"
)

// planWait is m's entry in the plan.
func planWait(t *testing.T, w *world, m residency.ModelID) residency.PlanEntry {
	t.Helper()
	for _, e := range w.c.Plan() {
		if e.Model == m {
			return e
		}
	}
	t.Fatalf("no plan entry for %s", m)
	return residency.PlanEntry{}
}

// waitDecisions are m's recorded `wait` decisions.
func waitDecisions(w *world, m residency.ModelID) []residency.Decision {
	var out []residency.Decision
	for _, d := range w.c.Decisions() {
		if d.Model == m && d.Action == residency.ActWait {
			out = append(out, d)
		}
	}
	return out
}

// checkWait asserts that m's wait is explained with cause in the plan
// (Wait and Reason alike), in one `wait` decision, and in the 503 a
// request that waited past the gateway's wait gets; with a bound when
// bounded.
func checkWait(t *testing.T, w *world, m residency.ModelID, cause string, bounded bool) residency.Wait {
	t.Helper()
	e := planWait(t, w, m)
	got := e.Wait
	if got.Waiting == 0 || !strings.Contains(got.Cause, cause) || !strings.Contains(e.Reason, got.Cause) {
		t.Fatalf("plan for waiting %s: wait %+v, reason %q; want cause %q\n%s", m, got, e.Reason, cause, w.dump())
	}
	if bounded != !got.By.IsZero() || bounded && !got.By.After(w.now()) {
		t.Fatalf("plan for waiting %s: bound %v at %v, want bounded=%v", m, got.By, w.now(), bounded)
	}
	if bounded && !strings.Contains(e.Reason, "gets the card by "+got.By.Format(time.TimeOnly)) {
		t.Fatalf("plan reason %q does not give the bound %v", e.Reason, got.By)
	}
	// One for this wait (an earlier wait of m had its own).
	var ds []residency.Decision
	for _, d := range waitDecisions(w, m) {
		if !d.Time.Before(got.Since) {
			ds = append(ds, d)
		}
	}
	if len(ds) != 1 || !strings.Contains(ds[0].Reason, "the oldest for") || ds[0].Trigger != residency.TriggerRequest {
		t.Fatalf("want one wait decision for %s with the oldest request's age, got %+v\n%s", m, ds, w.dump())
	}
	reason, ok := w.c.WaitExpired(m, time.Minute)
	if !ok || !strings.Contains(reason, got.Cause) {
		t.Fatalf("503 cause for %s: %q, want the plan's %q", m, reason, got.Cause)
	}
	return got
}

// TestBackgroundWaitExplainsItsTurn is the batch scenario: a card with a
// pinned coder and a busy interactive warm writer; the onDemand background
// batch model's requests wait for their turn. The plan, one `wait`
// decision and the 503 give the same cause and bound, and batch gets the
// card by that bound.
func TestBackgroundWaitExplainsItsTurn(t *testing.T) {
	w := newWorld(t, card)
	w.add(reserved("coder", residency.Pinned, 8*gi))
	writer, tr := reserved("writer", residency.Warm, 8*gi)
	writer.Priority = residency.Interactive
	w.add(writer, tr)
	batch, tr := onDemand("batch", 7*gi)
	batch.Priority = residency.Background
	w.add(batch, tr)
	w.run(time.Minute)
	w.request("writer", time.Hour)
	w.run(10 * time.Second)
	for range 4 {
		w.request("batch", 30*time.Second)
	}
	w.run(5 * time.Second)
	if w.state("batch") != residency.Cold {
		t.Fatalf("batch is %s: the busy writer should keep it waiting\n%s", w.state("batch"), w.dump())
	}
	got := checkWait(t, w, "batch", "waits for its background turn: interactive writer holds card gpu0 with 1 request", true)
	if got.Waiting != 4 {
		t.Fatalf("wait counts %d requests, want 4", got.Waiting)
	}
	// The wait is recorded once, however long it lasts.
	w.run(time.Minute)
	if n := len(waitDecisions(w, "batch")); n != 1 {
		t.Fatalf("%d wait decisions for one wait, want 1\n%s", n, w.dump())
	}
	for w.now().Before(got.By) && w.state("batch") != residency.Resident {
		w.run(time.Second)
	}
	if w.state("batch") != residency.Resident {
		t.Fatalf("batch is %s at %v, past its bound\n%s", w.state("batch"), got.By, w.dump())
	}
	w.assertClean()
}

// TestLoadingWaitExplainsItsProgress: requests for a model being loaded
// wait "loading, Ns of Ms", bounded by the expected load.
func TestLoadingWaitExplainsItsProgress(t *testing.T) {
	w := newWorld(t, card)
	w.add(onDemand("a", 8*gi))
	w.request("a", time.Second)
	w.run(12 * time.Second)
	got := checkWait(t, w, "a", "loading on card gpu0, 12s of 20s", true)
	if want := w.now().Add(8 * time.Second); !got.By.Equal(want) {
		t.Fatalf("loading bound %v, want %v", got.By, want)
	}
}

// TestEqualClassWaitExplainsItsTurn: b waits for a busy a of its class;
// the plan names a and the bound, and once the pair is serialized, says
// so with the time a's turn ends.
func TestEqualClassWaitExplainsItsTurn(t *testing.T) {
	w := newWorld(t, card)
	w.add(onDemand("a", 12*gi))
	w.add(onDemand("b", 12*gi))
	w.request("a", 10*time.Minute)
	w.run(time.Minute)
	w.request("b", 10*time.Minute)
	w.run(10 * time.Second)
	checkWait(t, w, "b", "waits for its turn after a (standard too), on card gpu0 for", true)
	// b takes its turn; then a waits for b, serialized with it.
	for range 200 {
		if w.state("b") == residency.Resident {
			break
		}
		w.run(time.Second)
	}
	w.request("a", time.Minute)
	w.run(10 * time.Second)
	e := planWait(t, w, "a")
	if !strings.Contains(e.Wait.Cause, "serialized with b until") || e.Wait.By.IsZero() {
		t.Fatalf("a waiting for serialized b: %+v\n%s", e.Wait, w.dump())
	}
}

// TestWaitForMemoryBeingFreed: an interactive request drains a busy
// standard model; while it drains, the interactive model's wait names it
// and the drain deadline.
func TestWaitForMemoryBeingFreed(t *testing.T) {
	w := newWorld(t, card)
	std, tr := onDemand("std", 12*gi)
	w.add(std, tr)
	chat, tr := onDemand("chat", 12*gi)
	chat.Priority = residency.Interactive
	w.add(chat, tr)
	w.request("std", 10*time.Minute)
	w.run(time.Minute)
	w.request("chat", 5*time.Second)
	w.run(5 * time.Second)
	checkWait(t, w, "chat", "waits for memory: std is being taken off card gpu0 for it (sleep once its 1 request finish", true)
}

// TestFailedLoadWaitExplainsTheRetry: a model whose load failed waits for
// its retry, named with its time.
func TestFailedLoadWaitExplainsTheRetry(t *testing.T) {
	w := newWorld(t, residency.Config{Card: "gpu0", Memory: 24 * gi, RetryBackoff: 30 * time.Second})
	d, tr := onDemand("a", 8*gi)
	tr.failLoad = true
	w.add(d, tr)
	w.request("a", time.Second)
	w.run(22 * time.Second)
	checkWait(t, w, "a", "its last load on card gpu0 failed (1 failure); it is tried again at", true)
}

// TestPlanSaysWhatComesNext: the plan gives, per model, what the
// controller does next without new requests and when — an idle sleep,
// an unload of a model asleep — and a sleep that discards the weights
// shows tier disk.
func TestPlanSaysWhatComesNext(t *testing.T) {
	w := newWorld(t, residency.Config{Card: "gpu0", Memory: 24 * gi, IdleSleep: 3 * time.Minute, IdleUnload: 10 * time.Minute})
	w.add(onDemand("a", 8*gi))
	d, tr := onDemand("o", 4*gi)
	d.SleepDiscards = true
	w.add(d, tr)
	w.request("a", time.Second)
	w.request("o", time.Second)
	w.run(time.Minute)
	e := planWait(t, w, "a")
	if e.Next != residency.ActSleep || e.NextWhy != "idle" || e.NextAt.Before(w.now()) || e.NextAt.After(w.now().Add(3*time.Minute)) {
		t.Fatalf("resident idle a: next %s at %v (%s), want a sleep within the idle timeout of %v", e.Next, e.NextAt, e.NextWhy, w.now())
	}
	w.run(4 * time.Minute)
	e = planWait(t, w, "a")
	if e.State != residency.Sleeping || e.Next != residency.ActUnload || e.HostBytes == 0 || e.Tier != "host" {
		t.Fatalf("asleep a: %+v, want an unload next and its weights in host RAM", e)
	}
	if o := planWait(t, w, "o"); o.State != residency.Sleeping || o.Tier != "disk" || o.HostBytes != 0 {
		t.Fatalf("o asleep with its weights discarded: tier %s, host %d, want disk and 0", o.Tier, o.HostBytes)
	}
}

// TestWaitForItsOwnReturn: requests that come for a model while it drains
// for a higher class wait for its return, and say so.
func TestWaitForItsOwnReturn(t *testing.T) {
	w := newWorld(t, card)
	std, tr := onDemand("std", 12*gi)
	w.add(std, tr)
	chat, tr := onDemand("chat", 12*gi)
	chat.Priority = residency.Interactive
	w.add(chat, tr)
	w.request("std", 10*time.Minute)
	w.run(time.Minute)
	w.request("chat", 5*time.Second)
	w.run(time.Second)
	w.request("std", time.Second)
	w.run(3 * time.Second)
	if w.state("std") != residency.Draining {
		t.Fatalf("std is %s, want Draining for chat\n%s", w.state("std"), w.dump())
	}
	got := checkWait(t, w, "std", "waits for its return: its engine on card gpu0 is being taken off (sleep), its 1 running request finish first", false)
	if got.Waiting != 1 {
		t.Fatalf("wait counts %d requests, want the 1 that came during the drain", got.Waiting)
	}
}
