package residency_test

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/node/residency"
)

// A 24 GiB card (usable 22.8 GiB with the default 5 % headroom).
var card = residency.Config{Card: "gpu0", Memory: 24 * gi}

func onDemand(name string, size int64) (residency.Deployment, truth) {
	return residency.Deployment{
			Model: residency.ModelID(name), Residency: residency.OnDemand, Priority: residency.Standard,
			Share: size, Footprint: size, Residual: size / 20, CanSleep: true,
			LoadTime: 20 * time.Second, WakeTime: 2 * time.Second, Engine: "sim", Device: "l4",
		}, truth{foot: size, peak: size, residual: size / 20,
			load: 20 * time.Second, wake: 2 * time.Second, sleep: time.Second, stopDur: time.Second}
}

func reserved(name string, r residency.Residency, share int64) (residency.Deployment, truth) {
	d, tr := onDemand(name, share)
	d.Residency = r
	return d, tr
}

func TestPinnedNeverUnloadedAndItsShareNeverUsed(t *testing.T) {
	w := newWorld(t, card)
	w.add(reserved("pinned", residency.Pinned, 8*gi))
	for _, m := range []string{"a", "b", "c"} {
		w.add(onDemand(m, 10*gi))
	}
	w.run(time.Minute)
	for round := 0; round < 4; round++ {
		for _, m := range []residency.ModelID{"a", "b", "c"} {
			w.request(m, 5*time.Second)
			w.run(time.Minute)
		}
	}
	w.run(10 * time.Minute)
	w.assertClean()
	if n := len(w.actions("", residency.ActSerialize)); n != 0 {
		t.Fatalf("%d serialize decisions for a rotation of three models (no pair evicts each other)\n%s", n, w.dump())
	}
	if got := w.actions("pinned"); len(got) != 1 || got[0].Kind != residency.ActLoad {
		t.Fatalf("pinned got actions %v, want only its first load\n%s", kinds(got), w.dump())
	}
	if w.state("pinned") != residency.Resident {
		t.Fatalf("pinned is %s, want Resident", w.state("pinned"))
	}
	if limit := w.usable - 8*gi; w.maxNonPinned > limit {
		t.Fatalf("non-pinned engines held %d MiB at once, more than usable − pinned share = %d MiB", w.maxNonPinned>>20, limit>>20)
	}
	for _, m := range []residency.ModelID{"a", "b", "c"} {
		if w.eng[m].served != 4 {
			t.Fatalf("%s served %d requests, want 4\n%s", m, w.eng[m].served, w.dump())
		}
	}
	// The ones that made room explain it in numbers.
	re := regexp.MustCompile(`^(sleep|evict) [abc]: value [0-9.]+ < [abc] [0-9.]+; frees [0-9.]+Gi, [abc] needs [0-9.]+Gi \([0-9.]+[GM]i short\)$`)
	pressure := w.actions("", residency.ActSleep, residency.ActEvict)
	found := false
	for _, a := range pressure {
		if a.Decision.For != "" {
			found = true
			if !re.MatchString(a.Decision.Reason) || a.Decision.Trigger != residency.TriggerRequest {
				t.Fatalf("eviction decision %q (trigger %s) does not give its numbers", a.Decision.Reason, a.Decision.Trigger)
			}
		}
	}
	if !found {
		t.Fatalf("no eviction for memory happened; the scenario does not exercise pressure\n%s", w.dump())
	}
}

func TestWarmLentWhileAsleepAndWokenWhenRequested(t *testing.T) {
	cfg := card
	cfg.IdleSleep = 2 * time.Minute
	w := newWorld(t, cfg)
	w.add(reserved("warm", residency.Warm, 12*gi))
	w.add(onDemand("big", 14*gi)) // fits only in memory the warm model lends
	w.run(3 * time.Minute)
	if s := w.state("warm"); s != residency.Sleeping {
		t.Fatalf("idle warm model is %s, want Sleeping\n%s", s, w.dump())
	}
	w.request("big", 10*time.Second)
	w.run(time.Minute)
	if s := w.state("big"); s != residency.Resident || w.eng["big"].served != 1 {
		t.Fatalf("big is %s with %d served; it should run in the lent memory\n%s", s, w.eng["big"].served, w.dump())
	}
	w.request("warm", 5*time.Second)
	w.run(time.Minute)
	w.assertClean()
	if w.eng["warm"].served != 1 {
		t.Fatalf("warm served %d, want 1\n%s", w.eng["warm"].served, w.dump())
	}
	got := kinds(w.actions("warm"))
	if strings.Join(got, " ") != "load sleep wake" {
		t.Fatalf("warm actions %v, want load sleep wake (it wakes, never cold-loads)\n%s", got, w.dump())
	}
	// The borrower left first, for the owner.
	var demote, wake int = -1, -1
	for i, a := range w.acts {
		if a.Model == "big" && (a.Kind == residency.ActSleep || a.Kind == residency.ActEvict) && a.Decision.For == "warm" {
			demote = i
		}
		if a.Model == "warm" && a.Kind == residency.ActWake {
			wake = i
		}
	}
	if demote < 0 || wake < demote {
		t.Fatalf("borrower demoted at %d, owner woken at %d; the borrower must leave first\n%s", demote, wake, w.dump())
	}
}

func TestBusyEngineGivesEqualPriorityATurn(t *testing.T) {
	// a keeps the card busy with one long request; b, of a's class, cannot
	// fit beside it. b waits its starveAfter (the minimum residency, 30 s)
	// and a keeps its protection (twice its load time); then b takes its
	// turn: a is drained (its request runs the drain deadline), the pair is
	// serialized, and b is served instead of waiting for ever.
	w := newWorld(t, card)
	w.add(onDemand("a", 12*gi))
	w.add(onDemand("b", 12*gi))
	w.request("a", 10*time.Minute)
	w.run(time.Minute)
	w.request("b", 10*time.Second)
	w.run(20 * time.Second)
	if s := w.state("a"); s != residency.Resident || w.state("b") != residency.Cold {
		t.Fatalf("a is %s, b %s: b must first wait its turn\n%s", s, w.state("b"), w.dump())
	}
	if got := w.actions("a", residency.ActSleep, residency.ActEvict, residency.ActDrain); len(got) != 0 {
		t.Fatalf("busy a got %v before b waited its turn\n%s", kinds(got), w.dump())
	}
	// The plan says when b gets the card at the latest, and it does.
	var by time.Time
	for _, e := range w.c.Plan() {
		if e.Model == "b" {
			by = e.SlotBy
			if by.IsZero() || !by.After(w.now()) || !strings.Contains(e.Reason, "gets the card by") {
				t.Fatalf("plan for waiting b: slot by %v, reason %q", by, e.Reason)
			}
		}
	}
	for w.now().Before(by) && w.state("b") != residency.Resident {
		w.run(time.Second)
	}
	if w.state("b") != residency.Resident {
		t.Fatalf("b is %s at %v, past the plan's bound\n%s", w.state("b"), by, w.dump())
	}
	w.run(2 * time.Minute)
	w.assertClean()
	drains := w.actions("a", residency.ActDrain)
	if len(drains) != 1 || !strings.Contains(drains[0].Decision.Reason, "had its turn") || drains[0].Decision.Trigger != residency.TriggerTurn ||
		len(w.actions("b", residency.ActSerialize)) != 1 {
		t.Fatalf("want one drain of a for b's turn and a serialize decision\n%s", w.dump())
	}
	if w.eng["b"].served != 1 {
		t.Fatalf("b served %d, want 1\n%s", w.eng["b"].served, w.dump())
	}
}

// A busy engine is drained only for higher-priority demand: interactive
// demand lets standard requests run up to the drain deadline; interactive
// and standard demand cut background requests off at once (docs/gateway.md:
// they never wait behind background work on the same card).
func TestHigherPriorityDrainsBusyEngine(t *testing.T) {
	for _, tc := range []struct {
		victim  residency.Priority
		prio    residency.Priority
		atLeast time.Duration
		within  time.Duration
	}{
		{residency.Standard, residency.Interactive, 30 * time.Second, time.Hour},
		{residency.Background, residency.Standard, 0, 2 * time.Second},
		{residency.Background, residency.Interactive, 0, 2 * time.Second},
	} {
		t.Run(tc.victim.String()+"-for-"+tc.prio.String(), func(t *testing.T) {
			w := newWorld(t, card)
			bg, tr := onDemand("batch", 12*gi)
			bg.Priority = tc.victim
			w.add(bg, tr)
			chat, tr := onDemand("chat", 12*gi)
			chat.Priority = tc.prio
			w.add(chat, tr)
			w.request("batch", 20*time.Second)
			w.request("batch", 10*time.Minute)
			w.run(time.Minute)
			w.request("chat", 5*time.Second)
			w.run(2 * time.Minute)
			w.assertClean()
			drains := w.actions("batch", residency.ActDrain)
			if len(drains) != 1 || drains[0].Decision.For != "chat" || drains[0].Decision.Trigger != residency.TriggerRequest {
				t.Fatalf("want one drain of batch for chat, got %v\n%s", kinds(drains), w.dump())
			}
			if w.eng["chat"].served != 1 || w.eng["batch"].served != 1 {
				t.Fatalf("served chat=%d batch=%d, want 1 each (the long batch request is cut off)\n%s",
					w.eng["chat"].served, w.eng["batch"].served, w.dump())
			}
			var drainAt, stopAt time.Time
			for _, a := range w.acts {
				switch {
				case a.Model == "batch" && a.Kind == residency.ActDrain:
					drainAt = a.Decision.Time
				case a.Model == "batch" && (a.Kind == residency.ActSleep || a.Kind == residency.ActEvict) && stopAt.IsZero() && !drainAt.IsZero():
					stopAt = a.Decision.Time
				}
			}
			if d := stopAt.Sub(drainAt); d < tc.atLeast || d > tc.within {
				t.Fatalf("batch stopped %v after its drain, want between %v and %v\n%s", d, tc.atLeast, tc.within, w.dump())
			}
		})
	}
}

func TestThrashingPairIsSerialized(t *testing.T) {
	w := newWorld(t, card)
	for _, m := range []string{"a", "b"} {
		d, tr := onDemand(m, 12*gi)
		d.CanSleep = false // each swap is a cold load of 20s
		w.add(d, tr)
	}
	for i := 0; i < 12; i++ {
		w.request("a", 5*time.Second)
		w.run(50 * time.Second)
		w.request("b", 5*time.Second)
		w.run(50 * time.Second)
	}
	w.run(5 * time.Minute)
	w.assertClean()
	ser := w.actions("", residency.ActSerialize)
	if len(ser) != 1 {
		t.Fatalf("want one serialize decision, got %d\n%s", len(ser), w.dump())
	}
	d := ser[0].Decision
	pair := []string{string(ser[0].Model), string(ser[0].Peer)}
	if !(pair[0] == "a" && pair[1] == "b" || pair[0] == "b" && pair[1] == "a") ||
		!strings.Contains(d.Reason, "evicted each other 3 times") || !strings.Contains(d.Reason, "1m20s per turn") {
		t.Fatalf("serialize decision %v %q", pair, d.Reason)
	}
	// After it, each turn lasts a slot: evictions are at least 80s apart.
	var last time.Time
	for _, a := range w.actions("", residency.ActEvict) {
		if a.Decision.Time.Before(d.Time) {
			continue
		}
		if !last.IsZero() && a.Decision.Time.Sub(last) < 80*time.Second {
			t.Fatalf("evictions %v apart after serializing, want ≥ 80s\n%s", a.Decision.Time.Sub(last), w.dump())
		}
		last = a.Decision.Time
	}
	if last.IsZero() {
		t.Fatalf("no eviction after serializing\n%s", w.dump())
	}
}

func TestPrewarmBeforePredictedArrival(t *testing.T) {
	cfg := card
	cfg.IdleSleep = 2 * time.Minute
	w := newWorld(t, cfg)
	d, tr := onDemand("report", 10*gi)
	d.CanSleep = false
	w.add(d, tr)
	w.run(time.Minute)
	for i := 0; i < 3; i++ {
		w.request("report", 5*time.Second)
		if i < 2 {
			w.run(10 * time.Minute)
		}
	}
	w.run(9 * time.Minute)
	// Before the prewarm window the plan predicts the next request and
	// has nothing to do yet.
	if p := w.c.Plan(); p[0].NextRequest.Sub(epoch) != 31*time.Minute || p[0].Action != 0 || p[0].Tier != "disk" {
		t.Fatalf("plan at %v: %+v, want next request at 31m, nothing to do, on disk", w.now().Sub(epoch), p[0])
	}
	w.run(time.Minute - time.Second)
	// Two gaps seen: the next request is due at 31m; a 20s load is started
	// early enough that it finds the model resident.
	if s := w.state("report"); s != residency.Resident {
		t.Fatalf("at the predicted arrival report is %s, want Resident\n%s", s, w.dump())
	}
	pre := w.actions("report", residency.ActPrewarm)
	if len(pre) != 1 || pre[0].Decision.Trigger != residency.TriggerForecast {
		t.Fatalf("want one prewarm by forecast, got %v\n%s", kinds(pre), w.dump())
	}
	if at := pre[0].Decision.Time.Sub(epoch); at < 30*time.Minute || at > 31*time.Minute-20*time.Second {
		t.Fatalf("prewarm at %v, want within the minute before the predicted 31m and ≥ load time ahead", at)
	}
	w.request("report", 5*time.Second)
	w.run(time.Minute)
	w.assertClean()
	if n := len(w.actions("report", residency.ActLoad)); n != 3 {
		t.Fatalf("%d cold loads on request, want 3 (the fourth request found it prewarmed)\n%s", n, w.dump())
	}
}

func TestAdviseModeExecutesNothing(t *testing.T) {
	cfg := card
	cfg.Mode = residency.Advise
	w := newWorld(t, cfg)
	w.add(reserved("pinned", residency.Pinned, 8*gi))
	w.add(onDemand("a", 10*gi))
	w.request("a", 5*time.Second)
	w.run(2 * time.Minute)
	if len(w.acts) != 0 {
		t.Fatalf("advise mode returned actions %v", kinds(w.acts))
	}
	if w.state("a") != residency.Cold || w.state("pinned") != residency.Cold {
		t.Fatalf("advise mode changed states: a %s pinned %s", w.state("a"), w.state("pinned"))
	}
	var got []string
	for _, d := range w.c.Decisions() {
		if !d.Advised {
			t.Fatalf("decision %q not marked advised", d.Reason)
		}
		got = append(got, d.Action.String()+" "+string(d.Model))
	}
	if strings.Join(got, ", ") != "load pinned, load a" {
		t.Fatalf("advised decisions %v, want each load once", got)
	}
	plan := w.c.Plan()
	if len(plan) != 2 || plan[0].Model != "a" || plan[0].Action != residency.ActLoad || plan[0].Tier != "disk" || plan[0].Rate <= 0 {
		t.Fatalf("plan %+v, want a with a load, on disk, with a rate", plan)
	}
	// The node loads the pinned model as it always did; the controller
	// follows what it reports.
	w.send(residency.LoadDone{Model: "pinned"})
	w.flush()
	if w.state("pinned") != residency.Resident || len(w.acts) != 0 {
		t.Fatalf("after the node's own load: pinned %s, actions %v", w.state("pinned"), kinds(w.acts))
	}
	if p := w.c.Plan(); p[1].Model != "pinned" || p[1].Action != 0 || p[1].Tier != "gpu" {
		t.Fatalf("plan for the resident pinned model %+v, want nothing to do", p[1])
	}
}

func TestRejectWhatCanNeverFit(t *testing.T) {
	w := newWorld(t, card)
	w.add(reserved("pinned", residency.Pinned, 16*gi))
	w.add(onDemand("big", 10*gi))
	w.run(time.Minute)
	w.request("big", time.Second)
	w.run(time.Minute)
	w.assertClean()
	rej := w.actions("big", residency.ActReject)
	if len(rej) != 1 || !strings.Contains(rej[0].Decision.Reason, "needs 10.0Gi, at most 6.8Gi of card gpu0 can be made free") {
		t.Fatalf("want one reject naming the numbers, got %v\n%s", rej, w.dump())
	}
	if s := w.state("big"); s != residency.Cold {
		t.Fatalf("big is %s", s)
	}
}

func TestEngineWithoutSleepFallsBackToUnload(t *testing.T) {
	w := newWorld(t, card)
	for _, m := range []string{"a", "b"} {
		d, tr := onDemand(m, 12*gi)
		d.CanSleep = false
		w.add(d, tr)
	}
	for i := 0; i < 3; i++ {
		w.request("a", time.Second)
		w.run(2 * time.Minute)
		w.request("b", time.Second)
		w.run(2 * time.Minute)
	}
	w.assertClean()
	if n := len(w.actions("", residency.ActSleep, residency.ActWake)); n != 0 {
		t.Fatalf("%d sleep/wake actions for engines that cannot sleep", n)
	}
	if n := len(w.actions("", residency.ActEvict)); n < 5 {
		t.Fatalf("%d evictions, want one per swap\n%s", n, w.dump())
	}
}

func TestProfilerLearnsFromObservations(t *testing.T) {
	w := newWorld(t, card)
	d, tr := onDemand("m", 12*gi) // declared 12 GiB, 20s load, 2s wake
	tr.foot, tr.peak, tr.residual = 9*gi, 10*gi, gi/2
	tr.load, tr.wake = 31*time.Second, 3*time.Second
	d.Quantization = "fp8"
	w.add(d, tr)
	w.add(onDemand("other", 14*gi))
	w.request("m", 4*time.Second)
	w.run(2 * time.Minute)
	w.request("other", time.Second) // pushes m to sleep
	w.run(2 * time.Minute)
	w.request("m", 4*time.Second) // wakes it
	w.run(time.Minute)
	w.assertClean()
	var p *residency.Profile
	for _, x := range w.c.Profiles() {
		if x.Key == (residency.ProfileKey{Model: "m", Quantization: "fp8", Engine: "sim", Device: "l4"}) {
			p = &x
		}
	}
	if p == nil {
		t.Fatalf("no profile for m: %+v", w.c.Profiles())
	}
	if p.LoadTime != 31*time.Second || p.WakeTime != 3*time.Second || p.Footprint != 9*gi || p.Residual != gi/2 ||
		p.TokensPerSecond != 25 || p.Loads != 1 || p.Wakes != 1 {
		t.Fatalf("profile %+v, want load 31s, wake 3s, footprint 9Gi, residual 512Mi, 25 tok/s", *p)
	}
}

func TestBadInputIsRefusedAndChangesNothing(t *testing.T) {
	if _, err := residency.New(residency.Config{}, residency.NewManualClock(epoch)); err == nil || !strings.Contains(err.Error(), "memory") {
		t.Fatalf("config without memory: %v", err)
	}
	w := newWorld(t, card)
	for _, tc := range []struct {
		d    residency.Deployment
		want string
	}{
		{residency.Deployment{Share: gi}, "model: must not be empty"},
		{residency.Deployment{Model: "x"}, "share: must be > 0"},
		{residency.Deployment{Model: "x", Share: gi, Residency: 7}, "residency: unknown value"},
		{residency.Deployment{Model: "x", Share: gi, Priority: 9}, "priority: unknown value"},
		{residency.Deployment{Model: "x", Share: gi, LoadTime: -1}, "loadTime"},
	} {
		out := w.c.Handle(residency.DeploymentAdded{Deployment: tc.d})
		if out.Err == nil || !strings.Contains(out.Err.Error(), tc.want) {
			t.Fatalf("%+v: err %v, want %q", tc.d, out.Err, tc.want)
		}
	}
	if len(w.c.Ledger().Entries) != 0 {
		t.Fatalf("refused deployments were stored: %+v", w.c.Ledger().Entries)
	}
}

func TestLedgerViolationDropsCardToPinnedOnly(t *testing.T) {
	w := newWorld(t, card)
	w.add(reserved("pinned", residency.Pinned, 8*gi))
	w.add(onDemand("a", 10*gi))
	w.add(onDemand("b", 4*gi))
	w.request("a", time.Second)
	w.run(time.Minute)
	w.assertClean()
	// The engine of a reports far more than it may hold: the card is over.
	out := w.c.Handle(residency.MemorySample{Model: "a", Bytes: 16 * gi})
	if len(out.Violations) == 0 || out.Violations[0].Invariant != "I1" || len(out.Violations[0].Ledger.Entries) != 3 ||
		!strings.Contains(out.Violations[0].Error(), "exceed usable") {
		t.Fatalf("violations %v, want I1 with the ledger", out.Violations)
	}
	if !w.c.PinnedOnly() || w.c.ViolationCount() == 0 {
		t.Fatalf("pinned-only %v, count %d", w.c.PinnedOnly(), w.c.ViolationCount())
	}
	// The fallback already takes the idle onDemand model off the card.
	if len(out.Actions) != 1 || out.Actions[0].Kind != residency.ActEvict && out.Actions[0].Kind != residency.ActSleep ||
		out.Actions[0].Model != "a" {
		t.Fatalf("pinned-only fallback actions %v, want a sleep or eviction of a", out.Actions)
	}
	w.ctrlViolations = nil
	for _, a := range out.Actions {
		w.acts = append(w.acts, a)
		w.exec(a)
	}
	w.request("b", time.Second)
	w.run(time.Minute)
	if rej := w.actions("b", residency.ActReject); len(rej) != 1 || !strings.Contains(rej[0].Decision.Reason, "pinned-only") {
		t.Fatalf("onDemand request on a pinned-only card: %v", kinds(w.actions("b")))
	}
	w.send(residency.ClearViolations{})
	w.request("b", time.Second)
	w.run(time.Minute)
	if w.c.PinnedOnly() || w.eng["b"].served != 1 {
		t.Fatalf("after the operator cleared it: pinned-only %v, b served %d\n%s", w.c.PinnedOnly(), w.eng["b"].served, w.dump())
	}
}

func kinds(acts []residency.Action) []string {
	var out []string
	for _, a := range acts {
		out = append(out, a.Kind.String())
	}
	return out
}

func TestPromiseGrowingUnderABorrowerTakesItsShareBack(t *testing.T) {
	w := newWorld(t, card)
	m, tr := onDemand("m", 10*gi)
	tr.foot, tr.peak = 6*gi, 6*gi // measured: it holds less than its share
	w.add(m, tr)
	w.add(onDemand("a", 14*gi))
	w.request("m", time.Second)
	w.request("a", 5*time.Minute)
	w.run(time.Minute)
	if w.state("m") != residency.Resident || w.state("a") != residency.Resident {
		t.Fatalf("m %s, a %s: both should fit (6 + 14 GiB)\n%s", w.state("m"), w.state("a"), w.dump())
	}
	// m becomes warm: its 10 GiB share is now promised, 1.2 GiB more than
	// a leaves. a is busy, so it is drained for m, then put to sleep.
	m.Residency = residency.Warm
	w.change(m)
	w.run(time.Minute)
	w.assertClean()
	drains := w.actions("a", residency.ActDrain)
	if len(drains) != 1 || drains[0].Decision.For != "m" || drains[0].Decision.Trigger != residency.TriggerOwnerReturn ||
		!strings.Contains(drains[0].Decision.Reason, "returns 1.2Gi of m's reserved share") {
		t.Fatalf("want a drained for m's share by its owner's return, got %v\n%s", kinds(w.actions("a")), w.dump())
	}
	if s := w.state("a"); s != residency.Sleeping {
		t.Fatalf("a is %s after the drain deadline, want Sleeping\n%s", s, w.dump())
	}
}

// TestVariantsAreProfiledApart: two deployments of the same weights in
// different quantizations learn apart (each its own footprint and load
// time); a third replica of one of them shares that variant's profile and
// starts from what it learned.
func TestVariantsAreProfiledApart(t *testing.T) {
	w := newWorld(t, card)
	fp8, tr8 := onDemand("chat-fp8/0", 8*gi)
	fp8.Weights, fp8.Quantization = "/models/llama", "fp8"
	tr8.foot, tr8.peak, tr8.load = 6*gi, 6*gi, 11*time.Second
	bf16, tr16 := onDemand("chat-bf16/0", 16*gi)
	bf16.Weights, bf16.Quantization = "/models/llama", "bf16"
	tr16.foot, tr16.peak, tr16.load = 14*gi, 14*gi, 23*time.Second
	w.add(fp8, tr8)
	w.add(bf16, tr16)
	w.request("chat-fp8/0", time.Second)
	w.request("chat-bf16/0", time.Second)
	w.run(2 * time.Minute)
	w.assertClean()
	ps := w.c.Profiles()
	if len(ps) != 2 {
		t.Fatalf("%d profiles, want one per variant: %+v", len(ps), ps)
	}
	want := map[string]struct {
		foot int64
		load time.Duration
	}{"bf16": {14 * gi, 23 * time.Second}, "fp8": {6 * gi, 11 * time.Second}}
	for _, p := range ps {
		wp := want[p.Key.Quantization]
		if p.Key.Model != "/models/llama" || p.Footprint != wp.foot || p.LoadTime != wp.load || p.Loads != 1 {
			t.Errorf("profile %+v, want weights /models/llama, footprint %d, load %s, 1 load", p, wp.foot, wp.load)
		}
	}

	// Another replica of the fp8 variant shares its profile: its load takes
	// the learned 6Gi, not its declared 8Gi.
	again, trA := onDemand("chat-fp8/1", 8*gi)
	again.Weights, again.Quantization = "/models/llama", "fp8"
	trA.foot, trA.peak, trA.load = 6*gi, 6*gi, 11*time.Second
	w.add(again, trA)
	w.request("chat-fp8/1", time.Second)
	w.run(2 * time.Minute)
	w.assertClean()
	loads := w.actions("chat-fp8/1", residency.ActLoad)
	if len(loads) == 0 || loads[0].Decision.Inputs.Bytes != 6*gi {
		t.Errorf("the second fp8 replica's load: %+v, want it to take the variant's learned 6Gi", loads)
	}
	if ps := w.c.Profiles(); len(ps) != 2 {
		t.Fatalf("%d profiles after a second replica of a variant, want 2: %+v", len(ps), ps)
	}
	for _, p := range w.c.Profiles() {
		if p.Key.Quantization == "fp8" && p.Loads != 2 {
			t.Errorf("fp8 variant: %d loads, want both replicas' 2", p.Loads)
		}
	}
}

// TestVariantSharesBoundLearnedMemory: two pinned deployments of one
// variant with shares that fill the card share a profile; the larger one's
// learned footprint must not make the smaller one claim more than its
// share, which would break I2 with promises that sum to the card.
func TestVariantSharesBoundLearnedMemory(t *testing.T) {
	w := newWorld(t, card)
	small, trS := reserved("small/0", residency.Pinned, 8*gi)
	big, trB := reserved("big/0", residency.Pinned, 14*gi)
	small.Weights, big.Weights = "/models/llama", "/models/llama"
	w.add(big, trB)
	w.run(time.Minute)
	w.add(small, trS)
	w.run(time.Minute)
	w.request("small/0", time.Second)
	w.request("big/0", time.Second)
	w.run(time.Minute)
	w.assertClean()
	if ps := w.c.Profiles(); len(ps) != 1 || ps[0].Footprint != 14*gi {
		t.Fatalf("profiles %+v, want one for the variant, footprint 14Gi", ps)
	}
	if st, _ := w.c.Replica("small/0"); st.State != residency.Resident || st.Cost != 8*gi {
		t.Errorf("small: %+v, want resident at its 8Gi", st)
	}
}

// TestKeepAliveIsTheRequestsHint: a request's keep_alive (Ollama's
// meaning) replaces the card's idle timeouts for its model: 0 takes an
// onDemand model off the card as soon as it is idle (asleep, then
// unloaded), a negative one keeps it past the card's timeouts, and a later
// request without one gives the card's timeouts back. A warm model kept
// for 0 only sleeps: its share stays reserved.
func TestKeepAliveIsTheRequestsHint(t *testing.T) {
	cfg := card
	cfg.IdleSleep, cfg.IdleUnload = 2*time.Minute, 4*time.Minute
	w := newWorld(t, cfg)
	w.add(onDemand("now", 4*gi))
	w.add(onDemand("kept", 4*gi))
	w.add(reserved("warm", residency.Warm, 4*gi))
	ask := func(m residency.ModelID, keep time.Duration) {
		w.request(m, 5*time.Second)
		w.send(residency.KeepAlive{Model: m, For: keep})
	}
	ask("now", 0)
	ask("kept", -1)
	ask("warm", 0)
	w.run(time.Minute)
	if s := w.state("now"); s != residency.Cold {
		t.Fatalf("keep_alive 0: now is %s a minute after its request, want Cold (the card's idle timeout is 2m)\n%s", s, w.dump())
	}
	if got := kinds(w.actions("now")); strings.Join(got, " ") != "load sleep unload" {
		t.Fatalf("keep_alive 0: now's actions %v, want load sleep unload", got)
	}
	if s := w.state("warm"); s != residency.Sleeping {
		t.Fatalf("keep_alive 0 on a warm model: it is %s, want Sleeping (a warm share is never unloaded by a hint)\n%s", s, w.dump())
	}
	w.run(20 * time.Minute)
	if s := w.state("kept"); s != residency.Resident {
		t.Fatalf("keep_alive -1: kept is %s 20 minutes later, want Resident\n%s", s, w.dump())
	}
	w.request("kept", 5*time.Second)
	w.run(3 * time.Minute)
	if s := w.state("kept"); s == residency.Resident {
		t.Fatalf("a request without keep_alive did not give the card's idle timeout back: kept is still Resident\n%s", w.dump())
	}
	for _, a := range w.actions("now", residency.ActSleep) {
		if !strings.Contains(a.Decision.Reason, "keep_alive") {
			t.Errorf("the sleep of now does not say it followed its request's keep_alive: %q", a.Decision.Reason)
		}
	}
	w.assertClean()
}

// TestPlanValuesABusyModelWithoutPriors: the agent tells the controller
// no load or wake time (the profiler learns them); a busy model that never
// slept shows a value above zero in the plan, computed with its measured
// load (issue 32: `residency plan` showed VALUE 0.00 at 20 requests a minute).
func TestPlanValuesABusyModelWithoutPriors(t *testing.T) {
	w := newWorld(t, card)
	for _, r := range []residency.Residency{residency.Pinned, residency.Warm} {
		d, tr := reserved(string(r.String()), r, 8*gi)
		d.LoadTime, d.WakeTime = 0, 0
		w.add(d, tr)
	}
	for range 40 {
		for _, m := range []residency.ModelID{"pinned", "warm"} {
			w.request(m, time.Second)
		}
		w.run(3 * time.Second)
	}
	w.assertClean()
	for _, e := range w.c.Plan() {
		if e.State != residency.Resident || e.Rate < 1 || e.Value <= 0 {
			t.Fatalf("plan entry %+v: want a resident model with its rate and a value above zero\n%s", e, w.dump())
		}
	}
}

// A background model that fits alone but never finds the card free (an
// interactive model keeps it busy) gets a bounded turn once it has waited
// 10 min (docs/residency.md, "No starvation"): the plan says by when, it
// is on the card by then, the interactive model is drained for it (its
// request runs the drain deadline), and a request for the interactive
// model after the turn's slot takes the card back at once.
func TestBackgroundGetsABoundedTurnOnABusyCard(t *testing.T) {
	w := newWorld(t, card)
	chat, tr := onDemand("chat", 12*gi)
	chat.Priority = residency.Interactive
	w.add(chat, tr)
	bg, tr := onDemand("batch", 12*gi)
	bg.Priority = residency.Background
	w.add(bg, tr)
	w.request("chat", time.Hour)
	w.run(time.Minute)
	w.request("batch", 10*time.Minute)
	w.run(5 * time.Minute)
	if w.state("batch") != residency.Cold {
		t.Fatalf("batch is %s before its wait is due\n%s", w.state("batch"), w.dump())
	}
	var by time.Time
	for _, e := range w.c.Plan() {
		if e.Model == "batch" {
			by = e.SlotBy
			if by.IsZero() || !by.After(w.now()) || !strings.Contains(e.Reason, "gets the card by") {
				t.Fatalf("plan for waiting batch: slot by %v, reason %q", by, e.Reason)
			}
		}
	}
	// Its wait began when its request came, 5 min ago: the turn is due
	// 5 min from now, and it is in by 30 s drain + 10 s stop + twice its
	// 20 s load after that.
	if want := w.now().Add(5*time.Minute + 80*time.Second); by.After(want.Add(time.Second)) {
		t.Fatalf("plan bounds batch at %v, want by %v", by, want)
	}
	for w.now().Before(by) && w.state("batch") != residency.Resident {
		w.run(time.Second)
	}
	if w.state("batch") != residency.Resident {
		t.Fatalf("batch is %s at %v, past the plan's bound\n%s", w.state("batch"), by, w.dump())
	}
	drains := w.actions("chat", residency.ActDrain)
	if len(drains) != 1 || !strings.Contains(drains[0].Decision.Reason, "batch's turn as a background model") || drains[0].Decision.Trigger != residency.TriggerTurn {
		t.Fatalf("want one drain of chat for batch's turn\n%s", w.dump())
	}
	// The slot (3 min) ends; a chat request takes the card back at once.
	w.run(3*time.Minute + 5*time.Second)
	w.request("chat", 5*time.Second)
	w.run(time.Minute)
	if w.state("chat") != residency.Resident || w.eng["chat"].served < 1 {
		t.Fatalf("chat is %s, served %d: it must be back after batch's turn\n%s", w.state("chat"), w.eng["chat"].served, w.dump())
	}
	w.assertClean()
}
