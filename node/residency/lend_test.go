package residency_test

import (
	"strings"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/node/residency"
)

// A background request does not put a busy interactive service to sleep in
// the gaps between its requests (the service is back within seconds and
// would wait for its own memory); it gets the memory once the service goes
// quiet.
func TestBackgroundWaitsForAQuietSpellOfAHigherClass(t *testing.T) {
	w := newWorld(t, card)
	coder, tr := reserved("coder", residency.Warm, 12*gi)
	coder.Priority = residency.Interactive
	w.add(coder, tr)
	batch, tr := onDemand("batch", 14*gi) // fits only in memory coder lends
	batch.Priority = residency.Background
	w.add(batch, tr)
	w.run(time.Minute)
	// Five minutes of coder traffic: a 500 ms request every 2 s, so coder
	// is idle three quarters of the time. A batch request waits meanwhile.
	for i := range 150 {
		w.request("coder", 500*time.Millisecond)
		if i == 10 {
			w.request("batch", 20*time.Second)
		}
		w.run(2 * time.Second)
	}
	for _, a := range w.actions("coder", residency.ActSleep) {
		t.Fatalf("coder put to sleep at %v (%s) while its requests kept coming\n%s", a.Decision.Time.Sub(w.actions("")[0].Decision.Time), a.Decision.Reason, w.dump())
	}
	if w.eng["batch"].served != 0 || w.eng["coder"].served != 150 {
		t.Fatalf("served batch=%d coder=%d during coder's busy spell, want 0 and 150\n%s", w.eng["batch"].served, w.eng["coder"].served, w.dump())
	}
	// Coder goes quiet: batch borrows its memory and runs.
	w.run(2 * time.Minute)
	if w.eng["batch"].served != 1 {
		t.Fatalf("batch served %d once coder went quiet, want 1\n%s", w.eng["batch"].served, w.dump())
	}
	sleeps := w.actions("coder", residency.ActSleep)
	if len(sleeps) != 1 || sleeps[0].Decision.For != "batch" {
		t.Fatalf("coder sleeps %v, want one, for batch\n%s", kinds(sleeps), w.dump())
	}
	// And coder takes it back when asked.
	w.request("coder", 500*time.Millisecond)
	w.run(time.Minute)
	w.assertClean()
	if w.eng["coder"].served != 151 {
		t.Fatalf("coder served %d, want 151\n%s", w.eng["coder"].served, w.dump())
	}
}

// Memory is freed with the fewest victims that suffice: a cheap model taken
// first is given back when the next one alone frees enough.
func TestOnlyTheVictimsNeededAreTaken(t *testing.T) {
	w := newWorld(t, card)
	w.add(onDemand("small", 1*gi)) // rarely used: the cheapest per GiB
	w.add(onDemand("big", 12*gi))
	w.add(onDemand("new", 12*gi)) // 9.8 GiB free: 2.2 GiB short
	w.request("small", time.Second)
	for range 20 {
		w.request("big", time.Second)
		w.run(3 * time.Second)
	}
	w.run(time.Minute)
	if w.state("small") != residency.Resident || w.state("big") != residency.Resident {
		t.Fatalf("small %s, big %s; want both resident before new arrives\n%s", w.state("small"), w.state("big"), w.dump())
	}
	w.request("new", 5*time.Second)
	w.run(time.Minute)
	w.assertClean()
	if got := w.actions("small", residency.ActSleep, residency.ActEvict, residency.ActDrain); len(got) != 0 {
		t.Fatalf("small got %v: sleeping big alone frees enough for new\n%s", kinds(got), w.dump())
	}
	if w.eng["new"].served != 1 {
		t.Fatalf("new served %d, want 1\n%s", w.eng["new"].served, w.dump())
	}
}

// A background job that keeps evicting an interactive assistant in what
// look like its quiet spells, only for the assistant to be asked for again
// each time and pay a cold load, evicts it no more: after ThrashCount such
// returns in the window the controller records a protect decision, and the
// assistant stays on the card, where it would otherwise have been evicted
// and cold-loaded again every cycle.
func TestInteractiveProtectedFromBackgroundThatKeepsEvictingIt(t *testing.T) {
	w := newWorld(t, card)
	asst, tr := onDemand("assistant", 12*gi)
	asst.Priority, asst.CanSleep = residency.Interactive, false
	w.add(asst, tr)
	batch, tr := onDemand("batch", 14*gi) // never fits beside the assistant
	batch.Priority, batch.CanSleep = residency.Background, false
	w.add(batch, tr)
	w.run(time.Minute)
	// An assistant request every 2 minutes for 20 minutes; batch always
	// has work.
	for range 10 {
		w.request("assistant", time.Second)
		w.request("batch", 20*time.Second)
		w.run(2 * time.Minute)
	}
	w.assertClean()
	prot := w.actions("assistant", residency.ActProtect)
	if len(prot) != 1 {
		t.Fatalf("%d protect decisions for the assistant, want 1\n%s", len(prot), w.dump())
	}
	d := prot[0].Decision
	if prot[0].Peer != "batch" || d.For != "batch" || !strings.Contains(d.Reason, "protect assistant from batch") ||
		!strings.Contains(d.Reason, "asked for again 3 times") {
		t.Fatalf("protect decision: peer %q, for %q, reason %q", prot[0].Peer, d.For, d.Reason)
	}
	var before, after int
	for _, a := range w.actions("assistant", residency.ActEvict) {
		if a.Decision.For != "batch" {
			continue
		}
		if a.Decision.Time.Before(d.Time) {
			before++
		} else {
			after++
		}
	}
	if before < 3 || after != 0 {
		t.Fatalf("assistant evicted for batch %d times before the protect decision and %d after, want ≥ 3 and 0\n%s", before, after, w.dump())
	}
	if w.eng["assistant"].served != 10 || w.eng["batch"].served == 0 {
		t.Fatalf("served assistant=%d batch=%d, want 10 and some\n%s", w.eng["assistant"].served, w.eng["batch"].served, w.dump())
	}
}
