package queue_test

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/node/gateway/queue"
)

const (
	maxPrompt = 64
	maxOutput = 64
	stepDT    = 10 * time.Millisecond
)

// fairRun drives two tenants, a and b, at random arrival rates (requests
// per step) against one engine of `slots` in-flight requests, and returns
// the largest normalized service gap |ΔW_a/w_a − ΔW_b/w_b| seen over any
// interval in which both were continuously backlogged, and the number of
// steps they were both backlogged.
func fairRun(t *testing.T, seed uint64, wa, wb, rateA, rateB float64, slots, steps int) (gap float64, joint int) {
	t.Helper()
	e := newEngine(t, queue.Config{}, queue.Deployment{Name: "m", MaxInFlight: slots, QueueLimit: 1 << 20, Ready: true})
	if err := e.s.SetTenant("a", wa); err != nil {
		t.Fatal(err)
	}
	if err := e.s.SetTenant("b", wb); err != nil {
		t.Fatal(err)
	}
	g := rnd(seed)
	arrive := func(tenant string, rate float64) {
		for n := rate; n > 0; n-- {
			if n < 1 && g.Float64() >= n {
				break
			}
			out := 1 + g.IntN(maxOutput)
			e.enqueue(queue.Request{Deployment: "m", Tenant: tenant, Class: queue.Standard,
				PromptTokens: 1 + g.IntN(maxPrompt), MaxTokens: out}, out)
		}
	}
	var startA, startB float64
	in := false
	for range steps {
		arrive("a", rateA)
		arrive("b", rateB)
		e.step(stepDT)
		if e.queuedBy("a", queue.Standard) == 0 || e.queuedBy("b", queue.Standard) == 0 {
			in = false
			continue
		}
		joint++
		if !in {
			// The interval starts at the end of this step: what was
			// charged during the step that made both backlogged is
			// outside it.
			in, startA, startB = true, e.served["a"], e.served["b"]
			continue
		}
		gap = max(gap, math.Abs((e.served["a"]-startA)/wa-(e.served["b"]-startB)/wb))
	}
	return gap, joint
}

// TestFairnessBound checks VTC's guarantee: over any interval in which two
// tenants are both backlogged, the weighted service they receive differs
// by at most 2·U/min(w), where U = InputPrice·maxPrompt + OutputPrice·
// maxOutput is the largest cost of one request (VTC, Sheng et al. OSDI'24,
// Theorem 4.4, with counters in weighted tokens). It holds for equal
// tenants, for one that floods at ten times the other's rate, and for
// weights 2:1, and over many seeds of random prompt and output lengths.
func TestFairnessBound(t *testing.T) {
	const u = 1*maxPrompt + 1*maxOutput
	cases := []struct {
		name         string
		wa, wb       float64
		rateA, rateB float64
	}{
		{"equal weights, equal load", 1, 1, 0.2, 0.2},
		{"equal weights, a floods at 10x", 1, 1, 1.5, 0.15},
		{"weights 2:1", 2, 1, 0.3, 0.3},
		{"weights 1:3, b floods", 1, 3, 0.1, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			bound := 2 * u / min(c.wa, c.wb)
			worst, joint := 0.0, 0
			for seed := uint64(1); seed <= 12; seed++ {
				gap, j := fairRun(t, seed, c.wa, c.wb, c.rateA, c.rateB, 4, 1500)
				joint += j
				if gap > bound {
					t.Fatalf("seed %d: backlogged tenants' weighted service differs by %.0f tokens, bound 2·U/min(w) = %.0f", seed, gap, bound)
				}
				worst = max(worst, gap)
			}
			if joint < 1000 {
				t.Fatalf("the tenants were both backlogged for only %d steps: the load does not exercise the bound", joint)
			}
			t.Logf("worst gap %.0f weighted tokens, bound %.0f, %d jointly backlogged steps", worst, bound, joint)
		})
	}
}

// TestFairShareUnderFlood is the user's view of fair sharing: both tenants backlogged for the whole run, one sending ten times the
// other's requests: the tokens they are served are within 10% of each
// other; with weights 2:1 they are 2:1 within 10%.
func TestFairShareUnderFlood(t *testing.T) {
	for _, w := range []float64{1, 2} {
		t.Run(fmt.Sprintf("weight %g:1", w), func(t *testing.T) {
			e := newEngine(t, queue.Config{}, queue.Deployment{Name: "m", MaxInFlight: 8, QueueLimit: 1 << 20, Ready: true})
			if err := e.s.SetTenant("flood", w); err != nil {
				t.Fatal(err)
			}
			g := rnd(7)
			send := func(tenant string, n int) {
				for range n {
					out := 1 + g.IntN(maxOutput)
					e.enqueue(queue.Request{Deployment: "m", Tenant: tenant, Class: queue.Standard,
						PromptTokens: 1 + g.IntN(maxPrompt), MaxTokens: out}, out)
				}
			}
			send("flood", 2000)
			send("light", 200)
			for e.queuedBy("light", queue.Standard) > 0 {
				e.step(stepDT)
			}
			ratio := e.served["flood"] / w / e.served["light"]
			if ratio < 0.9 || ratio > 1.1 {
				t.Fatalf("served flood %.0f, light %.0f: weighted ratio %.3f, want 1 ± 0.1", e.served["flood"], e.served["light"], ratio)
			}
		})
	}
}
