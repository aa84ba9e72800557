package scheduler

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestIndexDecidesAsAScan: with per-shape node indexes the fragmentation-
// aware policies make exactly the decisions of scoring every node, through
// placements, failures, removals, replicas of one deployment (whose spread
// tie-break depends on where its replicas are) and Plan's batches.
func TestIndexDecidesAsAScan(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	var nodes []Node
	kinds := []string{"l4", "t4", "a100"}
	for i := 0; i < 60; i++ {
		n := Node{Name: fmt.Sprintf("n%02d", i), Alive: i%17 != 3, CPUMilli: 32000, MemoryMiB: 131072,
			Labels: map[string]string{"zone": []string{"a", "b"}[i%2]}}
		for c := 0; c < []int{1, 2, 4, 8}[rng.IntN(4)]; c++ {
			n.Cards = append(n.Cards, Card{Index: c, Device: kinds[i%3], Healthy: c != 5})
		}
		nodes = append(nodes, n)
	}
	accs := []Accelerator{
		{Name: "share", Tenancy: Shared},
		{Name: "l4-share", Device: "l4", Tenancy: Shared, MaxModels: 3},
		{Name: "one", Tenancy: Dedicated, DevicesPerReplica: 1},
		{Name: "four", Tenancy: Dedicated, DevicesPerReplica: 4},
	}
	var reqs []Request
	for i := 0; i < 900; i++ {
		r := Request{Replica: fmt.Sprintf("r%d", i), Deployment: fmt.Sprintf("d%d", rng.IntN(40)),
			CPUMilli: int64(1000 * (1 + rng.IntN(6))), MemoryMiB: int64(4096 * rng.IntN(4))}
		switch f := rng.IntN(10); {
		case f < 5:
			r.Accelerator, r.Milli = "share", []int{250, 300, 500, 700}[rng.IntN(4)]
			if rng.IntN(4) == 0 {
				r.Devices = []string{"t4", "a100"}
			}
		case f < 6:
			r.Accelerator, r.Milli = "l4-share", 400
		case f < 8:
			r.Accelerator = "one"
		case f < 9:
			r.Accelerator = "four"
		}
		if rng.IntN(10) == 0 {
			r.Selector = map[string]string{"zone": "b"}
		}
		reqs = append(reqs, r)
	}
	for _, p := range []Policy{PolicyDefault, PolicyFGD} {
		idx, _ := NewState(nodes, accs)
		scan, _ := NewState(nodes, accs)
		scan.scanOnly = true
		idx.SetWorkload(reqs)
		scan.SetWorkload(reqs)
		placed, failed, removed := 0, 0, 0
		for i, r := range reqs {
			a, b := idx.Place(r, p), scan.Place(r, p)
			if a.String() != b.String() {
				t.Fatalf("%s: request %d: indexed %s, scan %s", p, i, a, b)
			}
			if a.Placed() {
				placed++
			} else {
				failed++
			}
			if i%7 == 0 && i > 0 {
				victim := reqs[rng.IntN(i)].Replica
				if idx.Remove(victim) != scan.Remove(victim) {
					t.Fatalf("removing %s differs", victim)
				}
				removed++
			}
		}
		if placed < 200 || failed < 50 {
			t.Fatalf("%s: %d placed, %d failed: the test wants both in numbers", p, placed, failed)
		}
		// Plan on States without a fixed workload: the index serves within
		// the plan only.
		pi, _ := NewState(nodes, accs)
		ps, _ := NewState(nodes, accs)
		ps.scanOnly = true
		da, db := pi.Plan(reqs[:400], p), ps.Plan(reqs[:400], p)
		for i := range da {
			if da[i].String() != db[i].String() {
				t.Fatalf("%s: plan %d: indexed %s, scan %s", p, i, da[i], db[i])
			}
		}
	}
}
