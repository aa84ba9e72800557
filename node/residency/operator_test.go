package residency_test

import (
	"strings"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/node/residency"
)

// TestOperatorLoadAndUnload: an operator's load brings a cold onDemand model
// onto the card without a request, and is refused, naming what holds the
// card, where the card cannot hold it beside its promises; an unload puts a
// warm model to sleep and unloads an onDemand one; a pinned model's unload
// is refused. Each action is a decision with trigger operator; a refusal
// changes nothing.
func TestOperatorLoadAndUnload(t *testing.T) {
	w := newWorld(t, card)
	w.add(reserved("p", residency.Pinned, 2*gi))
	w.add(reserved("w", residency.Warm, 10*gi))
	w.add(onDemand("a", 8*gi))
	w.add(onDemand("big", 14*gi))
	w.run(time.Minute)
	op := func(ev residency.Event) error {
		out := w.c.Handle(ev)
		for _, a := range out.Actions {
			w.acts = append(w.acts, a)
			w.exec(a)
		}
		w.run(30 * time.Second)
		return out.Err
	}
	operatorAction := func(m residency.ModelID, kind residency.ActionKind) {
		t.Helper()
		for _, a := range w.actions(m, kind) {
			if a.Decision.Trigger == residency.TriggerOperator && strings.Contains(a.Decision.Reason, "asked by the operator") {
				return
			}
		}
		t.Fatalf("no %s of %s with trigger operator\n%s", kind, m, w.dump())
	}

	if err := op(residency.OperatorLoad{Model: "a"}); err != nil {
		t.Fatalf("load a: %v", err)
	}
	if w.state("a") != residency.Resident {
		t.Fatalf("a is %s after the operator's load, want Resident\n%s", w.state("a"), w.dump())
	}
	operatorAction("a", residency.ActLoad)

	before := len(w.acts)
	err := op(residency.OperatorLoad{Model: "big"})
	if err == nil || !strings.Contains(err.Error(), "cannot hold big") || !strings.Contains(err.Error(), "held by") ||
		!strings.Contains(err.Error(), "w (warm, Resident, 10.0Gi)") || !strings.Contains(err.Error(), "a (onDemand, Resident, 8.0Gi)") ||
		!strings.Contains(err.Error(), "unloading its idle onDemand models would free only 8.0Gi") {
		t.Fatalf("load of a model the card cannot hold: %v, want a refusal naming w and a", err)
	}
	if w.state("big") != residency.Cold || len(w.actions("big")) != 0 || len(w.acts) != before {
		t.Fatalf("a refused load changed something: big %s, actions %v\n%s", w.state("big"), kinds(w.acts[before:]), w.dump())
	}

	if err := op(residency.OperatorUnload{Model: "p"}); err == nil || !strings.Contains(err.Error(), "pinned") {
		t.Fatalf("unload of a pinned model: %v, want a refusal saying it is pinned", err)
	}
	if w.state("p") != residency.Resident {
		t.Fatalf("p is %s after a refused unload", w.state("p"))
	}

	if err := op(residency.OperatorUnload{Model: "w"}); err != nil {
		t.Fatalf("unload w: %v", err)
	}
	if w.state("w") != residency.Sleeping {
		t.Fatalf("warm w is %s after the operator's unload, want Sleeping\n%s", w.state("w"), w.dump())
	}
	operatorAction("w", residency.ActSleep)

	if err := op(residency.OperatorUnload{Model: "a"}); err != nil {
		t.Fatalf("unload a: %v", err)
	}
	if w.state("a") != residency.Cold {
		t.Fatalf("onDemand a is %s after the operator's unload, want Cold\n%s", w.state("a"), w.dump())
	}
	operatorAction("a", residency.ActUnload)

	if err := op(residency.OperatorLoad{Model: "nosuch"}); err == nil || !strings.Contains(err.Error(), "nosuch") {
		t.Fatalf("load of an unknown model: %v, want an error naming it", err)
	}
	// A request loads a again as usual.
	w.request("a", time.Second)
	w.run(time.Minute)
	if w.eng["a"].served != 1 {
		t.Fatalf("a served %d requests after the operator's unload, want 1\n%s", w.eng["a"].served, w.dump())
	}
	w.assertClean()
}

// TestOperatorLoadMakesRoomFromIdleOnDemand: an operator's load that the
// card cannot hold beside what it holds now unloads idle onDemand models
// to make room, each a decision with trigger operator naming the model it
// makes room for; a busy onDemand model, a warm one and a pinned one stay.
func TestOperatorLoadMakesRoomFromIdleOnDemand(t *testing.T) {
	w := newWorld(t, card)
	w.add(reserved("p", residency.Pinned, 2*gi))
	w.add(reserved("w", residency.Warm, 10*gi))
	w.add(onDemand("idle", 4*gi))
	w.add(onDemand("busy", 3*gi))
	w.add(onDemand("big", 6*gi))
	w.request("idle", time.Second)
	w.request("busy", 10*time.Minute)
	w.run(time.Minute)
	for m, want := range map[residency.ModelID]residency.State{"p": residency.Resident, "w": residency.Resident, "idle": residency.Resident, "busy": residency.Resident} {
		if got := w.state(m); got != want {
			t.Fatalf("before the load: %s is %s, want %s\n%s", m, got, want, w.dump())
		}
	}
	out := w.c.Handle(residency.OperatorLoad{Model: "big"})
	if out.Err != nil {
		t.Fatalf("load big: %v\n%s", out.Err, w.dump())
	}
	for _, a := range out.Actions {
		w.acts = append(w.acts, a)
		w.exec(a)
	}
	w.run(time.Minute)
	if w.state("big") != residency.Resident || w.state("idle") != residency.Cold {
		t.Fatalf("after the operator's load: big %s, idle %s; want Resident, Cold\n%s", w.state("big"), w.state("idle"), w.dump())
	}
	ev := w.actions("idle", residency.ActEvict)
	if len(ev) != 1 || ev[0].Decision.Trigger != residency.TriggerOperator || ev[0].Decision.For != "big" ||
		!strings.Contains(ev[0].Decision.Reason, "makes room for big, asked by the operator") {
		t.Fatalf("idle's eviction: %+v, want one with trigger operator for big\n%s", ev, w.dump())
	}
	if ld := w.actions("big", residency.ActLoad); len(ld) != 1 || ld[0].Decision.Trigger != residency.TriggerOperator {
		t.Fatalf("big's load: %+v, want one with trigger operator\n%s", ld, w.dump())
	}
	for _, m := range []residency.ModelID{"p", "w", "busy"} {
		if w.state(m) != residency.Resident || len(w.actions(m, residency.ActEvict, residency.ActSleep, residency.ActUnload, residency.ActDrain)) != 0 {
			t.Fatalf("%s was touched (%s) to make room for an operator's load\n%s", m, w.state(m), w.dump())
		}
	}
	w.assertClean()
}

// TestDeploymentIdleTimeouts: a deployment's own idle timeouts (spec.idle)
// replace the card's for it alone: it sleeps and is unloaded on its
// timeouts while a model on the card's defaults stays.
func TestDeploymentIdleTimeouts(t *testing.T) {
	w := newWorld(t, card)
	quick, tr := onDemand("quick", 4*gi)
	quick.IdleSleep, quick.IdleUnload = 45*time.Second, 2*time.Minute
	w.add(quick, tr)
	w.add(onDemand("slow", 4*gi))
	w.request("quick", time.Second)
	w.request("slow", time.Second)
	w.run(90 * time.Second)
	if w.state("quick") != residency.Sleeping || w.state("slow") != residency.Resident {
		t.Fatalf("after 90s idle: quick %s (sleepAfter 45s), slow %s (card's 5m); want Sleeping, Resident\n%s",
			w.state("quick"), w.state("slow"), w.dump())
	}
	if s := w.actions("quick", residency.ActSleep); len(s) != 1 || !strings.Contains(s[0].Decision.Reason, "spec.idle") {
		t.Fatalf("quick's sleep does not name its deployment's timeout: %v\n%s", s, w.dump())
	}
	w.run(3 * time.Minute)
	if w.state("quick") != residency.Cold || w.state("slow") != residency.Resident {
		t.Fatalf("after 4.5m: quick %s (unloadAfter 2m), slow %s; want Cold, Resident\n%s", w.state("quick"), w.state("slow"), w.dump())
	}
	w.assertClean()
}

// TestOperatorUnloadHoldsAgainstForecast: right after traffic, an
// operator's unload sticks, as `ollama stop` does: the arrival forecast
// that would prewarm or wake the model brings back neither the onDemand
// model it unloaded nor the warm one it put to sleep, and a warm model
// whose engine cannot sleep is not loaded back to keep its share; the
// unload's reason says so. The next request loads (or wakes) it again.
func TestOperatorUnloadHoldsAgainstForecast(t *testing.T) {
	w := newWorld(t, card)
	od, tr := onDemand("od", 6*gi)
	od.CanSleep = false
	w.add(od, tr)
	w.add(reserved("wm", residency.Warm, 6*gi))
	wc, tr := reserved("wc", residency.Warm, 6*gi)
	wc.CanSleep = false
	w.add(wc, tr)
	w.run(time.Minute)
	// Steady traffic: a request each 10s, so the forecast expects the
	// next one 10s after the last.
	for range 6 {
		for _, m := range []residency.ModelID{"od", "wm", "wc"} {
			w.request(m, time.Second)
		}
		w.run(10 * time.Second)
	}
	for _, m := range []residency.ModelID{"od", "wm", "wc"} {
		if w.state(m) != residency.Resident {
			t.Fatalf("before the unload: %s is %s, want Resident\n%s", m, w.state(m), w.dump())
		}
	}
	before := len(w.acts)
	for _, m := range []residency.ModelID{"od", "wm", "wc"} {
		out := w.c.Handle(residency.OperatorUnload{Model: m, By: "alice"})
		if out.Err != nil {
			t.Fatalf("unload %s: %v", m, out.Err)
		}
		for _, a := range out.Actions {
			w.acts = append(w.acts, a)
			w.exec(a)
		}
	}
	// Through the predicted arrivals and well past them, no request comes.
	w.run(2 * time.Minute)
	if w.state("od") != residency.Cold || w.state("wm") != residency.Sleeping || w.state("wc") != residency.Cold {
		t.Fatalf("2m after the operator's unload with no request: od %s, wm %s, wc %s; want Cold, Sleeping, Cold\n%s",
			w.state("od"), w.state("wm"), w.state("wc"), w.dump())
	}
	for _, a := range w.acts[before:] {
		if a.Decision.Trigger != residency.TriggerOperator {
			t.Fatalf("the controller acted after the operator's unload: %s\n%s", a.Decision.Reason, w.dump())
		}
	}
	for _, m := range []residency.ModelID{"od", "wm", "wc"} {
		stops := w.actions(m, residency.ActUnload, residency.ActSleep)
		if len(stops) != 1 || stops[0].Decision.Trigger != residency.TriggerOperator ||
			!strings.Contains(stops[0].Decision.Reason, "asked by the operator (alice)") ||
			!strings.Contains(stops[0].Decision.Reason, "until a request for it arrives or the operator loads it") {
			t.Fatalf("%s's operator unload: %+v, want one naming alice and saying it stays off until a request or a load\n%s", m, stops, w.dump())
		}
	}
	// A request brings each back.
	for _, m := range []residency.ModelID{"od", "wm", "wc"} {
		w.request(m, time.Second)
	}
	w.run(time.Minute)
	for _, m := range []residency.ModelID{"od", "wm", "wc"} {
		if got := w.eng[m].served; got != 7 {
			t.Fatalf("%s served %d requests, want 7 (the request after the unload loads it again)\n%s", m, got, w.dump())
		}
	}
	for _, m := range []residency.ModelID{"od", "wc"} {
		if ld := w.actions(m, residency.ActLoad); len(ld) != 2 || ld[1].Decision.Trigger != residency.TriggerRequest {
			t.Fatalf("%s's loads: %v, want a second one on request\n%s", m, kinds(ld), w.dump())
		}
	}
	if wk := w.actions("wm", residency.ActWake); len(wk) != 1 || wk[0].Decision.Trigger != residency.TriggerRequest {
		t.Fatalf("wm's wakes: %v, want one on request\n%s", kinds(wk), w.dump())
	}
	w.assertClean()
}
