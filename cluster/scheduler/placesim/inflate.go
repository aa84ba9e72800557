package placesim

import (
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"strings"
	"text/tabwriter"

	"github.com/gpuplane/gpuplane/cluster/scheduler"
)

// Workload inflation, as in the FGD paper's evaluation (Weng et al.,
// ATC'23, §6.1): a pod list fed once may ask for less GPU than the cluster
// holds, so every policy places everything and nothing is compared. The
// paper instead keeps submitting tasks drawn from the list, with
// replacement and a fixed seed, until the arrived GPU requests exceed the
// cluster's capacity, repeats that over seeds, and reports the share of
// GPU capacity left unallocated as arrivals grow — its headline figure at
// 100 % arrived.

// DefaultInflatePercent is the paper's inflation: 130 % of capacity.
const DefaultInflatePercent = 130

// Inflate draws arrivals from the scenario's tasks that some node could
// hold, uniformly with replacement from a generator seeded with seed, until
// their GPU requests reach percent of the cluster's card capacity. Drawn
// tasks get unique ids ("<name>#<draw>"), each its own deployment.
func Inflate(sc *Scenario, percent float64, seed uint64) ([]scheduler.Request, error) {
	pool := placeable(sc, newHoldability(sc))
	return inflate(sc, pool, percent, seed)
}

func placeable(sc *Scenario, hold *holdability) []scheduler.Request {
	var pool []scheduler.Request
	for _, r := range sc.Arrivals {
		if hold.ok(r) {
			pool = append(pool, r)
		}
	}
	return pool
}

func inflate(sc *Scenario, pool []scheduler.Request, percent float64, seed uint64) ([]scheduler.Request, error) {
	if percent <= 0 || math.IsNaN(percent) || math.IsInf(percent, 0) {
		return nil, fmt.Errorf("inflation %v%%: want a percentage above 0", percent)
	}
	accs := map[string]scheduler.Accelerator{}
	for _, a := range sc.Accelerators {
		accs[a.Name] = a
	}
	var capacity, asked int64
	for _, n := range sc.Nodes {
		capacity += scheduler.FullCard * int64(len(n.Cards))
	}
	for _, r := range pool {
		asked += gpuDemand(r, accs)
	}
	if capacity == 0 {
		return nil, errors.New("cannot inflate: the cluster has no cards")
	}
	if asked == 0 {
		return nil, errors.New("cannot inflate: no task that a node can hold asks for a GPU")
	}
	target := int64(math.Ceil(percent / 100 * float64(capacity)))
	rng := rand.New(rand.NewPCG(seed, 0x6f70656e62)) // "openb"
	var out []scheduler.Request
	for arrived := int64(0); arrived < target; {
		r := pool[rng.IntN(len(pool))]
		r.Replica = fmt.Sprintf("%s#%d", r.Replica, len(out))
		r.Deployment = r.Replica
		arrived += gpuDemand(r, accs)
		out = append(out, r)
	}
	return out, nil
}

// Stat is a metric over seeds: the mean and the spread (sample standard
// deviation; 0 for one seed).
type Stat struct {
	Mean   float64 `json:"mean"`
	Spread float64 `json:"spread"`
}

func statOf(v []float64) Stat {
	if len(v) == 0 {
		return Stat{}
	}
	var s Stat
	for _, x := range v {
		s.Mean += x
	}
	s.Mean /= float64(len(v))
	if len(v) > 1 {
		var ss float64
		for _, x := range v {
			ss += (x - s.Mean) * (x - s.Mean)
		}
		s.Spread = math.Sqrt(ss / float64(len(v)-1))
	}
	return s
}

// Summary is what one policy achieved over inflated runs, one per seed.
// Shares are of the cluster's card capacity (0..1).
type Summary struct {
	Policy         string  `json:"policy"`
	InflatePercent float64 `json:"inflatePercent"`
	Seeds          int     `json:"seeds"`
	// NeverPlaceable counts the pod list's tasks that no node can hold;
	// they are left out of the draws.
	NeverPlaceable int  `json:"neverPlaceable"`
	Arrivals       Stat `json:"arrivals"`
	// UnallocatedAt100 is the paper's headline: the share of capacity not
	// allocated when the arrived GPU requests first reach 100 % of it.
	UnallocatedAt100        Stat `json:"unallocatedAt100"`
	AllocatedAt100          Stat `json:"allocatedAt100"`
	AllocatedAtFirstFailure Stat `json:"allocatedAtFirstFailure"`
	AllocatedAtEnd          Stat `json:"allocatedAtEnd"`
	FragmentationAt100      Stat `json:"fragmentationAt100"`
	FragmentationAtEnd      Stat `json:"fragmentationAtEnd"`
	Seconds                 Stat `json:"seconds"`
	// Runs are the per-seed results, seeds 1..Seeds in order.
	Runs []Result `json:"runs"`
}

// RunInflated runs one policy over seeds inflated workloads (seeds 1, 2,
// ..., seeds), each drawn by Inflate, and summarises them. The
// fragmentation-aware policies pack for the pod list's distribution of
// task sizes, as in the paper. Every run must reach 100 % arrived, so
// percent must be at least 100.
func RunInflated(sc *Scenario, p scheduler.Policy, percent float64, seeds int) (Summary, error) {
	if percent < 100 || math.IsNaN(percent) || math.IsInf(percent, 0) {
		return Summary{}, fmt.Errorf("inflation %v%%: want at least 100 (the paper's headline is at 100%% arrived)", percent)
	}
	if seeds < 1 {
		return Summary{}, fmt.Errorf("seeds %d: want at least 1", seeds)
	}
	hold := newHoldability(sc)
	pool := placeable(sc, hold)
	sum := Summary{Policy: string(p), InflatePercent: percent, Seeds: seeds, NeverPlaceable: len(sc.Arrivals) - len(pool)}
	var arrivals, un100, at100, atFF, atEnd, frag100, fragEnd, secs []float64
	for seed := 1; seed <= seeds; seed++ {
		arr, err := inflate(sc, pool, percent, uint64(seed))
		if err != nil {
			return sum, err
		}
		r, err := run(sc, arr, pool, p, hold)
		if err != nil {
			return sum, fmt.Errorf("seed %d: %w", seed, err)
		}
		sum.Runs = append(sum.Runs, r)
		arrivals = append(arrivals, float64(r.Arrivals))
		un100 = append(un100, 1-r.GPUAllocatedAt100)
		at100 = append(at100, r.GPUAllocatedAt100)
		atFF = append(atFF, r.GPUAllocatedAtFirstFailure)
		atEnd = append(atEnd, r.GPUAllocatedAtEnd)
		frag100 = append(frag100, r.FragmentationAt100)
		fragEnd = append(fragEnd, r.FragmentationAtEnd)
		secs = append(secs, r.Seconds)
	}
	sum.Arrivals, sum.UnallocatedAt100, sum.AllocatedAt100 = statOf(arrivals), statOf(un100), statOf(at100)
	sum.AllocatedAtFirstFailure, sum.AllocatedAtEnd = statOf(atFF), statOf(atEnd)
	sum.FragmentationAt100, sum.FragmentationAtEnd, sum.Seconds = statOf(frag100), statOf(fragEnd), statOf(secs)
	return sum, nil
}

// WriteSummaryTable writes summaries side by side, one column per policy,
// each cell the mean ± spread over seeds.
func WriteSummaryTable(w io.Writer, sums []Summary) error {
	if len(sums) == 0 {
		return nil
	}
	fmt.Fprintf(w, "inflated to %g%% of GPU capacity, %d seeds; mean ± standard deviation over seeds\n",
		sums[0].InflatePercent, sums[0].Seeds)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(name string, f func(s Summary) string) {
		cells := []string{name}
		for _, s := range sums {
			cells = append(cells, f(s))
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	pct := func(st func(s Summary) Stat) func(s Summary) string {
		return func(s Summary) string { return fmt.Sprintf("%.2f ± %.2f%%", 100*st(s).Mean, 100*st(s).Spread) }
	}
	row("POLICY", func(s Summary) string { return s.Policy })
	row("ARRIVALS", func(s Summary) string { return fmt.Sprintf("%.0f ± %.0f", s.Arrivals.Mean, s.Arrivals.Spread) })
	row("GPU UNALLOCATED AT 100% ARRIVED", pct(func(s Summary) Stat { return s.UnallocatedAt100 }))
	row("GPU ALLOC AT 100% ARRIVED", pct(func(s Summary) Stat { return s.AllocatedAt100 }))
	row("GPU ALLOC AT FIRST FAILURE", pct(func(s Summary) Stat { return s.AllocatedAtFirstFailure }))
	row("GPU ALLOC AT END", pct(func(s Summary) Stat { return s.AllocatedAtEnd }))
	row("FRAGMENTATION AT 100% ARRIVED", pct(func(s Summary) Stat { return s.FragmentationAt100 }))
	row("FRAGMENTATION AT END", pct(func(s Summary) Stat { return s.FragmentationAtEnd }))
	row("NEVER PLACEABLE (NOT DRAWN)", func(s Summary) string { return fmt.Sprint(s.NeverPlaceable) })
	row("SECONDS PER SEED", func(s Summary) string { return fmt.Sprintf("%.3f ± %.3f", s.Seconds.Mean, s.Seconds.Spread) })
	return tw.Flush()
}
