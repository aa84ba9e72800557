package residency_test

import (
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/node/residency"
)

// TestProtectedDemandTakesBestEffortMemoryFirst: on a 32 GiB card the
// operator protects two quiet 12 GiB models (a and b); c, busy, is
// best-effort and runs in the memory a quiet protected model lends. When a
// protected model is asked for again, the best-effort model makes room,
// though it is worth more per GiB than the other quiet protected model:
// the card keeps its protected set whole rather than move the cost onto
// another protected model.
func TestProtectedDemandTakesBestEffortMemoryFirst(t *testing.T) {
	clock := residency.NewManualClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	c, err := residency.New(residency.Config{Card: "c32", Memory: 32 << 30, BestEffort: true}, clock)
	if err != nil {
		t.Fatal(err)
	}
	exec := instant(t, c, nil, nil)
	for _, m := range []residency.ModelID{"a", "b", "c"} {
		exec(c.Handle(residency.DeploymentAdded{Deployment: residency.Deployment{Model: m, Residency: residency.OnDemand, Priority: residency.Priority(2),
			Share: 12 << 30, CanSleep: true, LoadTime: 20 * time.Second, WakeTime: 2 * time.Second}}))
	}
	serve := func(m residency.ModelID) {
		exec(c.Handle(residency.RequestArrived{Model: m}))
		for range 60 {
			if st, _ := c.Replica(m); st.State == residency.Resident {
				exec(c.Handle(residency.RequestsActive{Model: m, Active: 0}))
				exec(c.Handle(residency.RequestFinished{Model: m, Answered: true}))
				return
			}
			clock.Advance(time.Second)
			exec(c.Handle(residency.Tick{}))
		}
		t.Fatalf("%s never came on the card", m)
	}
	serve("a")
	serve("b")
	exec(c.Handle(residency.ProtectModels{Models: []residency.ModelID{"a", "b"}, By: "ops"}))
	// c is asked for every 2 s for 10 minutes; a and b stay quiet.
	for s := 0; s < 600; s += 2 {
		serve("c")
		clock.Advance(2 * time.Second)
		exec(c.Handle(residency.Tick{}))
	}
	if st, _ := c.Replica("c"); st.State != residency.Resident {
		t.Fatalf("c is %v after 10 busy minutes, want it resident in a quiet protected model's memory", st.State)
	}
	var lent, kept residency.ModelID = "a", "b"
	if st, _ := c.Replica("a"); st.State == residency.Resident {
		lent, kept = "b", "a"
	}
	if st, _ := c.Replica(kept); st.State != residency.Resident {
		t.Fatalf("%s is %v, want it resident (c took one quiet model's memory, not both)", kept, st.State)
	}
	serve(lent)
	if st, _ := c.Replica(kept); st.State != residency.Resident {
		t.Errorf("%s was asked for and %s, protected, is %v: the best-effort c should have made room", lent, kept, st.State)
	}
	if st, _ := c.Replica("c"); st.State == residency.Resident {
		t.Errorf("c is still resident after protected %s came back; want it to have made room", lent)
	}
}
