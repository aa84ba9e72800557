package placesim

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/gpuplane/gpuplane/cluster/scheduler"
)

// Scenario is a cluster and the arrivals to place into it.
type Scenario struct {
	Nodes        []scheduler.Node
	Accelerators []scheduler.Accelerator
	Arrivals     []scheduler.Request
}

// Load reads a nodes file and a workload file; each is openb CSV (.csv) or
// gpuplane YAML (.yaml, .yml), so an openb cluster can also take a YAML
// workload and the other way round.
func Load(nodesPath, workloadPath string) (*Scenario, error) {
	sc := &Scenario{}
	data, err := os.ReadFile(nodesPath)
	if err != nil {
		return nil, err
	}
	switch ext(nodesPath) {
	case ".csv":
		sc.Nodes, err = ReadOpenBNodes(nodesPath, bytes.NewReader(data))
	case ".yaml", ".yml":
		sc.Nodes, err = ParseNodesYAML(nodesPath, data)
	default:
		err = fmt.Errorf("%s: %w", nodesPath, errFormat)
	}
	if err != nil {
		return nil, err
	}
	if data, err = os.ReadFile(workloadPath); err != nil {
		return nil, err
	}
	switch ext(workloadPath) {
	case ".csv":
		sc.Accelerators, sc.Arrivals, err = readOpenBTasks(workloadPath, bytes.NewReader(data), factsOf(sc.Nodes))
	case ".yaml", ".yml":
		sc.Accelerators, sc.Arrivals, err = ParseWorkloadYAML(workloadPath, data)
	default:
		err = fmt.Errorf("%s: %w", workloadPath, errFormat)
	}
	if err != nil {
		return nil, err
	}
	return sc, nil
}

func ext(p string) string { return strings.ToLower(filepath.Ext(p)) }

// Result is what one policy achieved on a scenario.
type Result struct {
	Policy   string `json:"policy"`
	Arrivals int    `json:"arrivals"`
	Placed   int    `json:"placed"`
	Failed   int    `json:"failed"`
	// NeverPlaceable counts arrivals that no node of the cluster could hold
	// even empty (too many cards, CPU or memory, or GPU types it lacks).
	// They are skipped: they say nothing about packing, so they are neither
	// failures nor fragmentation.
	NeverPlaceable int `json:"neverPlaceable"`
	// FirstFailure is the 0-based arrival that failed first, -1 if none.
	FirstFailure int `json:"firstFailure"`
	// GPUAllocatedAtFirstFailure is the share of the cluster's card capacity
	// (milli reserved over all cards / total) allocated when the first
	// arrival could not be placed; when none failed, the share at the end.
	GPUAllocatedAtFirstFailure float64 `json:"gpuAllocatedAtFirstFailure"`
	// GPUAllocatedAtEnd is the share after all arrivals, failures skipped.
	GPUAllocatedAtEnd float64 `json:"gpuAllocatedAtEnd"`
	// FragmentationAtEnd is the expected share of card capacity that the
	// scenario's workload cannot use at the end (see scheduler.Fragmentation).
	FragmentationAtEnd float64 `json:"fragmentationAtEnd"`
	// FirstFailureReason is the scheduler's reason for the first failure.
	FirstFailureReason string `json:"firstFailureReason,omitempty"`
	// FailedByDemand counts failures by what they asked for: "share",
	// "1 card", "8 cards", "host only".
	FailedByDemand map[string]int `json:"failedByDemand,omitempty"`
	// GPUArrived is the card capacity the arrivals asked for, as a share of
	// the cluster's (never-placeable arrivals aside).
	GPUArrived float64 `json:"gpuArrived"`
	// Reached100 says whether the arrivals asked for the whole cluster's
	// card capacity; GPUAllocatedAt100 and FragmentationAt100 are the
	// shares when they first did (the FGD paper's headline point).
	Reached100         bool    `json:"reached100"`
	GPUAllocatedAt100  float64 `json:"gpuAllocatedAt100,omitempty"`
	FragmentationAt100 float64 `json:"fragmentationAt100,omitempty"`
	// Seconds is the wall time of the placement loop.
	Seconds float64 `json:"seconds"`
}

// Run places the scenario's arrivals in order, with no departures, under
// one policy. The fragmentation-aware policies pack for the whole trace's
// demand distribution, as the FGD paper does. It fails if the final state
// breaks rule 11 (scheduler.Check), which would be a scheduler bug.
func Run(sc *Scenario, p scheduler.Policy) (Result, error) {
	return run(sc, sc.Arrivals, sc.Arrivals, p, newHoldability(sc))
}

// run places arrivals on the scenario's cluster, packing for workload.
func run(sc *Scenario, arrivals, workload []scheduler.Request, p scheduler.Policy, hold *holdability) (Result, error) {
	st, err := scheduler.NewState(sc.Nodes, sc.Accelerators)
	if err != nil {
		return Result{}, err
	}
	st.SetWorkload(workload)
	res := Result{Policy: string(p), Arrivals: len(arrivals), FirstFailure: -1}
	_, capacity := st.Allocated()
	share := func() float64 {
		used, capacity := st.Allocated()
		if capacity == 0 {
			return 0
		}
		return float64(used) / float64(capacity)
	}
	accs := map[string]scheduler.Accelerator{}
	for _, a := range sc.Accelerators {
		accs[a.Name] = a
	}
	var arrived int64
	start := time.Now()
	for i, r := range arrivals {
		if !hold.ok(r) {
			res.NeverPlaceable++
			continue
		}
		d := st.Place(r, p)
		arrived += gpuDemand(r, accs)
		if d.Placed() {
			res.Placed++
		} else {
			res.Failed++
			if res.FirstFailure < 0 {
				res.FirstFailure = i
				res.GPUAllocatedAtFirstFailure = share()
				res.FirstFailureReason = d.Reason
				res.FailedByDemand = map[string]int{}
			}
			res.FailedByDemand[demand(r, accs)]++
		}
		if !res.Reached100 && capacity > 0 && arrived >= capacity {
			res.Reached100 = true
			res.GPUAllocatedAt100 = share()
			res.FragmentationAt100 = st.Fragmentation()
		}
	}
	res.Seconds = time.Since(start).Seconds()
	if capacity > 0 {
		res.GPUArrived = float64(arrived) / float64(capacity)
	}
	res.GPUAllocatedAtEnd = share()
	if res.FirstFailure < 0 {
		res.GPUAllocatedAtFirstFailure = res.GPUAllocatedAtEnd
	}
	res.FragmentationAtEnd = st.Fragmentation()
	if err := scheduler.Check(st.Nodes(), sc.Accelerators); err != nil {
		return res, fmt.Errorf("policy %s broke rule 11: %w", p, err)
	}
	return res, nil
}

// gpuDemand is the card capacity a request asks for, in milli-cards.
func gpuDemand(r scheduler.Request, accs map[string]scheduler.Accelerator) int64 {
	a, ok := accs[r.Accelerator]
	switch {
	case r.Accelerator == "" || !ok:
		return 0
	case a.Tenancy == scheduler.Shared:
		return int64(r.Milli)
	}
	return scheduler.FullCard * int64(max(a.DevicesPerReplica, 1))
}

func demand(r scheduler.Request, accs map[string]scheduler.Accelerator) string {
	a, ok := accs[r.Accelerator]
	switch {
	case r.Accelerator == "" || !ok:
		return "host only"
	case a.Tenancy == scheduler.Shared:
		return "share"
	case a.DevicesPerReplica <= 1:
		return "1 card"
	}
	return fmt.Sprintf("%d cards", a.DevicesPerReplica)
}

// RunAll runs every policy (scheduler.Policies order), for --policy all.
func RunAll(sc *Scenario) ([]Result, error) {
	var out []Result
	for _, p := range scheduler.Policies() {
		r, err := Run(sc, p)
		if err != nil {
			return out, err
		}
		out = append(out, r)
	}
	return out, nil
}

// WriteTable writes results side by side, one column per policy.
func WriteTable(w io.Writer, results []Result) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(name string, f func(r Result) string) {
		cells := []string{name}
		for _, r := range results {
			cells = append(cells, f(r))
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	pct := func(v float64) string { return fmt.Sprintf("%.2f%%", 100*v) }
	row("POLICY", func(r Result) string { return r.Policy })
	row("ARRIVALS", func(r Result) string { return fmt.Sprint(r.Arrivals) })
	row("PLACED", func(r Result) string { return fmt.Sprint(r.Placed) })
	row("FAILED", func(r Result) string { return fmt.Sprint(r.Failed) })
	row("FIRST FAILURE", func(r Result) string {
		if r.FirstFailure < 0 {
			return "none"
		}
		return fmt.Sprintf("#%d", r.FirstFailure)
	})
	row("GPU ALLOC AT FIRST FAILURE", func(r Result) string { return pct(r.GPUAllocatedAtFirstFailure) })
	row("GPU ALLOC AT END", func(r Result) string { return pct(r.GPUAllocatedAtEnd) })
	row("FRAGMENTATION AT END", func(r Result) string { return pct(r.FragmentationAtEnd) })
	row("NEVER PLACEABLE", func(r Result) string { return fmt.Sprint(r.NeverPlaceable) })
	var kinds []string
	seen := map[string]bool{}
	for _, r := range results {
		for k := range r.FailedByDemand {
			if !seen[k] {
				seen[k] = true
				kinds = append(kinds, k)
			}
		}
	}
	sort.Strings(kinds)
	for _, k := range kinds {
		row("FAILED "+strings.ToUpper(k), func(r Result) string { return fmt.Sprint(r.FailedByDemand[k]) })
	}
	row("SECONDS", func(r Result) string { return fmt.Sprintf("%.3f", r.Seconds) })
	return tw.Flush()
}
