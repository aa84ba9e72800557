package residency_test

import (
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/node/residency"
)

// A model whose requests come in short spells keeps the card for its
// spell against a busier model of its class (burst.go): vision, asked for
// every 10 s for 90 s every 10 minutes, and coder, asked for every 2 s
// without pause, do not fit together. Without the rule coder took the card
// in every gap between vision's requests once vision had had its 8 s of
// protection from a sleep, and each of vision's next requests waited for
// its wake and for coder.
func TestShortSpellKeepsTheCardWhileItsRequestsArrive(t *testing.T) {
	w := newWorld(t, card) // 22.8 GiB usable
	coder, tr := onDemand("coder", 12*gi)
	w.add(coder, tr)
	w.add(onDemand("vision", 12*gi))
	var spellStart, spellEnd time.Time
	for i := range 3 * 300 { // 3 periods of 10 minutes, a step of 2 s
		at := time.Duration(i%300) * 2 * time.Second
		w.request("coder", 500*time.Millisecond)
		if at < 90*time.Second && i%300%5 == 0 {
			if i/300 == 2 && at == 0 {
				spellStart = w.now()
			}
			w.request("vision", time.Second)
		}
		if i/300 == 2 && at == 90*time.Second {
			spellEnd = w.now()
		}
		w.run(2 * time.Second)
	}
	w.assertClean()
	// In the third spell (vision's spells are known to be short by then)
	// vision, once on the card, stays until the spell ends.
	var up time.Time
	for _, a := range w.actions("vision", residency.ActWake, residency.ActLoad) {
		if !a.Decision.Time.Before(spellStart) && up.IsZero() {
			up = a.Decision.Time
		}
	}
	if up.IsZero() {
		t.Fatalf("vision never came back for its third spell\n%s", w.dump())
	}
	for _, a := range w.actions("vision", residency.ActSleep, residency.ActEvict, residency.ActDrain) {
		if a.Decision.Time.After(up) && a.Decision.Time.Before(spellEnd) {
			t.Fatalf("vision's short spell lost the card at %v into it: %s\n%s", a.Decision.Time.Sub(spellStart), a.Decision.Reason, w.dump())
		}
	}
	// coder waited, and was served: every request of 30 minutes but the
	// last few.
	if w.eng["coder"].served < 3*300-10 || w.eng["vision"].served != 3*9 {
		t.Fatalf("served coder %d of %d, vision %d of %d\n%s", w.eng["coder"].served, 3*300, w.eng["vision"].served, 3*9, w.dump())
	}
}

// A short spell holds the card only against a busier model: a model asked
// for less often than the spell's (a rare long answer) still gets its turn
// after waiting the minimum residency, not after the spell; waiting a
// whole spell would cost it a large share of its few requests.
func TestShortSpellDoesNotHoldAgainstARarerModel(t *testing.T) {
	w := newWorld(t, card)
	w.add(onDemand("vision", 12*gi))
	w.add(onDemand("rare", 12*gi))
	var asked time.Time
	for i := range 3 * 300 { // vision's spells as above, 2 s a step
		at := time.Duration(i%300) * 2 * time.Second
		if at < 90*time.Second && i%300%5 == 0 {
			w.request("vision", time.Second)
		}
		if i == 2*300+10 { // 20 s into vision's third spell
			asked = w.now()
			w.request("rare", 10*time.Second)
		}
		w.run(2 * time.Second)
	}
	w.assertClean()
	var in time.Time
	for _, a := range w.actions("rare", residency.ActLoad, residency.ActWake) {
		if !a.Decision.Time.Before(asked) && in.IsZero() {
			in = a.Decision.Time
		}
	}
	if in.IsZero() || in.Sub(asked) > 45*time.Second {
		t.Fatalf("rare came on the card %v after its request (vision's spell lasts 90 s), want within 45 s\n%s", in.Sub(asked), w.dump())
	}
}

// A spell that runs on past the model's usual spell holds the card no
// longer than its usual length and the other model's turn: vision's
// spells were 90 s, its third runs 170 s, and the busier coder gets the
// card back within it (the hold alone, 3 min, would have kept it out
// for the whole spell).
func TestLongerSpellHoldsOnlyItsUsualLength(t *testing.T) {
	w := newWorld(t, card)
	coder, tr := onDemand("coder", 12*gi)
	w.add(coder, tr)
	w.add(onDemand("vision", 12*gi))
	var spellStart time.Time
	for i := range 3 * 300 {
		at := time.Duration(i%300) * 2 * time.Second
		length := 90 * time.Second
		if i/300 == 2 {
			length = 170 * time.Second
		}
		w.request("coder", 500*time.Millisecond)
		if at < length && i%300%5 == 0 {
			if i/300 == 2 && at == 0 {
				spellStart = w.now()
			}
			w.request("vision", time.Second)
		}
		w.run(2 * time.Second)
	}
	w.assertClean()
	back := false
	for _, a := range w.actions("vision", residency.ActSleep, residency.ActEvict, residency.ActDrain) {
		if d := a.Decision.Time.Sub(spellStart); d > 90*time.Second && d < 170*time.Second && a.Decision.For == "coder" {
			back = true
		}
	}
	if !back {
		t.Fatalf("vision kept the card through its long third spell: coder never got a turn in it\n%s", w.dump())
	}
}
