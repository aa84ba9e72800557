package placesim

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"github.com/gpuplane/gpuplane/cluster/scheduler"
)

// TestInflate: draws are seeded, with replacement, stop at the first draw
// that brings the arrived GPU requests to the target, and never include a
// task no node can hold.
func TestInflate(t *testing.T) {
	sc := scenario(t, "sn,cpu_milli,memory_mib,gpu,model\nn0,32000,131072,4,T4\nn1,32000,131072,2,T4\n",
		"name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"+
			"s,1000,100,1,250\nw,1000,100,1,1000\ncpu,500,100,0,0\nhuge,1000,100,8,1000\n")
	a, err := Inflate(sc, 130, 7)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Inflate(sc, 130, 7)
	c, _ := Inflate(sc, 130, 8)
	if !slices.EqualFunc(a, b, func(x, y scheduler.Request) bool { return x.Replica == y.Replica }) {
		t.Fatal("the same seed drew different tasks")
	}
	if slices.EqualFunc(a, c, func(x, y scheduler.Request) bool { return x.Replica == y.Replica }) {
		t.Fatal("seeds 7 and 8 drew the same tasks")
	}
	accs := map[string]scheduler.Accelerator{}
	for _, x := range sc.Accelerators {
		accs[x.Name] = x
	}
	var arrived int64
	seen := map[string]bool{}
	kinds := map[string]bool{}
	for i, r := range a {
		if strings.HasPrefix(r.Replica, "huge#") {
			t.Fatalf("drew %s, which no node can hold", r.Replica)
		}
		if seen[r.Replica] || r.Deployment != r.Replica {
			t.Fatalf("draw %d: id %s deployment %s", i, r.Replica, r.Deployment)
		}
		seen[r.Replica] = true
		kinds[strings.Split(r.Replica, "#")[0]] = true
		if i < len(a)-1 && arrived+gpuDemand(r, accs) >= 7800 {
			t.Fatalf("draw %d already reaches 130%% of 6000 milli; %d more drawn", i, len(a)-1-i)
		}
		arrived += gpuDemand(r, accs)
	}
	if arrived < 7800 || len(kinds) != 3 {
		t.Fatalf("arrived %d milli of 6000 (want ≥ 7800), task kinds drawn %v", arrived, kinds)
	}
}

// TestRunInflated: on a pod list that asks for less GPU than the cluster
// has, feeding it once never fails; inflated, every seed reaches 100 %
// arrived, and the summary is the mean over the per-seed runs.
func TestRunInflated(t *testing.T) {
	nodesCSV, tasksCSV := openbStyle(3, 30, 120)
	sc := scenario(t, nodesCSV, tasksCSV)
	once, err := Run(sc, scheduler.PolicyBestFit)
	if err != nil {
		t.Fatal(err)
	}
	if once.Failed != 0 {
		t.Fatalf("fed once, %d tasks failed; the test wants an under-filling list", once.Failed)
	}
	s, err := RunInflated(sc, scheduler.PolicyBestFit, 130, 4)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Runs) != 4 || s.Seeds != 4 {
		t.Fatalf("summary of %d runs", len(s.Runs))
	}
	var mean float64
	for _, r := range s.Runs {
		if !r.Reached100 || r.GPUArrived < 1.3 || r.Failed == 0 || r.GPUAllocatedAt100 <= 0 || r.GPUAllocatedAt100 > 1 {
			t.Fatalf("run %+v", r)
		}
		mean += r.GPUAllocatedAt100 / 4
	}
	if d := s.AllocatedAt100.Mean - mean; d > 1e-12 || d < -1e-12 || s.AllocatedAt100.Spread <= 0 ||
		s.UnallocatedAt100.Mean+s.AllocatedAt100.Mean < 1-1e-12 {
		t.Fatalf("summary %+v, mean of runs %v", s.AllocatedAt100, mean)
	}
	var buf bytes.Buffer
	if err := WriteSummaryTable(&buf, []Summary{s}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "GPU UNALLOCATED AT 100% ARRIVED") || !strings.Contains(buf.String(), " ± ") {
		t.Fatalf("table:\n%s", buf.String())
	}
	if _, err := RunInflated(sc, scheduler.PolicyBestFit, 90, 1); err == nil || !strings.Contains(err.Error(), "want at least 100") {
		t.Fatalf("inflating to 90%%: %v", err)
	}
}
