package residency_test

import (
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/node/residency"
)

// The journal sees every decision a controller records, advised ones
// included, numbered in order, and wakes followers.
func TestJournalSyncsAdvisedDecisionsAndWakesFollowers(t *testing.T) {
	clock := residency.NewManualClock(time.Unix(1_700_000_000, 0))
	cfg := card
	cfg.Mode = residency.Advise
	cfg.MaxDecisions = 4
	c, err := residency.New(cfg, clock)
	if err != nil {
		t.Fatal(err)
	}
	j := residency.NewJournal("n1", 3)
	seen := 0
	_, changed := j.Decisions(0)
	for _, m := range []residency.ModelID{"a", "b"} {
		d, _ := onDemand(string(m), 10*gi)
		if out := c.Handle(residency.DeploymentAdded{Deployment: d}); out.Err != nil {
			t.Fatal(out.Err)
		}
		out := c.Handle(residency.RequestArrived{Model: m})
		if len(out.Actions) != 0 {
			t.Fatalf("advise mode returned actions %v", out.Actions)
		}
		seen = j.Sync(c, seen)
	}
	select {
	case <-changed:
	default:
		t.Fatal("a follower was not woken by a recorded decision")
	}
	ds, _ := j.Decisions(0)
	if len(ds) == 0 {
		t.Fatal("no decision reached the journal in advise mode")
	}
	for i, d := range ds {
		if !d.Advised || d.Node != "n1" || (i > 0 && d.Seq != ds[i-1].Seq+1) {
			t.Fatalf("decision %d = %+v: want advised, node n1, consecutive numbers", i, d)
		}
	}
	last := ds[len(ds)-1].Seq
	if more, _ := j.Decisions(last); len(more) != 0 {
		t.Fatalf("Decisions(%d) = %v, want none newer", last, more)
	}
	j.SetCard(residency.CardView{Card: "gpu0", Mode: "advise", Plan: c.Plan()}, c.Profiles())
	if cs := j.Cards(); len(cs) != 1 || cs[0].Node != "n1" || len(cs[0].Plan) != 2 {
		t.Fatalf("cards = %+v, want gpu0 on n1 with a plan for both models", cs)
	}
}
