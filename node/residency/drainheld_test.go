package residency_test

import (
	"strings"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/node/residency"
)

// A drain waits for the requests the engine has, not for those that come
// while it drains (docs/residency.md, the memory ledger, I3): a draining
// engine takes no new work, so they wait at the gateway for its return.
// Here a translator asked for every second is drained for an interactive
// model; its one running request ends after 3 s and the interactive model
// is loading a few seconds later, instead of after the drain deadline
// (30 s) that the translator's new arrivals would otherwise keep the
// drain to. The translator's requests are all served once it is back.
func TestDrainDoesNotWaitForRequestsThatCameDuringIt(t *testing.T) {
	w := newWorld(t, card)
	w.add(onDemand("tr", 12*gi)) // standard
	b, tr := onDemand("b", 12*gi)
	b.Priority = residency.Interactive
	w.add(b, tr)
	w.request("tr", 2*time.Second)
	w.run(time.Minute)
	if w.state("tr") != residency.Resident {
		t.Fatalf("tr is %s, want Resident\n%s", w.state("tr"), w.dump())
	}
	w.request("tr", 3*time.Second)
	w.run(100 * time.Millisecond)
	w.request("b", 5*time.Second)
	sent := 2
	for range 10 {
		w.run(time.Second)
		w.request("tr", 2*time.Second)
		sent++
	}
	// 10 s after b's request: tr's running request ended at 3 s, its sleep
	// took 1 s, and b's load (20 s) is under way.
	if s := w.state("b"); s != residency.Loading && s != residency.Resident {
		t.Fatalf("b is %s 10 s after its request: the drain of tr waited for requests that came during it\n%s", s, w.dump())
	}
	var drained bool
	for _, a := range w.actions("tr", residency.ActSleep) {
		if a.Decision.For == "b" && strings.Contains(a.Decision.Reason, "wait at the gateway for its return") {
			drained = true
		}
	}
	if !drained {
		t.Fatalf("want tr's sleep for b to say its newer requests wait for its return\n%s", w.dump())
	}
	w.run(3 * time.Minute)
	if got := w.eng["tr"].served; got != sent {
		t.Fatalf("tr served %d of %d requests\n%s", got, sent, w.dump())
	}
	if w.eng["b"].served != 1 {
		t.Fatalf("b served %d, want 1\n%s", w.eng["b"].served, w.dump())
	}
	w.assertClean()
}
