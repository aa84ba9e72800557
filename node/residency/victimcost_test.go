package residency_test

import (
	"strings"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/node/residency"
)

// A busy victim's value counts what stopping it costs its requests
// (docs/residency.md, the controller): a drain's deadline for the work it
// cuts short, which for background work stopped for a higher class is
// nothing (it is cut off at once and runs again in its next turn). Here an
// interactive vision request needs the memory of an idle interactive chat
// (asked for every 10 s) or of a batch job with four long requests
// running: the batch goes, and chat keeps the card.
func TestBackgroundWorkIsTheCheaperVictimForAHigherClass(t *testing.T) {
	w := newWorld(t, card)
	chat, tr := onDemand("chat", 10*gi)
	chat.Priority = residency.Interactive
	w.add(chat, tr)
	vision, tr := onDemand("vision", 10*gi)
	vision.Priority = residency.Interactive
	w.add(vision, tr)
	batch, tr := onDemand("batch", 10*gi)
	batch.Priority = residency.Background
	w.add(batch, tr)
	for range 4 {
		w.request("batch", 10*time.Minute)
	}
	for range 18 {
		w.request("chat", time.Second)
		w.run(10 * time.Second)
	}
	if w.state("chat") != residency.Resident || w.state("batch") != residency.Resident {
		t.Fatalf("chat %s, batch %s: want both resident\n%s", w.state("chat"), w.state("batch"), w.dump())
	}
	w.request("vision", 5*time.Second)
	w.run(5 * time.Second)
	if n := len(w.actions("chat", residency.ActSleep, residency.ActEvict, residency.ActDrain)); n != 0 {
		t.Fatalf("chat, idle between requests every 10 s, was taken off the card for vision (%d actions) while batch work was running\n%s", n, w.dump())
	}
	var cut bool
	for _, a := range w.actions("batch", residency.ActDrain, residency.ActSleep) {
		if a.Decision.For == "vision" && strings.Contains(a.Decision.Reason, "does not wait behind") {
			cut = true
		}
	}
	if !cut {
		t.Fatalf("want batch cut off for vision\n%s", w.dump())
	}
	w.run(time.Minute)
	if w.eng["vision"].served != 1 {
		t.Fatalf("vision served %d, want 1\n%s", w.eng["vision"].served, w.dump())
	}
	w.assertClean()
}

// Cancelling a load or wake in progress makes the requests waiting for it
// wait its whole reload again: a waking victim's value counts that, not a
// drain's deadline. Here an interactive request needs the memory of a
// translator waking for one request (its cold load 70 s) or of an idle sql
// model asked for every 3 s (its wake 10 s): the sql model sleeps, and the
// translator's wake goes on.
func TestAWakeIsCancelledOnlyWhereItCostsLess(t *testing.T) {
	cfg := card
	cfg.IdleSleep = time.Minute
	w := newWorld(t, cfg)
	tr, trt := onDemand("tr", 10*gi)
	tr.LoadTime, trt.load = 70*time.Second, 70*time.Second
	w.add(tr, trt)
	sql, sqlt := onDemand("sql", 10*gi)
	sql.WakeTime, sqlt.wake = 10*time.Second, 10*time.Second
	w.add(sql, sqlt)
	vision, vt := onDemand("vision", 10*gi)
	vision.Priority = residency.Interactive
	w.add(vision, vt)
	w.request("tr", time.Second)
	for range 80 {
		w.request("sql", 500*time.Millisecond)
		w.run(3 * time.Second)
	}
	if w.state("tr") != residency.Sleeping || w.state("sql") != residency.Resident {
		t.Fatalf("tr %s, sql %s: want tr asleep, sql resident\n%s", w.state("tr"), w.state("sql"), w.dump())
	}
	w.request("tr", time.Second)
	w.request("vision", time.Second)
	w.run(time.Second)
	if n := len(w.actions("tr", residency.ActEvict)); n != 0 {
		t.Fatalf("tr's wake was cancelled (a 70 s load for its request) where sleeping sql costs a 10 s wake\n%s", w.dump())
	}
	var slept bool
	for _, a := range w.actions("sql", residency.ActSleep, residency.ActDrain) {
		slept = slept || a.Decision.For == "vision"
	}
	if !slept {
		t.Fatalf("want sql put to sleep for vision\n%s", w.dump())
	}
	w.run(time.Minute)
	if w.eng["vision"].served != 1 || w.eng["tr"].served != 2 {
		t.Fatalf("served vision %d, tr %d: want 1 and 2\n%s", w.eng["vision"].served, w.eng["tr"].served, w.dump())
	}
	w.assertClean()
}
