// Command scheduler measures the placement engine: decision throughput and
// latency on a synthetic cluster, and, when the openb trace is present, how
// every policy packs it.
//
//	go run ./bench/scheduler -nodes 1000 -cards 8 -replicas 20000 -policy default
//
// It is a benchmark harness: it reads the clock, which the scheduler never
// does.
package main

import (
	"flag"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/gpuplane/gpuplane/cluster/scheduler"
	"github.com/gpuplane/gpuplane/cluster/scheduler/simulate"
)

func main() {
	nodes := flag.Int("nodes", 1000, "nodes in the synthetic cluster")
	cards := flag.Int("cards", 8, "cards per node")
	replicas := flag.Int("replicas", 20000, "replicas to place (the cluster is refilled when full)")
	policy := flag.String("policy", "default", "placement policy: default, gpuplane, fgd, bestfit, spread")
	openb := flag.String("openb", "", "openb trace folder (default: $GPUPLANE_OPENB_DIR or ../shared/data/openb)")
	skipOpenB := flag.Bool("skip-openb", false, "skip the openb comparison")
	flag.Parse()
	if err := run(*nodes, *cards, *replicas, *policy, *openb, *skipOpenB); err != nil {
		fmt.Fprintln(os.Stderr, "bench/scheduler:", err)
		os.Exit(1)
	}
}

func run(nodes, cards, replicas int, policy, openb string, skipOpenB bool) error {
	p, err := scheduler.ParsePolicy(policy)
	if err != nil {
		return err
	}
	c := simulate.Synthetic(nodes, cards, replicas)
	reqs := c.Arrivals
	st, err := scheduler.NewState(c.Nodes, c.Accelerators)
	if err != nil {
		return err
	}
	lat := make([]time.Duration, 0, len(reqs))
	placed, failed, refills := 0, 0, 0
	start := time.Now()
	for _, r := range reqs {
		t := time.Now()
		d := st.Place(r, p)
		lat = append(lat, time.Since(t))
		if d.Placed() {
			placed++
			continue
		}
		failed++
		if used, capacity := st.Allocated(); used*10 >= capacity*9 {
			// Full: start again from an empty cluster, outside the timings.
			pause := time.Now()
			if st, err = scheduler.NewState(c.Nodes, c.Accelerators); err != nil {
				return err
			}
			refills++
			start = start.Add(time.Since(pause))
		}
	}
	elapsed := time.Since(start)
	slices.Sort(lat)
	q := func(f float64) time.Duration { return lat[int(f*float64(len(lat)-1))] }
	fmt.Printf("policy %s, %d nodes x %d cards, %d decisions (%d placed, %d failed, %d refills)\n",
		p, nodes, cards, len(reqs), placed, failed, refills)
	fmt.Printf("decisions/s %.0f  p50 %v  p99 %v  max %v\n",
		float64(len(reqs))/elapsed.Seconds(), q(0.50), q(0.99), lat[len(lat)-1])

	if skipOpenB {
		return nil
	}
	if openb == "" {
		openb = simulate.OpenBDir()
	}
	if openb == "" {
		fmt.Println("openb trace not found; set GPUPLANE_OPENB_DIR to compare policies on it")
		return nil
	}
	sc, err := simulate.LoadOpenB(openb)
	if err != nil {
		return err
	}
	res, err := simulate.RunAll(sc)
	if err != nil {
		return err
	}
	fmt.Printf("\nopenb trace (%s): %d nodes, %d arrivals\n", openb, len(sc.Nodes), len(sc.Arrivals))
	return simulate.WriteTable(os.Stdout, res)
}
