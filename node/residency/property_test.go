package residency_test

import (
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/node/residency"
)

// chaos drives a random card for d of virtual time: a pinned model, two warm
// ones and onDemand models that together need about twice the card, random
// arrivals (hot, rare and long-running), engines that crash and loads that
// fail, priorities that change, models removed and new ones placed. The
// world checks I1–I3 from its own account at every step.
func chaos(t testing.TB, seed uint64, d time.Duration) (*world, int) {
	return chaosWith(t, seed, d, false)
}

// chaosWith is chaos with the protected set on or off
// (residency.Config.BestEffort).
func chaosWith(t testing.TB, seed uint64, d time.Duration, bestEffort bool) (*world, int) {
	rng := rnd(seed)
	cfg := residency.Config{Card: "gpu0", Memory: 40 * gi, IdleSleep: 3 * time.Minute, IdleUnload: 10 * time.Minute,
		DrainDeadline: 20 * time.Second, BestEffort: bestEffort}
	w := newWorld(t, cfg)
	dep := func(name string, res residency.Residency, size int64) (residency.Deployment, truth) {
		dd := residency.Deployment{
			Model: residency.ModelID(name), Residency: res, Priority: residency.Priority(rng.IntN(3)),
			Share: size, Footprint: size, Peak: size * 6 / 5, Residual: size / 16, CanSleep: res != residency.OnDemand || rng.IntN(3) > 0,
			LoadTime: time.Duration(5+rng.IntN(35)) * time.Second, WakeTime: time.Duration(1+rng.IntN(4)) * time.Second,
			Engine: "sim", Device: "l4",
		}
		foot := size * int64(70+rng.IntN(31)) / 100
		tr := truth{foot: foot, peak: foot + (dd.Peak-foot)*int64(rng.IntN(101))/100, residual: dd.Residual * int64(50+rng.IntN(51)) / 100,
			load: dd.LoadTime + time.Duration(rng.IntN(10))*time.Second - 5*time.Second, wake: dd.WakeTime,
			sleep: time.Second, stopDur: time.Duration(1+rng.IntN(3)) * time.Second}
		tr.load = max(tr.load, time.Second)
		return dd, tr
	}
	w.add(dep("pinned", residency.Pinned, 6*gi))
	w.add(dep("warm1", residency.Warm, 6*gi))
	w.add(dep("warm2", residency.Warm, 8*gi))
	rates := map[residency.ModelID]float64{"pinned": 0.05, "warm1": 0.01, "warm2": 0.02}
	next := 0
	addOnDemand := func() {
		next++
		name := fmt.Sprintf("od%d", next)
		w.add(dep(name, residency.OnDemand, int64(4+rng.IntN(11))*gi))
		// Per-second arrival probability: a few hot, most rare.
		rates[residency.ModelID(name)] = []float64{0.002, 0.005, 0.01, 0.03, 0.1}[rng.IntN(5)]
	}
	for i := 0; i < 6; i++ {
		addOnDemand()
	}
	arrivals := 0
	placedLate, converted := false, false
	end := w.now().Add(d)
	for w.now().Before(end) {
		for _, m := range w.names {
			e := w.eng[m]
			if e.removed || rng.Float64() >= rates[m] {
				continue
			}
			service := time.Duration(1+rng.IntN(30)) * time.Second
			if rng.IntN(20) == 0 {
				service = time.Duration(2+rng.IntN(4)) * time.Minute
			}
			arrivals++
			w.request(m, service)
		}
		switch rng.IntN(120) {
		case 0: // an engine crashes
			m := w.names[rng.IntN(len(w.names))]
			if e := w.eng[m]; !e.removed && e.state != off {
				w.crash(m)
			}
		case 1: // the next load of a model fails
			w.eng[w.names[rng.IntN(len(w.names))]].tr.failLoad = true
		case 2: // a priority changes
			m := w.names[rng.IntN(len(w.names))]
			if e := w.eng[m]; !e.removed {
				nd := e.dep
				nd.Priority = residency.Priority(rng.IntN(3))
				w.change(nd)
			}
		case 4: // a pinned model is placed on the busy card
			if !placedLate {
				placedLate = true
				w.add(dep("pinned2", residency.Pinned, 6*gi))
				rates["pinned2"] = 0.05
			}
		case 5: // an onDemand model becomes warm (its share now reserved)
			m := w.names[3+rng.IntN(len(w.names)-3)]
			if e := w.eng[m]; !converted && !e.removed && e.dep.Residency == residency.OnDemand && e.dep.Share <= 8*gi && e.dep.CanSleep {
				converted = true
				nd := e.dep
				nd.Residency = residency.Warm
				w.change(nd)
			}
		case 3: // an onDemand model leaves, another is placed
			m := w.names[3+rng.IntN(len(w.names)-3)]
			if e := w.eng[m]; !e.removed {
				w.removeModel(m)
				addOnDemand()
			}
		}
		w.run(time.Second)
	}
	return w, arrivals
}

// crash kills m's engine: memory freed, in-flight requests lost.
func (w *world) crash(m residency.ModelID) {
	e := w.eng[m]
	e.epoch++
	e.state, e.mem, e.draining = off, 0, false
	w.dropAdapters(e)
	w.send(residency.EngineCrashed{Model: m})
	w.cutOff(m)
	w.flush()
}

func TestRandomEventsKeepInvariants(t *testing.T) {
	if plantedBug {
		t.Skip("the residency_plantbug tag breaks I3 on purpose; see TestPlantedBugIsCaught")
	}
	seeds := 12
	if testing.Short() {
		seeds = 2
	}
	if s := os.Getenv("GPUPLANE_CHAOS_SEEDS"); s != "" {
		seeds, _ = strconv.Atoi(s)
	}
	for _, be := range []bool{false, true} {
		for seed := uint64(1); seed <= uint64(seeds); seed++ {
			t.Run(fmt.Sprintf("seed%d/bestEffort=%v", seed, be), func(t *testing.T) {
				randomEventsKeepInvariants(t, seed, be)
			})
		}
		if testing.Short() {
			continue
		}
		for _, seed := range regressionSeeds {
			if seed > uint64(seeds) {
				t.Run(fmt.Sprintf("seed%d/bestEffort=%v", seed, be), func(t *testing.T) {
					randomEventsKeepInvariants(t, seed, be)
				})
			}
		}
	}
}

// regressionSeeds once broke an invariant (GPUPLANE_CHAOS_SEEDS=200 runs
// 1–200): 27, an owner of a lower-class turn's holder's class that could
// not take its share back (the card fell back to pinned-only); 16, 20 and
// 38, an owner that had yielded to one turn in its wait and could not
// take its share back from the next turn's holder; 19, 28, 32 and 35, a
// warm owner that yielded again to a turn without a serialize decision
// saying so; 30, 33 and 36, warm owners waiting out a lower-class turn
// (or a borrower's turn and then a lower-class one); 60 and 127, a
// borrower that cannot sleep, whose slot is four cold loads.
var regressionSeeds = []uint64{16, 19, 20, 27, 28, 30, 32, 33, 35, 36, 38, 60, 127}

func randomEventsKeepInvariants(t *testing.T, seed uint64, be bool) {
	{
		{
			w, arrivals := chaosWith(t, seed, 40*time.Minute, be)
			w.assertClean()
			served := 0
			for _, e := range w.eng {
				served += e.served
			}
			// A controller that stalls would keep the invariants trivially.
			// (Under sustained load a large low-priority model can wait long:
			// the gateway's load deadline answers those requests.)
			if served*2 < arrivals {
				t.Fatalf("served %d of %d requests\n%s", served, arrivals, w.dump())
			}
			if len(w.actions("", residency.ActEvict, residency.ActSleep)) == 0 || len(w.actions("", residency.ActWake)) == 0 {
				t.Fatalf("no pressure exercised\n%s", w.dump())
			}
			t.Logf("seed %d: %d arrivals, %d served, %d actions, %d decisions", seed, arrivals, served, len(w.acts), len(w.c.Decisions()))
		}
	}
}

func TestSameSeedSameDecisions(t *testing.T) {
	a, _ := chaos(t, 7, 15*time.Minute)
	b, _ := chaos(t, 7, 15*time.Minute)
	if a.dump() != b.dump() {
		t.Fatal("two runs with seed 7 decided differently")
	}
	c, _ := chaos(t, 8, 15*time.Minute)
	if a.dump() == c.dump() {
		t.Fatal("seeds 7 and 8 gave the same decisions: the generator ignores its seed")
	}
}
