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
