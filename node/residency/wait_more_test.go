package residency_test

import (
	"strings"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/node/residency"
)

// atReject runs fn once, at the step that rejects m's waiting requests:
// after the controller decided it, before the gateway has refused them
// (the plan then still counts them as waiting). It reports whether fn ran.
func atReject(w *world, m residency.ModelID, fn func()) *bool {
	ran, seen := new(bool), len(w.actions(m, residency.ActReject))
	w.onStep = func() {
		if n := len(w.actions(m, residency.ActReject)); n > seen && !*ran {
			*ran = true
			fn()
		}
	}
	return ran
}

// TestYieldingOwnerWaitExplainsTheTurn: a warm owner asked for again
// while the borrower it slept for is in a turn its return already cut
// short once yields to that turn; its wait names the borrower and the
// bound it gets the card by, and it does by then.
func TestYieldingOwnerWaitExplainsTheTurn(t *testing.T) {
	w := newWorld(t, card)
	w.add(reserved("owner", residency.Warm, 12*gi))
	w.add(onDemand("b", 14*gi))
	w.request("owner", time.Second)
	w.run(time.Minute)
	// b borrows the owner's share; the owner's return cuts b's load short.
	w.request("b", 5*time.Minute)
	w.run(5 * time.Second)
	w.request("owner", time.Second)
	w.run(time.Minute)
	// b gets the share again; now the owner yields to b's turn.
	for range 300 {
		if s := w.state("b"); s == residency.Loading || s == residency.Waking {
			break
		}
		w.run(time.Second)
	}
	w.request("owner", time.Second)
	w.run(3 * time.Second)
	got := checkWait(t, w, "owner", "yields to b's turn on card gpu0, which ends by ", true)
	// b's turn ends a drain deadline (30s) and b's reload (20s) before the
	// owner's bound.
	if end := got.By.Add(-50 * time.Second); !end.After(w.now()) || !strings.Contains(got.Cause, "ends by "+end.Format(time.TimeOnly)) {
		t.Fatalf("yielding owner's cause %q, want b's turn to end by %v", got.Cause, end)
	}
	for w.now().Before(got.By) && w.state("owner") != residency.Resident {
		w.run(time.Second)
	}
	if w.state("owner") != residency.Resident {
		t.Fatalf("owner is %s at %v, past its bound\n%s", w.state("owner"), got.By, w.dump())
	}
	w.assertClean()
}

// waitingBehindA is a card where b (standard, onDemand) has waited 5s for
// its turn after a busy a of its class, and that wait is recorded.
func waitingBehindA(t *testing.T) *world {
	t.Helper()
	w := newWorld(t, card)
	w.add(onDemand("a", 12*gi))
	w.add(onDemand("b", 12*gi))
	w.request("a", 10*time.Minute)
	w.run(time.Minute)
	w.request("b", 10*time.Minute)
	w.request("b", 10*time.Minute)
	w.run(5 * time.Second)
	if n := len(waitDecisions(w, "b")); w.state("b") != residency.Cold || n != 1 {
		t.Fatalf("b is %s with %d wait decisions, want Cold with 1\n%s", w.state("b"), n, w.dump())
	}
	return w
}

// TestPinnedOnlyWaitExplainsTheFallback: a model waiting for its turn
// when a ledger violation drops the card to pinned-only says so, without
// a bound (only the operator ends it), and the wait stays one recorded
// episode.
func TestPinnedOnlyWaitExplainsTheFallback(t *testing.T) {
	w := waitingBehindA(t)
	ran := atReject(w, "b", func() {
		got := checkWait(t, w, "b", "card gpu0 is pinned-only after a ledger violation: onDemand models are not loaded until the operator clears it", false)
		if got.Waiting != 2 || w.now().Sub(got.Since) != 5*time.Second || !strings.Contains(got.Text, "2 requests waiting, the oldest for 5s: ") {
			t.Fatalf("pinned-only wait %+v, want b's 2 requests, the oldest for 5s", got)
		}
	})
	// a's engine reports far more than it may hold.
	w.send(residency.MemorySample{Model: "a", Bytes: 30 * gi})
	w.flush()
	if !*ran || !w.c.PinnedOnly() {
		t.Fatalf("pinned-only %v, b's requests rejected %v\n%s", w.c.PinnedOnly(), *ran, w.dump())
	}
}

// TestNeverFitWaitExplainsTheNumbers: a model waiting for its turn when
// a pinned model takes most of the card can never be loaded there; its
// wait says so with the numbers, without a bound.
func TestNeverFitWaitExplainsTheNumbers(t *testing.T) {
	w := waitingBehindA(t)
	ran := atReject(w, "b", func() {
		got := checkWait(t, w, "b", "card gpu0 can never hold it: it needs 12.0Gi, at most 6.8Gi can be made free (usable 22.8Gi)", false)
		if got.Waiting != 2 || w.now().Sub(got.Since) != 5*time.Second {
			t.Fatalf("never-fit wait %+v, want b's 2 requests, the oldest for 5s", got)
		}
	})
	w.add(reserved("p", residency.Pinned, 16*gi))
	w.flush()
	if !*ran {
		t.Fatalf("b's requests were not rejected when p was pinned\n%s", w.dump())
	}
	w.run(time.Minute)
	w.assertClean()
}
