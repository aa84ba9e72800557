package residency_test

import (
	"container/heap"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/node/residency"
	"github.com/gpuplane/gpuplane/node/sim"
)

// BenchmarkAdaptersPerCard measures, in virtual time with the real
// controller, how many adapters one card hosts at the interactive
// SLO (p95 TTFT ≤ 800 ms) on one base, against one replica per fine-tune.
//
// The card is an L4 (24 GiB); the base is an 8B model on 40 % of it (so
// one replica per fine-tune fits 2 per card, rule 11 with maxModels 2).
// Adapters are rank 16 (32 MiB), maxAdapters 8 or 16, their loads drawn from the
// sim engine's default distribution (fitted to GenTD26's LoRA loads, median
// 4.4 s from disk, a tenth of that from host RAM). Requests arrive Poisson
// at 2/s in all, each for an adapter drawn by Zipf popularity (s = 1.1)
// over N adapters, prefill 30 ms, decode 2 s; for 30 minutes after a 5
// minute warm-up. TTFT is arrival to the first token: the wait for the
// adapter's load (if it is not on the card) plus prefill. A request for a
// resident adapter runs in the base's batch like a base request (the sim
// models no LoRA compute overhead), so resident adapter TTFT equals base
// TTFT here.
//
//	go test -run '^$' -bench AdaptersPerCard -benchtime 1x ./node/residency/
func BenchmarkAdaptersPerCard(b *testing.B) {
	const slo = 800 * time.Millisecond
	for range b.N {
		for _, maxOnCard := range []int{8, 16} {
			best := 0
			for _, n := range []int{10, 20, 40, 60, 80, 120, 160, 240, 320, 480, 640, 1000} {
				r := serveAdapters(n, maxOnCard, 2, 30*time.Minute, 1)
				b.Logf("maxAdapters %d, N=%4d adapters: p50 %v p95 %v p99 %v, %d requests, %.1f%% from disk, %.1f%% from host, %.1f%% resident",
					maxOnCard, n, r.p50.Round(time.Millisecond), r.p95.Round(time.Millisecond), r.p99.Round(time.Millisecond),
					r.requests, r.disk, r.host, r.resident)
				if r.p95 <= slo {
					best = n
				}
			}
			// One replica per fine-tune: floor(100 % / 40 %) = 2 per card.
			b.ReportMetric(float64(best), fmt.Sprintf("adapters/card@max%d", maxOnCard))
			b.ReportMetric(float64(best)/2, fmt.Sprintf("x-replicas@max%d", maxOnCard))
		}
	}
}

type serveResult struct {
	p50, p95, p99 time.Duration
	requests      int
	disk, host    float64
	resident      float64
}

// svEvent is one timed event of the serving loop.
type svEvent struct {
	at  time.Time
	seq int
	fn  func()
}

type svQueue []svEvent

func (q svQueue) Len() int { return len(q) }
func (q svQueue) Less(i, j int) bool {
	if c := q[i].at.Compare(q[j].at); c != 0 {
		return c < 0
	}
	return q[i].seq < q[j].seq
}
func (q svQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *svQueue) Push(x any)   { *q = append(*q, x.(svEvent)) }
func (q *svQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

func serveAdapters(n, maxOnCard int, rate float64, dur time.Duration, seed uint64) serveResult {
	const (
		prefill = 30 * time.Millisecond
		decode  = 2 * time.Second
		warmup  = 5 * time.Minute
		bytes   = 32 << 20
	)
	rng := rand.New(rand.NewPCG(seed, 42))
	clk := residency.NewManualClock(epoch)
	c, err := residency.New(residency.Config{Card: "gpu0", Memory: 24 * gi}, clk)
	if err != nil {
		panic(err)
	}
	var q svQueue
	seq := 0
	at := func(t time.Time, fn func()) {
		seq++
		heap.Push(&q, svEvent{at: t, seq: seq, fn: fn})
	}
	names := make([]string, n)
	specs := make([]residency.Adapter, n)
	for i := range names {
		names[i] = fmt.Sprintf("a%04d", i)
		specs[i] = residency.Adapter{Name: names[i], Bytes: bytes, LoadTime: sim.DefaultLoRALoad.SlowMedian}
	}
	// inHost: adapters the engine cached in host RAM (unloaded, not yet
	// dropped); waiting: arrival times of requests waiting per adapter.
	inHost := map[string]bool{}
	waiting := map[string][]time.Time{}
	var ttfts []time.Duration
	var fromDisk, fromHost, resident int
	var handle func(ev residency.Event)
	dispatch := func(name string, arrived time.Time, counted bool) {
		now := clk.Now()
		if counted {
			ttfts = append(ttfts, now.Sub(arrived)+prefill)
		}
		at(now.Add(prefill+decode), func() {
			handle(residency.AdapterFinished{Model: "base", Adapter: name})
			handle(residency.RequestFinished{Model: "base"})
		})
	}
	handle = func(ev residency.Event) {
		out := c.Handle(ev)
		if len(out.Violations) > 0 {
			panic(out.Violations[0].Error())
		}
		for _, a := range out.Actions {
			switch a.Kind {
			case residency.ActLoad:
				at(clk.Now(), func() { handle(residency.LoadDone{Model: a.Model}) })
			case residency.ActLoadAdapter:
				d := sim.DefaultLoRALoad.Draw(rng)
				if inHost[a.Adapter] {
					d = time.Duration(float64(d) * sim.HostLoadFactor)
				}
				at(clk.Now().Add(d), func() {
					handle(residency.AdapterLoaded{Model: "base", Adapter: a.Adapter})
					for _, t := range waiting[a.Adapter] {
						dispatch(a.Adapter, t, !t.Before(epoch.Add(warmup)))
					}
					delete(waiting, a.Adapter)
				})
			case residency.ActUnloadAdapter:
				at(clk.Now().Add(50*time.Millisecond), func() {
					inHost[a.Adapter] = true
					handle(residency.AdapterUnloaded{Model: "base", Adapter: a.Adapter})
				})
			case residency.ActDropAdapter:
				delete(inHost, a.Adapter)
			}
		}
	}
	handle(residency.DeploymentAdded{Deployment: residency.Deployment{Model: "base", Residency: residency.Pinned,
		Priority: residency.Interactive, Share: 24 * gi * 4 / 10, CanSleep: true, LoadTime: 30 * time.Second, WakeTime: time.Second}})
	handle(residency.AdaptersChanged{Model: "base", MaxOnCard: maxOnCard, Adapters: specs})
	zipf := rand.NewZipf(rng, 1.1, 1, uint64(n-1))
	end := epoch.Add(warmup + dur)
	var arrive func()
	arrive = func() {
		now := clk.Now()
		name := names[zipf.Uint64()]
		counted := !now.Before(epoch.Add(warmup))
		handle(residency.RequestArrived{Model: "base"})
		handle(residency.AdapterRequested{Model: "base", Adapter: name})
		if c.AdapterReady("base", name) {
			if counted {
				resident++
			}
			dispatch(name, now, counted)
		} else {
			if counted {
				if inHost[name] {
					fromHost++
				} else {
					fromDisk++
				}
			}
			waiting[name] = append(waiting[name], now)
		}
		if next := now.Add(time.Duration(rng.ExpFloat64() / rate * float64(time.Second))); next.Before(end) {
			at(next, arrive)
		}
	}
	at(epoch, arrive)
	for t := epoch.Add(time.Second); t.Before(end.Add(time.Minute)); t = t.Add(time.Second) {
		at(t, func() { handle(residency.Tick{}) })
	}
	for q.Len() > 0 {
		e := heap.Pop(&q).(svEvent)
		clk.Set(e.at)
		e.fn()
	}
	slices.Sort(ttfts)
	pct := func(p float64) time.Duration {
		if len(ttfts) == 0 {
			return 0
		}
		return ttfts[min(len(ttfts)-1, int(math.Ceil(p*float64(len(ttfts))))-1)]
	}
	total := float64(fromDisk + fromHost + resident)
	return serveResult{p50: pct(0.5), p95: pct(0.95), p99: pct(0.99), requests: len(ttfts),
		disk: 100 * float64(fromDisk) / total, host: 100 * float64(fromHost) / total, resident: 100 * float64(resident) / total}
}
