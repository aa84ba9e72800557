package residency_test

import (
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/node/residency"
)

// TestAnUnmeasuredSleepHoldsItsFootprintUntilSampled: on a 24 GiB card
// with a pinned 8 GiB model, a 14.6 GiB model asks for the card while a
// 10 GiB onDemand one, never put to sleep before, is idle on it. The
// controller puts the idle one to sleep; its engine keeps 512 MiB asleep,
// which the card's next memory sample shows. Counted as holding nothing
// until then (SleepUnmeasuredFull off), the waiting model's load starts
// into memory the sleep did not free and the sample leaves the claims over
// the usable memory: a ledger violation, and the card goes pinned-only.
// Counted at its footprint until sampled (as the simulator runs it), the
// load waits for the sample, the sleeping model is unloaded
// for the 512 MiB it still holds, and the big model comes on the card.
// Reported by the sleep itself, the residual needs neither rule.
func TestAnUnmeasuredSleepHoldsItsFootprintUntilSampled(t *testing.T) {
	run := func(full, reported bool) (violations int, big residency.State, pinnedOnly bool) {
		clock := residency.NewManualClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
		c, err := residency.New(residency.Config{Card: "c24", Memory: 24 << 30, SleepUnmeasuredFull: full}, clock)
		if err != nil {
			t.Fatal(err)
		}
		var slept []residency.ModelID
		exec := instantSleeping(t, c, func(a residency.Action) {
			if a.Kind == residency.ActSleep {
				slept = append(slept, a.Model)
			}
		}, &violations, 512<<20, reported)
		add := func(m residency.ModelID, res residency.Residency, gib float64) {
			exec(c.Handle(residency.DeploymentAdded{Deployment: residency.Deployment{Model: m, Residency: res, Priority: residency.Priority(2),
				Share: int64(gib * (1 << 30)), CanSleep: true, LoadTime: 10 * time.Second, WakeTime: time.Second}}))
		}
		add("pinned", residency.Pinned, 8)
		add("small", residency.OnDemand, 10)
		add("big", residency.OnDemand, 14.6)
		exec(c.Handle(residency.RequestArrived{Model: "small"}))
		exec(c.Handle(residency.RequestsActive{Model: "small", Active: 0}))
		exec(c.Handle(residency.RequestFinished{Model: "small", Answered: true}))
		clock.Advance(5 * time.Minute)
		exec(c.Handle(residency.RequestArrived{Model: "big"}))
		for range 10 {
			// The card's next sample: the sleeping engine's 512 MiB.
			for _, m := range slept {
				if st, _ := c.Replica(m); st.State == residency.Sleeping {
					exec(c.Handle(residency.MemorySample{Model: m, Bytes: 512 << 20}))
				}
			}
			clock.Advance(time.Second)
			exec(c.Handle(residency.Tick{}))
		}
		st, _ := c.Replica("big")
		return violations, st.State, c.PinnedOnly()
	}
	if v, big, po := run(true, false); v != 0 || big != residency.Resident || po {
		t.Errorf("counted at its footprint until sampled: %d violations, big %v, pinned-only %v; want none, big resident, not pinned-only", v, big, po)
	}
	if v, _, po := run(false, false); v == 0 || !po {
		t.Errorf("counted as holding nothing until sampled: %d violations, pinned-only %v; want the violation this setting exists to avoid", v, po)
	}
	// A sleep that reports what it kept as it completes (as the agent's
	// card manager and the simulator report it) needs neither guess.
	for _, full := range []bool{false, true} {
		if v, big, po := run(full, true); v != 0 || big != residency.Resident || po {
			t.Errorf("the sleep reporting its 512 MiB (SleepUnmeasuredFull %v): %d violations, big %v, pinned-only %v; want none, big resident", full, v, big, po)
		}
	}
}
