package residency_test

import (
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/node/residency"
)

// Memory freed for a model that waits goes to it, not to a model whose
// requests came after: vision waits for coder's sleep, coder is asked for
// again while it goes to sleep, and vision keeps being asked for. Ordered
// by last use (vision's newest requests), coder woke into the memory its
// sleep freed for vision.
func TestMemoryFreedForAWaitingModelGoesToIt(t *testing.T) {
	w := newWorld(t, card)
	w.add(onDemand("coder", 12*gi))
	w.add(onDemand("vision", 12*gi))
	w.request("coder", time.Second)
	w.run(2 * time.Minute) // coder resident, idle, past its protection
	w.request("vision", time.Second)
	sleeps := w.actions("coder", residency.ActSleep)
	if len(sleeps) != 1 || sleeps[0].Decision.For != "vision" {
		t.Fatalf("coder sleeps %v, want one, for vision\n%s", kinds(sleeps), w.dump())
	}
	w.run(200 * time.Millisecond)
	w.request("coder", time.Second)
	w.run(300 * time.Millisecond)
	w.request("vision", time.Second)
	w.run(time.Minute)
	w.assertClean()
	var first residency.ModelID
	for _, a := range w.actions("") {
		if (a.Kind == residency.ActLoad || a.Kind == residency.ActWake) && a.Decision.Time.After(sleeps[0].Decision.Time) {
			first = a.Model
			break
		}
	}
	if first != "vision" {
		t.Fatalf("after coder's sleep for vision, %s came on the card first, want vision\n%s", first, w.dump())
	}
}
