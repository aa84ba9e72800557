package scheduler

import (
	"strings"
	"testing"
)

func onDemand(id, acc string, milli int) Request {
	r := share(id, acc, milli)
	r.Residency = OnDemand
	return r
}

func withResidency(r Request, res Residency) Request {
	r.Residency = res
	return r
}

// TestOnDemandPacksOnOneCard is docs/residency.md's home GPU: three onDemand models
// whose shares sum to 160 % of a card are assigned to one card of a shared
// accelerator with maxModels 3 (nothing is reserved), leaving the node's
// other card unbound for other accelerators; spread puts them apart.
func TestOnDemandPacksOnOneCard(t *testing.T) {
	for _, p := range []Policy{PolicyDefault, PolicyBestFit, PolicyFGD} {
		s, err := NewState(cluster(1, 2, "l4"), []Accelerator{home})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range []Request{onDemand("chat-0", "home", 600), onDemand("embed-0", "home", 550), onDemand("asr-0", "home", 450)} {
			if d := mustPlace(t, s, r, p); d.Node != "n0" || len(d.Cards) != 1 || d.Cards[0] != 0 {
				t.Fatalf("%s: %s placed on %s cards %v, want n0 card 0", p, r.Replica, d.Node, d.Cards)
			}
		}
		if used, _ := s.Allocated(); used != 0 {
			t.Fatalf("%s: %d milli-cards reserved by onDemand replicas, want 0", p, used)
		}
		// A fourth is refused by maxModels, and goes to the other card.
		if d := mustPlace(t, s, onDemand("vision-0", "home", 300), p); d.Cards[0] != 1 {
			t.Fatalf("%s: vision placed on card %v, want 1 (card 0 holds maxModels)", p, d.Cards)
		}
	}
	s, err := NewState(cluster(1, 2, "l4"), []Accelerator{home})
	if err != nil {
		t.Fatal(err)
	}
	a := mustPlace(t, s, onDemand("chat-0", "home", 600), PolicySpread)
	b := mustPlace(t, s, onDemand("embed-0", "home", 550), PolicySpread)
	if a.Cards[0] == b.Cards[0] {
		t.Fatalf("spread put chat and embed both on card %d", a.Cards[0])
	}
}

// TestReservationsVersusAssignments is rule 11 as docs/residency.md restates it:
// reserved shares (pinned and warm) sum to ≤ 100 % per card, an onDemand
// share fits in the card minus its pinned shares, a pinned share leaves the
// largest onDemand share its room, and maxModels counts every replica.
func TestReservationsVersusAssignments(t *testing.T) {
	s, err := NewState(cluster(1, 1, "l4"), []Accelerator{one, whole})
	if err != nil {
		t.Fatal(err)
	}
	p := PolicyDefault
	mustPlace(t, s, withResidency(share("warm-0", "one", 700), Warm), p)
	mustPlace(t, s, onDemand("coder-0", "one", 800), p) // borrows the warm share: nothing pinned
	mustFail(t, s, share("pin-0", "one", 300), p, "no l4 card has 30% free: 1 card has at most 20% free")
	mustPlace(t, s, share("pin-0", "one", 200), p)
	mustFail(t, s, onDemand("late-0", "one", 900), p, "no l4 card has 90% not pinned for an onDemand replica: 1 card has at most 80% not pinned")
	mustFail(t, s, withResidency(share("warm2-0", "one", 200), Warm), p, "no l4 card has 20% free: 1 card has at most 10% free")
	mustPlace(t, s, onDemand("tiny-0", "one", 50), p)
	mustFail(t, s, onDemand("more-0", "one", 10), p, "no l4 card has 1% not pinned for an onDemand replica: 1 card already holds 4 replicas (maxModels)")
	if used, _ := s.Allocated(); used != 900 {
		t.Fatalf("reserved %d milli-cards, want 900 (warm 700 + pinned 200)", used)
	}
	// Removing the largest onDemand share gives a pinned share its room back.
	if !s.Remove("coder-0") {
		t.Fatal("coder-0 not placed")
	}
	mustPlace(t, s, share("pin2-0", "one", 100), p)

	// A view that breaks the restated rule is refused.
	bad := cluster(1, 1, "l4")
	bad[0].Cards[0].Accelerator = "one"
	bad[0].Cards[0].Shares = []Share{
		{Replica: "p-0", Deployment: "p", Accelerator: "one", Milli: 500},
		{Replica: "o-0", Deployment: "o", Accelerator: "one", Milli: 600, Residency: OnDemand},
	}
	if err := Check(bad, []Accelerator{one}); err == nil || !strings.Contains(err.Error(), "an onDemand share of 60% does not fit beside 50% pinned") {
		t.Fatalf("Check = %v, want the onDemand share named", err)
	}
	bad[0].Cards[0].Shares[0].Residency = Warm // warm lends: fine
	if err := Check(bad, []Accelerator{one}); err != nil {
		t.Fatalf("Check of a warm and an onDemand share: %v", err)
	}
	// onDemand and warm need a shared accelerator.
	d := s.Place(withResidency(Request{Replica: "w-0", Deployment: "w", Accelerator: "whole"}, Warm), p)
	if d.Placed() || d.Reason != `an onDemand or warm replica needs a shared accelerator: "whole" is dedicated` {
		t.Fatalf("warm on a dedicated accelerator: %v", d)
	}
}
