//go:build !residency_plantbug

package residency

import (
	"strings"
	"testing"
	"time"
)

// The ledger check itself, fed a step the policy would never take: it must
// name the invariant broken.
func TestCheckCatchesWhatThePolicyMustNotDo(t *testing.T) {
	clk := NewManualClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	c, err := New(Config{Card: "gpu0", Memory: 24 << 30}, clk)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []Deployment{
		{Model: "busy", Residency: OnDemand, Priority: Interactive, Share: 8 << 30},
		{Model: "pin", Residency: Pinned, Share: 8 << 30},
		{Model: "low", Residency: OnDemand, Priority: Background, Share: 4 << 30},
	} {
		if err := c.upsert(d, clk.Now()); err != nil {
			t.Fatal(err)
		}
	}
	c.reps[0].state, c.reps[0].active = Resident, 2
	c.reps[1].state = Resident
	c.reps[2].active = 1
	before := append([]replica(nil), c.reps...)
	act := func(k ActionKind, m, forM ModelID, trig Trigger) Action {
		return Action{Kind: k, Model: m, Decision: Decision{Action: k, Model: m, For: forM, Trigger: trig}}
	}
	for _, tc := range []struct {
		name string
		acts []Action
		want string
	}{
		{"evict a busy engine without a drain", []Action{act(ActEvict, "busy", "low", TriggerRequest)}, "I3: evict of busy with 2 requests active"},
		{"drain for a lower priority", []Action{act(ActDrain, "busy", "low", TriggerRequest)}, "I3: drain of busy (interactive, 2 requests active) by request for \"low\""},
		{"drain for a forecast", []Action{act(ActDrain, "busy", "low", TriggerForecast)}, "I3: drain of busy"},
		{"sleep a pinned model", []Action{act(ActSleep, "pin", "low", TriggerRequest)}, "I2: sleep of pinned pin"},
		{"cold-load a resident model", []Action{act(ActLoad, "busy", "", TriggerRequest)}, "I2: cold load of busy from Resident"},
	} {
		vs := c.check(before, tc.acts, clk.Now())
		var got []string
		for _, v := range vs {
			got = append(got, v.Invariant+": "+v.Detail)
		}
		if len(vs) == 0 || !strings.HasPrefix(got[0], tc.want) || len(vs[0].Ledger.Entries) != 3 {
			t.Errorf("%s: got %q, want %q with the ledger", tc.name, got, tc.want)
		}
	}
	// A borrower loading into a pinned share breaks I2, and past usable I1.
	c.reps[2].state = Loading
	c.reps[2].dep.Peak = 12 << 30
	vs := c.check(before, nil, clk.Now())
	if len(vs) != 3 || vs[0].Invariant != "I1" || vs[1].Invariant != "I2" || !strings.Contains(vs[2].Detail, "low started loading while promises are being returned") {
		t.Fatalf("got %v", vs)
	}
}
