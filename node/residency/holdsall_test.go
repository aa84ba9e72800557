package residency_test

import (
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/node/residency"
)

// TestIdleModelsStayWhileTheCardHoldsThemAll: on a 48 GiB card that holds
// a warm and an onDemand model together, the best-effort policy keeps both
// on the card through 20 idle minutes (a sleep would only cost the next
// request a wake: nobody needs the memory), while without it, or for a
// deployment with its own spec.idle, the card's idle timeouts still apply.
func TestIdleModelsStayWhileTheCardHoldsThemAll(t *testing.T) {
	run := func(bestEffort bool, idle time.Duration) map[residency.ModelID]residency.State {
		clock := residency.NewManualClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
		c, err := residency.New(residency.Config{Card: "c48", Memory: 48 << 30, BestEffort: bestEffort}, clock)
		if err != nil {
			t.Fatal(err)
		}
		exec := instant(t, c, nil, nil)
		for _, d := range []struct {
			m   residency.ModelID
			res residency.Residency
		}{{"chat", residency.Warm}, {"vision", residency.OnDemand}} {
			exec(c.Handle(residency.DeploymentAdded{Deployment: residency.Deployment{Model: d.m, Residency: d.res, Priority: residency.Priority(2),
				Share: 14 << 30, CanSleep: true, LoadTime: 20 * time.Second, WakeTime: 2 * time.Second, IdleSleep: idle}}))
		}
		// A burst of requests to each (a minute), then 20 minutes idle.
		for s := 0; s < 60; s++ {
			clock.Advance(time.Second)
			for _, m := range []residency.ModelID{"chat", "vision"} {
				exec(c.Handle(residency.RequestArrived{Model: m}))
				if st, _ := c.Replica(m); st.State == residency.Resident && st.Active > 0 {
					exec(c.Handle(residency.RequestsActive{Model: m, Active: 0}))
				}
			}
			exec(c.Handle(residency.Tick{}))
		}
		for s := 0; s < 20*60; s++ {
			clock.Advance(time.Second)
			exec(c.Handle(residency.Tick{}))
		}
		out := map[residency.ModelID]residency.State{}
		for _, m := range []residency.ModelID{"chat", "vision"} {
			st, _ := c.Replica(m)
			out[m] = st.State
		}
		return out
	}
	if got := run(true, 0); got["chat"] != residency.Resident || got["vision"] != residency.Resident {
		t.Errorf("best-effort on, the card holding both: %v, want both resident after 20 idle minutes", got)
	}
	if got := run(false, 0); got["chat"] == residency.Resident || got["vision"] == residency.Resident {
		t.Errorf("best-effort off: %v, want both demoted by the card's 5-minute idle sleep", got)
	}
	if got := run(true, time.Minute); got["chat"] == residency.Resident || got["vision"] == residency.Resident {
		t.Errorf("best-effort on, spec.idle sleepAfter 1m: %v, want both demoted by their own idle timeout", got)
	}
}
