package residency_test

import (
	"container/heap"
	"fmt"
	"github.com/gpuplane/gpuplane/internal/cputime"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/node/residency"
)

// A minimal node for the benchmark: actions complete after their times,
// requests after their service time; no invariant bookkeeping, so what is
// measured is the controller.

type due struct {
	at time.Time
	ev residency.Event
}

type dueHeap []due

func (h dueHeap) Len() int           { return len(h) }
func (h dueHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h dueHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *dueHeap) Push(x any)        { *h = append(*h, x.(due)) }
func (h *dueHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

type benchNode struct {
	clk     *residency.ManualClock
	c       *residency.Controller
	rng     *rand.Rand
	zipf    []float64 // cumulative arrival weights
	models  []residency.ModelID
	deps    map[residency.ModelID]residency.Deployment
	pending dueHeap
	lat     []time.Duration
	cpu     []time.Duration
	handled int
}

// newBenchNode places 64 models on one 80 GiB card: 4 pinned, 8 warm and 52
// onDemand, of 2–12 GiB, together about four times the card.
func newBenchNode(tb testing.TB, seed uint64) *benchNode {
	clk := residency.NewManualClock(epoch)
	c, err := residency.New(residency.Config{Card: "gpu0", Memory: 80 * gi}, clk)
	if err != nil {
		tb.Fatal(err)
	}
	n := &benchNode{clk: clk, c: c, rng: rnd(seed), deps: map[residency.ModelID]residency.Deployment{}}
	total := 0.0
	for i := 0; i < 64; i++ {
		res, size := residency.OnDemand, int64(2+n.rng.IntN(11))*gi
		switch {
		case i < 4:
			res, size = residency.Pinned, 4*gi
		case i < 12:
			res, size = residency.Warm, 4*gi
		}
		d := residency.Deployment{Model: residency.ModelID(fmt.Sprintf("m%02d", i)), Residency: res,
			Priority: residency.Priority(n.rng.IntN(3)), Share: size, Residual: size / 20, CanSleep: i%5 != 0,
			LoadTime: time.Duration(5+n.rng.IntN(40)) * time.Second, WakeTime: 2 * time.Second}
		n.models = append(n.models, d.Model)
		n.deps[d.Model] = d
		n.handle(residency.DeploymentAdded{Deployment: d})
		total += 1 / float64(i+1) // Zipf: model i gets weight 1/(i+1)
		n.zipf = append(n.zipf, total)
	}
	return n
}

func (n *benchNode) handle(ev residency.Event) {
	var c0 time.Duration
	if n.lat != nil {
		c0 = cputime.Thread()
	}
	t := time.Now()
	out := n.c.Handle(ev)
	if n.lat != nil {
		n.lat = append(n.lat, time.Since(t))
		n.cpu = append(n.cpu, cputime.Thread()-c0)
	}
	n.handled++
	for _, a := range out.Actions {
		d := n.deps[a.Model]
		switch a.Kind {
		case residency.ActLoad, residency.ActPrewarm:
			n.at(d.LoadTime, residency.LoadDone{Model: a.Model})
		case residency.ActWake:
			n.at(d.WakeTime, residency.WakeDone{Model: a.Model})
		case residency.ActSleep:
			n.at(time.Second, residency.SleepDone{Model: a.Model})
		case residency.ActEvict, residency.ActUnload:
			n.at(time.Second, residency.Unloaded{Model: a.Model})
		}
	}
}

func (n *benchNode) at(d time.Duration, ev residency.Event) {
	heap.Push(&n.pending, due{at: n.clk.Now().Add(d), ev: ev})
}

// second runs one virtual second: arrivals (about 4 per second, Zipf over
// the models), completions due, and a tick.
func (n *benchNode) second() {
	for k := n.rng.IntN(9); k > 0; k-- {
		x := n.rng.Float64() * n.zipf[len(n.zipf)-1]
		i, _ := slices.BinarySearch(n.zipf, x)
		m := n.models[min(i, len(n.models)-1)]
		n.handle(residency.RequestArrived{Model: m})
		n.at(time.Duration(1+n.rng.IntN(20))*time.Second, residency.RequestFinished{Model: m, Tokens: 200, Elapsed: time.Second})
	}
	end := n.clk.Now().Add(time.Second)
	for len(n.pending) > 0 && !n.pending[0].at.After(end) {
		d := heap.Pop(&n.pending).(due)
		n.clk.Set(d.at)
		n.handle(d.ev)
	}
	n.clk.Set(end)
	n.handle(residency.Tick{})
}

// BenchmarkDecision64Models measures the controller's decision latency: one
// Handle call (an event in, the policy step, the ledger check, actions out)
// with 64 models on one card, warmed up for an hour of virtual time.
//
//	make bench-residency
func BenchmarkDecision64Models(b *testing.B) {
	// One OS thread, so its CPU clock measures only this goroutine.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	n := newBenchNode(b, 1)
	for i := 0; i < 3600; i++ {
		n.second()
	}
	n.lat = make([]time.Duration, 0, b.N+64)
	n.cpu = make([]time.Duration, 0, b.N+64)
	b.ResetTimer()
	for len(n.lat) < b.N {
		n.second()
	}
	b.StopTimer()
	slices.Sort(n.lat)
	slices.Sort(n.cpu)
	q := func(d []time.Duration, f float64) float64 {
		return float64(d[int(f*float64(len(d)-1))].Nanoseconds()) / 1e3
	}
	b.ReportMetric(q(n.lat, 0.50), "p50-µs")
	b.ReportMetric(q(n.lat, 0.99), "p99-µs")
	b.ReportMetric(q(n.lat, 1), "max-µs")
	b.ReportMetric(q(n.cpu, 0.50), "p50-cpu-µs")
	b.ReportMetric(q(n.cpu, 0.99), "p99-cpu-µs")
	if len(n.c.Decisions()) == 0 {
		b.Fatal("no decisions: the benchmark exercises nothing")
	}
}

// BenchmarkMemoryPerModel measures the heap a controller managing 64 models
// keeps after an hour of virtual traffic (decision log full, forecasts,
// profiles), per model.
func BenchmarkMemoryPerModel(b *testing.B) {
	var perModel float64
	for i := 0; i < b.N; i++ {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		n := newBenchNode(b, uint64(i+1))
		for s := 0; s < 3600; s++ {
			n.second()
		}
		c := n.c
		n = nil
		runtime.GC()
		runtime.ReadMemStats(&after)
		perModel = float64(after.HeapAlloc-before.HeapAlloc) / 64
		if len(c.Decisions()) == 0 {
			b.Fatal("no decisions")
		}
		runtime.KeepAlive(c)
	}
	b.ReportMetric(perModel/1024, "KiB/model")
}
