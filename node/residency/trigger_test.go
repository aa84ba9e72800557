package residency_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/node/residency"
)

// TestOnlyOperatorCallsAreOperator: over random hours of a busy card —
// placements, removals, crashes, failed loads, owners taking their shares
// back, turns — no decision is recorded with trigger operator: nobody
// called the API. Each of those causes has its own trigger, and an
// operator's call, once made, is recorded as operator with the caller's
// name.
func TestOnlyOperatorCallsAreOperator(t *testing.T) {
	seen := map[residency.Trigger]bool{}
	for seed := uint64(1); seed <= 4; seed++ {
		w, _ := chaos(t, seed, 40*time.Minute)
		w.assertClean()
		for _, d := range w.c.Decisions() {
			if d.Trigger == residency.TriggerOperator {
				t.Fatalf("seed %d: %s %s recorded with trigger operator, though no operator asked: %s", seed, d.Action, d.Model, d.Reason)
			}
			seen[d.Trigger] = true
		}
	}
	for _, want := range []residency.Trigger{residency.TriggerRequest, residency.TriggerScheduler, residency.TriggerOwnerReturn,
		residency.TriggerWatchdog, residency.TriggerIdle} {
		if !seen[want] {
			t.Errorf("no decision with trigger %s in the random runs: its cause is recorded under another name", want)
		}
	}

	w := newWorld(t, card)
	w.add(reserved("p", residency.Pinned, 2*gi))
	w.add(onDemand("a", 8*gi))
	w.run(time.Minute)
	out := w.c.Handle(residency.OperatorLoad{Model: "a", By: "alice"})
	for _, a := range out.Actions {
		w.acts = append(w.acts, a)
		w.exec(a)
	}
	w.run(30 * time.Second)
	i := slices.IndexFunc(w.c.Decisions(), func(d residency.Decision) bool { return d.Model == "a" && d.Action == residency.ActLoad })
	if i < 0 {
		t.Fatalf("no load of a after the operator's call\n%s", w.dump())
	}
	if d := w.c.Decisions()[i]; d.Trigger != residency.TriggerOperator || d.By != "alice" || !strings.Contains(d.Reason, "alice") {
		t.Fatalf("operator's load recorded as trigger %s by %q: %s; want operator by alice", d.Trigger, d.By, d.Reason)
	}
	if d := w.c.Decisions()[slices.IndexFunc(w.c.Decisions(), func(d residency.Decision) bool { return d.Model == "p" })]; d.Trigger != residency.TriggerScheduler {
		t.Fatalf("pinned p's first load recorded with trigger %s, want scheduler: %s", d.Trigger, d.Reason)
	}
}

// TestFailoverAndRestartTriggers: a pinned replica placed after its node was
// lost loads with trigger failover; after its engine crashes it comes back
// with trigger watchdog.
func TestFailoverAndRestartTriggers(t *testing.T) {
	w := newWorld(t, card)
	d, tr := reserved("p", residency.Pinned, 4*gi)
	d.Failover = true
	w.add(d, tr)
	w.run(time.Minute)
	loads := w.actions("p", residency.ActLoad)
	if len(loads) != 1 || loads[0].Decision.Trigger != residency.TriggerFailover || !strings.Contains(loads[0].Decision.Reason, "lost") {
		t.Fatalf("failover load: %+v, want one load with trigger failover\n%s", loads, w.dump())
	}
	w.crash("p")
	w.run(5 * time.Minute)
	loads = w.actions("p", residency.ActLoad)
	if len(loads) != 2 || loads[1].Decision.Trigger != residency.TriggerWatchdog || !strings.Contains(loads[1].Decision.Reason, "failed") {
		t.Fatalf("load after the crash: %+v, want a second load with trigger watchdog\n%s", loads, w.dump())
	}
}
