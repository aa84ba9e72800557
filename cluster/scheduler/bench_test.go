package scheduler_test

import (
	"slices"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/cluster/scheduler"
	"github.com/gpuplane/gpuplane/cluster/scheduler/placesim"
)

// benchmarkPlace measures one decision per iteration on a synthetic
// cluster under the default policy, packing for the arrivals' workload, refilling the cluster from empty when it
// is 90 % allocated, and reports placements/s and the p99 decision time.
func benchmarkPlace(b *testing.B, nodes int) {
	sc := placesim.Synthetic(nodes, 8, 50000)
	st, err := scheduler.NewState(sc.Nodes, sc.Accelerators)
	if err != nil {
		b.Fatal(err)
	}
	st.SetWorkload(sc.Arrivals)
	lat := make([]time.Duration, 0, b.N)
	next := 0
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t := time.Now()
		d := st.Place(sc.Arrivals[next%len(sc.Arrivals)], scheduler.PolicyDefault)
		lat = append(lat, time.Since(t))
		next++
		if used, capacity := st.Allocated(); !d.Placed() && used*10 >= capacity*9 || next%len(sc.Arrivals) == 0 {
			b.StopTimer()
			st, _ = scheduler.NewState(sc.Nodes, sc.Accelerators)
			st.SetWorkload(sc.Arrivals)
			b.StartTimer()
		}
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "placements/s")
	b.ReportMetric(float64(lat[(len(lat)-1)*99/100].Microseconds()), "p99-µs")
}

func BenchmarkPlace1kNodes(b *testing.B)  { benchmarkPlace(b, 1000) }
func BenchmarkPlace10kNodes(b *testing.B) { benchmarkPlace(b, 10000) }
