package residency_test

import (
	"strings"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/node/residency"
)

// TestBestEffortProtectsTheLargestSetAndAnOperatorPinsIt: a 32 GiB card
// with a busy warm chat (14 GiB) and two busy onDemand models (20 and 14
// GiB) that cannot all be on it. The controller protects the chat (its
// promise) and the vision model (which fits beside it), serves the coder
// best-effort, says why in numbers (BestEffort, the plan, the decision
// log), and never takes a protected model's memory for the coder's
// demand outside its turn. An operator's choice replaces its own.
func TestBestEffortProtectsTheLargestSetAndAnOperatorPinsIt(t *testing.T) {
	clock := residency.NewManualClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	c, err := residency.New(residency.Config{Card: "c32", Memory: 32 << 30, BestEffort: true}, clock)
	if err != nil {
		t.Fatal(err)
	}
	exec := instant(t, c, nil, nil)
	add := func(m residency.ModelID, res residency.Residency, gib int64) {
		exec(c.Handle(residency.DeploymentAdded{Deployment: residency.Deployment{Model: m, Residency: res, Priority: residency.Priority(2),
			Share: gib << 30, CanSleep: true, LoadTime: 20 * time.Second, WakeTime: 2 * time.Second}}))
	}
	add("chat", residency.Warm, 14)
	add("coder", residency.OnDemand, 20)
	add("vision", residency.OnDemand, 14)
	// Each busy: a request a few seconds apart, finished at once.
	for s := 0; s < 600; s++ {
		clock.Advance(time.Second)
		for _, m := range []residency.ModelID{"chat", "coder", "vision"} {
			if s%3 == 0 {
				exec(c.Handle(residency.RequestArrived{Model: m}))
			}
			// A resident model serves what waits for it at once.
			if st, _ := c.Replica(m); st.State == residency.Resident && st.Active > 0 {
				exec(c.Handle(residency.RequestsActive{Model: m, Active: 0}))
			}
		}
		exec(c.Handle(residency.Tick{}))
	}
	be := c.BestEffort()
	if len(be) != 1 || be[0].Model != "coder" || !c.Protected("chat") || !c.Protected("vision") {
		t.Fatalf("best-effort %+v: want the coder alone, chat and vision protected", be)
	}
	if why := be[0].Reason; !strings.Contains(why, "needs 20.0Gi") || !strings.Contains(why, "can lend") {
		t.Fatalf("reason %q: want what it needs and what the card can lend", why)
	}
	planned := false
	for _, e := range c.Plan() {
		if e.Model == "coder" && e.BestEffort == be[0].Reason {
			planned = true
		}
		if e.Model != "coder" && e.BestEffort != "" {
			t.Errorf("plan: %s best-effort: %q", e.Model, e.BestEffort)
		}
	}
	if !planned {
		t.Errorf("the plan does not say the coder is best-effort")
	}
	// Once the set is in force (the first minute runs without it: no
	// rates yet), the coder's demand takes no protected memory but in its
	// bounded turn (and the sleep that ends a drain begun for it).
	logged := false
	for _, d := range c.Decisions() {
		if d.Action == residency.ActBestEffort && strings.Contains(d.Reason, "protects chat, vision") && strings.Contains(d.Reason, "best-effort coder") {
			logged = true
		}
		if logged && d.For == "coder" && (d.Model == "chat" || d.Model == "vision") && (d.Action == residency.ActSleep || d.Action == residency.ActEvict) &&
			!strings.Contains(d.Reason, "turn") && !strings.Contains(d.Reason, "drain deadline") {
			t.Errorf("the coder's demand took a protected model's memory outside its turn: %s", d.Reason)
		}
	}
	if !logged {
		t.Errorf("no best-effort decision in the log: %v", c.Decisions())
	}
	// The coder's own decision says why, with the pressure trigger.
	var own residency.Decision
	for _, d := range c.Decisions() {
		if d.Action == residency.ActBestEffort && d.Model == "coder" {
			own = d
		}
	}
	if own.Trigger != residency.TriggerPressure || own.Reason != "best-effort: "+be[0].Reason {
		t.Errorf("the coder's best-effort decision: %+v; want its reason %q with the pressure trigger", own, be[0].Reason)
	}

	// The operator cannot protect the coder: with chat (warm, always
	// protected) it does not fit the card; refused with the numbers,
	// nothing changes.
	if out := c.Handle(residency.ProtectModels{Models: []residency.ModelID{"coder"}, By: "ops"}); out.Err == nil ||
		!strings.Contains(out.Err.Error(), "cannot hold chat (warm, 14.0Gi), coder (onDemand, 20.0Gi) together: they need 34.0Gi") {
		t.Fatalf("protect coder: %v, want a refusal with the numbers", out.Err)
	}
	if c.Protected("coder") || !c.Protected("vision") {
		t.Fatalf("a refused choice changed the set: coder %v, vision %v", c.Protected("coder"), c.Protected("vision"))
	}
	// The operator pins vision: the coder stays best-effort, now by the
	// operator's choice, with a decision with the operator trigger.
	exec(c.Handle(residency.ProtectModels{Models: []residency.ModelID{"vision"}, By: "ops"}))
	if c.Protected("coder") || !c.Protected("vision") || !c.Protected("chat") {
		t.Fatalf("after the operator's choice: coder %v, vision %v, chat %v; want vision and chat (warm) protected",
			c.Protected("coder"), c.Protected("vision"), c.Protected("chat"))
	}
	if be := c.BestEffort(); len(be) != 1 || be[0].Model != "coder" || !be[0].Pinned || !strings.Contains(be[0].Reason, "not in the operator's choice (ops)") {
		t.Fatalf("best-effort %+v: want the coder, by the operator's choice", be)
	}
	last := func(m residency.ModelID) residency.Decision {
		var l residency.Decision
		for _, d := range c.Decisions() {
			if d.Action == residency.ActBestEffort && d.Model == m {
				l = d
			}
		}
		return l
	}
	if d := last("coder"); d.Trigger != residency.TriggerOperator || !strings.Contains(d.Reason, "not in the operator's choice (ops)") {
		t.Errorf("coder's decision: %+v; want best-effort by the operator's choice, operator trigger", d)
	}
	// Given back: the controller's choice again, with the pressure trigger.
	exec(c.Handle(residency.ProtectModels{By: "ops"}))
	if d := last("coder"); d.Trigger != residency.TriggerPressure || strings.Contains(d.Reason, "operator") {
		t.Errorf("coder's decision once the choice is given back: %+v; want the controller's, pressure trigger", d)
	}
	if out := c.Handle(residency.ProtectModels{Models: []residency.ModelID{"nope"}}); out.Err == nil || !strings.Contains(out.Err.Error(), "nope") {
		t.Fatalf("an unknown model: %v, want an error naming it", out.Err)
	}
}
