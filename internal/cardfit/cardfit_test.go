package cardfit

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// valid is the rule stated over a whole card, independently of Room: at
// most maxModels replicas, reserved shares within the card, and the
// largest onDemand share within the card minus the pinned shares.
func valid(l Load, maxModels int32) bool {
	return (maxModels == 0 || l.Replicas <= maxModels) && l.Reserved <= Full && l.Pinned+l.OnDemandMax <= Full
}

// TestFitsIsTheRuleAfterAdding checks on random valid cards that a share
// fits exactly when the card is still valid with it added, and that Why
// gives a reason exactly when it does not fit.
func TestFitsIsTheRuleAfterAdding(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 35))
	var fit, refused int
	for range 20000 {
		maxModels := int32(rng.IntN(5))
		var l Load
		for range rng.IntN(6) {
			r, milli := Residency(rng.IntN(3)), int32(10*(1+rng.IntN(100)))
			next := l
			next.Add(r, milli)
			if valid(next, maxModels) {
				l = next
			}
		}
		r, milli := Residency(rng.IntN(3)), int32(10*(1+rng.IntN(100)))
		after := l
		after.Add(r, milli)
		got, want := l.Fits(r, milli, maxModels), valid(after, maxModels)
		if got != want {
			t.Fatalf("%+v + %v %d‰ (maxModels %d): Fits %v, rule says %v", l, r, milli, maxModels, got, want)
		}
		if why := l.Why(r, milli, maxModels); (why == nil) != got {
			t.Fatalf("%+v + %v %d‰: Fits %v but Why %v", l, r, milli, got, why)
		}
		if got {
			fit++
		} else {
			refused++
		}
	}
	if fit < 1000 || refused < 1000 {
		t.Fatalf("%d fit, %d refused: the cases do not cover both answers", fit, refused)
	}
}

// TestWhyNamesTheRule checks the reason given for each rule a share can
// break, with its numbers.
func TestWhyNamesTheRule(t *testing.T) {
	for _, c := range []struct {
		load      Load
		r         Residency
		milli     int32
		maxModels int32
		want      string
	}{
		{Load{Replicas: 2}, Pinned, 100, 2, "already holds 2 of 2 models"},
		{Load{Replicas: 1, Reserved: 700, Pinned: 700}, OnDemand, 400, 4, "has 30% not pinned, onDemand replica needs 40%"},
		{Load{Replicas: 1, Reserved: 700}, Warm, 400, 0, "has 30% free, replica needs 40%"},
		{Load{Replicas: 1, OnDemandMax: 600}, Pinned, 500, 0, "pinning 50% would leave 50% for an onDemand replica there that needs 60%"},
	} {
		err := c.load.Why(c.r, c.milli, c.maxModels)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v + %v %d‰: Why = %v, want %q", c.load, c.r, c.milli, err, c.want)
		}
	}
}

// TestParseResidency checks the one reading of a residency's name: any
// case, space around ignored, empty for the default (pinned), and the
// names String writes read back.
func TestParseResidency(t *testing.T) {
	for in, want := range map[string]Residency{"": Pinned, " ": Pinned, "pinned": Pinned, "Warm": Warm, "onDemand": OnDemand, " ONDEMAND ": OnDemand} {
		if got, ok := ParseResidency(in); !ok || got != want {
			t.Errorf("ParseResidency(%q) = %v, %v; want %v", in, got, ok, want)
		}
	}
	for _, bad := range []string{"on-demand", "pin", "hot"} {
		if _, ok := ParseResidency(bad); ok {
			t.Errorf("ParseResidency(%q) accepted", bad)
		}
	}
	for _, r := range []Residency{Pinned, Warm, OnDemand} {
		if got, ok := ParseResidency(r.String()); !ok || got != r {
			t.Errorf("%v does not read back: %v, %v", r, got, ok)
		}
	}
}
