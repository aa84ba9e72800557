package queue_test

import (
	"fmt"
	"github.com/gpuplane/gpuplane/internal/cputime"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/node/gateway/queue"
)

// BenchmarkEnqueueDispatch measures the scheduler's cost per request on a
// busy card in steady state: 64 deployments of 16 in-flight slots with
// about 160 requests held each, from 1,000 tenants (weights 1–4, each using
// four of the models) in all three classes (10% interactive, 60% standard,
// 30% background, a third streamed), after 100,000 requests of warm-up. One
// operation is one request's admission (Enqueue, which may preempt) plus
// one completion on the same deployment (Finish, which dispatches the next
// request): the queue stays at its level. It reports the p50 and p99 of
// that pair in wall time and in the thread's CPU time (which includes the
// clock read, about 1 µs here), and the allocations per operation. The
// harness's own bookkeeping (choosing requests, tracking in-flight IDs) is
// inside the measured pair.
func BenchmarkEnqueueDispatch(b *testing.B) {
	const (
		nDeps    = 64
		nTenants = 1000
		slots    = 16
		backlog  = 256
		warmOps  = 100000
	)
	s, err := queue.New(queue.Config{})
	if err != nil {
		b.Fatal(err)
	}
	now := epoch
	deps := make([]string, nDeps)
	for i := range deps {
		deps[i] = fmt.Sprintf("model-%02d", i)
		if _, err := s.AddDeployment(queue.Deployment{Name: deps[i], MaxInFlight: slots, QueueLimit: 4 * backlog, Ready: true}, now); err != nil {
			b.Fatal(err)
		}
	}
	tenants := make([]string, nTenants)
	for i := range tenants {
		tenants[i] = fmt.Sprintf("tenant-%04d", i)
		if err := s.SetTenant(tenants[i], float64(1+i%4)); err != nil {
			b.Fatal(err)
		}
	}
	g := rnd(1)
	// What the gateway would keep: each engine's in-flight IDs.
	inFlight := make([][]queue.ID, nDeps)
	for i := range inFlight {
		inFlight[i] = make([]queue.ID, 0, 2*slots)
	}
	warm := nDeps * (slots + backlog)
	depOf := make([]int32, 0, warm+warmOps+b.N+1)
	depOf = append(depOf, -1) // IDs start at 1
	apply := func(o queue.Output) {
		for _, p := range o.Preempted {
			d := depOf[p.ID]
			inFlight[d] = slices.DeleteFunc(inFlight[d], func(x queue.ID) bool { return x == p.ID })
		}
		for _, id := range o.Dispatched {
			d := depOf[id]
			inFlight[d] = append(inFlight[d], id)
		}
	}
	request := func() (queue.Request, int32) {
		// Each tenant uses four of the models.
		t := g.IntN(nTenants)
		d := int32((7*t + 16*g.IntN(4)) % nDeps)
		c := queue.Standard
		switch x := g.IntN(10); {
		case x == 0:
			c = queue.Interactive
		case x < 4:
			c = queue.Background
		}
		return queue.Request{Deployment: deps[d], Tenant: tenants[t], Class: c,
			PromptTokens: 1 + g.IntN(2048), MaxTokens: 1 + g.IntN(512), Streamed: g.IntN(3) == 0}, d
	}
	enqueue := func(r queue.Request, d int32) {
		depOf = append(depOf, d)
		_, o, err := s.Enqueue(r, now)
		if err != nil {
			b.Fatal(err)
		}
		apply(o)
	}
	for range warm {
		enqueue(request())
	}
	lat := make([]time.Duration, b.N)
	cpu := make([]time.Duration, b.N)
	op := func() {
		r, d := request()
		now = now.Add(time.Millisecond)
		depOf = append(depOf, d)
		_, o, err := s.Enqueue(r, now)
		if err != nil {
			b.Fatal(err)
		}
		apply(o)
		if len(inFlight[d]) > 0 {
			id := inFlight[d][0]
			inFlight[d] = inFlight[d][1:]
			o, err = s.Finish(id, 1+int(id%512), now)
			if err != nil {
				b.Fatal(err)
			}
			apply(o)
		}
	}
	// Steady state: every tenant has met its models, the maps have grown.
	for range warmOps {
		op()
	}
	// The thread's CPU clock is only the goroutine's while it stays on it.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		c0 := cputime.Thread()
		t0 := time.Now()
		op()
		lat[i] = time.Since(t0)
		cpu[i] = cputime.Thread() - c0
	}
	b.StopTimer()
	slices.Sort(lat)
	slices.Sort(cpu)
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns")
	b.ReportMetric(float64(cpu[len(cpu)/2].Nanoseconds()), "p50-cpu-ns")
	b.ReportMetric(float64(cpu[len(cpu)*99/100].Nanoseconds()), "p99-cpu-ns")
	b.ReportMetric(float64(s.Len())/nDeps, "held/deployment")
}
