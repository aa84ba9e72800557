package residency_test

import (
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/node/residency"
)

// A sleeping model's residual is not evicted for lower-class demand when
// the model is likely back before it would be unloaded anyway: sending it
// cold costs its next request a load instead of a wake, whenever that
// request comes, not only within the borrower's turn. Here an interactive
// vision model bursts for 3 minutes every 15; asleep between bursts, its
// residual is all a standard request needs beyond what is free. Before the
// rule the residual went (vision was idle for minutes, so unlikely back
// within the borrower's turn of 50 s) and the next burst began with a
// cold load.
func TestResidualOfAModelBackBeforeItsUnloadIsKept(t *testing.T) {
	w := newWorld(t, card) // 24 GiB, 22.8 usable
	w.add(reserved("base", residency.Pinned, 8*gi))
	vision, tr := onDemand("vision", 14*gi) // residual 0.7 GiB
	vision.Priority = residency.Interactive
	w.add(vision, tr)
	// sql fits beside base and vision's residual only 0.4 GiB short.
	w.add(onDemand("sql", 14*gi+400<<20))
	burst := func() {
		for range 90 {
			w.request("vision", time.Second)
			w.run(2 * time.Second)
		}
	}
	for range 3 {
		burst()
		w.run(12 * time.Minute)
	}
	// vision is asleep (idle 5 minutes); a standard request arrives 7
	// minutes after the burst's end.
	burst()
	w.run(7 * time.Minute)
	if s := w.state("vision"); s != residency.Sleeping {
		t.Fatalf("vision %s 7 minutes after its burst, want Sleeping\n%s", s, w.dump())
	}
	start := w.now()
	w.request("sql", 10*time.Second)
	w.run(5 * time.Minute) // vision's next burst is due
	for _, a := range w.actions("vision", residency.ActEvict) {
		if !a.Decision.Time.Before(start) {
			t.Fatalf("vision's residual evicted for %s: %s\n%s", a.Decision.For, a.Decision.Reason, w.dump())
		}
	}
	loads := len(w.actions("vision", residency.ActLoad))
	burst()
	if got := len(w.actions("vision", residency.ActLoad)); got != loads {
		t.Fatalf("vision's burst began with a cold load, want a wake\n%s", w.dump())
	}
	w.assertClean()
}
