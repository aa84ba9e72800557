package residency_test

import (
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/node/residency"
)

// TestAReportedSleepKeepsTheLedger: on a 24 GiB card with a pinned 8 GiB
// model, a 14.6 GiB model asks for the card while a 10 GiB onDemand one,
// never put to sleep before, is idle on it. The controller puts the idle
// one to sleep; its engine keeps 512 MiB asleep. Reported with the sleep
// (SleepDone.Residual, as the agent reads it from NVML and the simulator
// from its engine), the 512 MiB count in the same step: the sleeper is
// unloaded and the big model comes on the card. Not reported, the sleep
// counts nothing until the card's next memory sample: the big load starts
// into memory the sleep did not free and the sample leaves the claims over
// the usable memory, a ledger violation, and the card goes pinned-only.
func TestAReportedSleepKeepsTheLedger(t *testing.T) {
	run := func(reported bool) (violations int, big residency.State, pinnedOnly bool) {
		clock := residency.NewManualClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
		c, err := residency.New(residency.Config{Card: "c24", Memory: 24 << 30}, clock)
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
	if v, big, po := run(true); v != 0 || big != residency.Resident || po {
		t.Errorf("the sleep reporting its 512 MiB: %d violations, big %v, pinned-only %v; want none, big resident, not pinned-only", v, big, po)
	}
	if v, _, po := run(false); v == 0 || !po {
		t.Errorf("the sleep reporting nothing: %d violations, pinned-only %v; want the violation a report avoids (the test shows nothing otherwise)", v, po)
	}
}
