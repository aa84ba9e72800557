// Command scheduler measures the placement engine's decision throughput:
// on a synthetic cluster (default 10,000 nodes × 8 cards) and, when the
// openb trace is present, on every openb pod list against its 1,213-node
// cluster, each inflated as the FGD paper does (130 % of GPU capacity).
// Each measurement is repeated and the median is quoted, both per second
// of wall time and per second of the placing thread's CPU time (the
// latter is what a loaded machine does not distort).
//
//	GOMAXPROCS=2 go run ./bench/scheduler -nodes 10000 -cards 8 -replicas 20000 -policy default
//
// How well each policy packs is `gpuplane simulate --policy all --inflate
// 130 --seeds 10`, and over the whole openb family bench/packing. It is a benchmark harness: it reads the clock, which the
// scheduler never does.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/gpuplane/gpuplane/cluster/scheduler"
	"github.com/gpuplane/gpuplane/cluster/scheduler/placesim"
	"github.com/gpuplane/gpuplane/internal/cputime"
)

func main() {
	nodes := flag.Int("nodes", 10000, "nodes in the synthetic cluster")
	cards := flag.Int("cards", 8, "cards per node")
	replicas := flag.Int("replicas", 20000, "replicas to place on the synthetic cluster (refilled when full)")
	policy := flag.String("policy", "default", "placement policy: default, gpuplane, fgd, bestfit, spread")
	openb := flag.String("openb", "", "openb trace folder (default: $GPUPLANE_OPENB_DIR or ../shared/data/openb)")
	skipOpenB := flag.Bool("skip-openb", false, "skip the openb pod lists")
	repeat := flag.Int("repeat", 5, "runs per measurement; the median is quoted")
	flag.Parse()
	if err := run(*nodes, *cards, *replicas, *policy, *openb, *skipOpenB, max(*repeat, 1)); err != nil {
		fmt.Fprintln(os.Stderr, "bench/scheduler:", err)
		os.Exit(1)
	}
}

// measure is one run: decisions, their outcome and how long they took.
type measure struct {
	decisions, placed, failed int
	wall, cpu                 time.Duration
	lat                       []time.Duration
}

func (m measure) perWall() float64 { return float64(m.decisions) / m.wall.Seconds() }
func (m measure) perCPU() float64  { return float64(m.decisions) / m.cpu.Seconds() }

// place runs the requests through a fresh State packing for workload,
// refilling the cluster (outside the timings) when a failure finds it 90 %
// allocated.
func place(sc *placesim.Scenario, reqs, workload []scheduler.Request, p scheduler.Policy, refill bool) (measure, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	fresh := func() (*scheduler.State, error) {
		st, err := scheduler.NewState(sc.Nodes, sc.Accelerators)
		if err == nil {
			st.SetWorkload(workload)
		}
		return st, err
	}
	st, err := fresh()
	if err != nil {
		return measure{}, err
	}
	m := measure{decisions: len(reqs), lat: make([]time.Duration, 0, len(reqs))}
	for _, r := range reqs {
		t, c := time.Now(), cputime.Thread()
		d := st.Place(r, p)
		m.cpu += cputime.Thread() - c
		dt := time.Since(t)
		m.wall += dt
		m.lat = append(m.lat, dt)
		if d.Placed() {
			m.placed++
			continue
		}
		m.failed++
		if used, capacity := st.Allocated(); refill && used*10 >= capacity*9 {
			if st, err = fresh(); err != nil {
				return m, err
			}
		}
	}
	return m, nil
}

// median returns the run with the median wall-clock rate, the median CPU
// rate, and every decision's latency.
func median(ms []measure) (measure, float64, []time.Duration) {
	var lat []time.Duration
	cpu := make([]float64, len(ms))
	for i, m := range ms {
		lat = append(lat, m.lat...)
		cpu[i] = m.perCPU()
	}
	slices.SortFunc(ms, func(a, b measure) int {
		switch {
		case a.perWall() < b.perWall():
			return -1
		case a.perWall() > b.perWall():
			return 1
		}
		return 0
	})
	slices.Sort(cpu)
	slices.Sort(lat)
	return ms[len(ms)/2], cpu[len(cpu)/2], lat
}

func q(lat []time.Duration, f float64) time.Duration { return lat[int(f*float64(len(lat)-1))] }

func run(nodes, cards, replicas int, policy, openb string, skipOpenB bool, repeat int) error {
	p, err := scheduler.ParsePolicy(policy)
	if err != nil {
		return err
	}
	fmt.Printf("policy %s, GOMAXPROCS %d, median of %d runs\n\n", p, runtime.GOMAXPROCS(0), repeat)
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "WORKLOAD\tNODES\tDECISIONS\tPLACED\tFAILED\tDECISIONS/S\tPER CPU-S\tP50\tP99")
	row := func(name string, n int, ms []measure) {
		m, cpu, lat := median(ms)
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%.0f\t%.0f\t%v\t%v\n", name, n, m.decisions, m.placed, m.failed,
			m.perWall(), cpu, q(lat, 0.5).Round(time.Microsecond), q(lat, 0.99).Round(time.Microsecond))
	}
	c := placesim.Synthetic(nodes, cards, replicas)
	var ms []measure
	for i := 0; i < repeat; i++ {
		m, err := place(c, c.Arrivals, c.Arrivals, p, true)
		if err != nil {
			return err
		}
		ms = append(ms, m)
	}
	row(fmt.Sprintf("synthetic %d×%d", nodes, cards), nodes, ms)

	if skipOpenB {
		return tw.Flush()
	}
	if openb == "" {
		openb = placesim.OpenBDir()
	}
	if openb == "" {
		tw.Flush()
		fmt.Println("openb trace not found; set GPUPLANE_OPENB_DIR to measure its pod lists")
		return nil
	}
	lists, err := filepath.Glob(filepath.Join(openb, "openb_pod_list_*.csv"))
	if err != nil {
		return err
	}
	slices.Sort(lists)
	for _, l := range lists {
		sc, err := placesim.Load(filepath.Join(openb, placesim.OpenBNodesFile), l)
		if err != nil {
			return err
		}
		var ms []measure
		for seed := 1; seed <= repeat; seed++ {
			arr, err := placesim.Inflate(sc, placesim.DefaultInflatePercent, uint64(seed))
			if err != nil {
				return err
			}
			m, err := place(sc, arr, sc.Arrivals, p, false)
			if err != nil {
				return err
			}
			ms = append(ms, m)
		}
		name := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(l), "openb_pod_list_"), ".csv")
		row("openb "+name+" ×130%", len(sc.Nodes), ms)
	}
	return tw.Flush()
}
