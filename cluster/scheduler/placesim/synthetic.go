package placesim

import (
	"fmt"
	"math/rand/v2"

	"github.com/gpuplane/gpuplane/cluster/scheduler"
)

// Synthetic builds a deterministic gpuplane-style scenario for benchmarks:
// nodes of cardsPerNode cards of one kind each (half l4, 30 % a100-80gb,
// 20 % h100) in three zones, seven accelerators (shared with maxModels 2..4,
// dedicated with 1, 2 or 4 cards per replica), and arrivals of 200
// deployments with memory shares of 10..70 %, four in five of them shared.
// The same arguments always give the same scenario.
func Synthetic(nodes, cardsPerNode, arrivals int) *Scenario {
	rng := rand.New(rand.NewPCG(1, 2))
	sc := &Scenario{}
	zones := []string{"a", "b", "c"}
	for i := 0; i < nodes; i++ {
		kind, mem := "l4", int64(23034)
		switch f := i % 10; {
		case f >= 8:
			kind, mem = "h100", 81559
		case f >= 5:
			kind, mem = "a100-80gb", 81920
		}
		n := scheduler.Node{Name: fmt.Sprintf("node-%05d", i), Alive: true,
			Labels:   map[string]string{"zone": zones[i%len(zones)]},
			CPUMilli: 128000, MemoryMiB: 1 << 20}
		for c := 0; c < cardsPerNode; c++ {
			n.Cards = append(n.Cards, scheduler.Card{Index: c, Device: kind, MemoryMiB: mem, Healthy: true})
		}
		sc.Nodes = append(sc.Nodes, n)
	}
	sc.Accelerators = []scheduler.Accelerator{
		{Name: "l4-shared", Device: "l4", Tenancy: scheduler.Shared, MaxModels: 4},
		{Name: "l4-pair", Device: "l4", Tenancy: scheduler.Shared, MaxModels: 2},
		{Name: "l4-whole", Device: "l4", Tenancy: scheduler.Dedicated, DevicesPerReplica: 1},
		{Name: "a100-shared", Device: "a100-80gb", Tenancy: scheduler.Shared, MaxModels: 3},
		{Name: "a100-tp2", Device: "a100-80gb", Tenancy: scheduler.Dedicated, DevicesPerReplica: 2},
		{Name: "h100-shared", Device: "h100", Tenancy: scheduler.Shared, MaxModels: 2},
		{Name: "h100-tp4", Device: "h100", Tenancy: scheduler.Dedicated, DevicesPerReplica: 4},
	}
	shares := []int{100, 200, 250, 300, 450, 500, 700}
	type dep struct {
		name, acc string
		milli     int
		cpu       int64
		next      int
	}
	deps := make([]dep, 200)
	for i := range deps {
		a := sc.Accelerators[rng.IntN(len(sc.Accelerators))]
		if a.Tenancy == scheduler.Dedicated && rng.IntN(3) > 0 {
			// Four in five deployments share cards.
			a = sc.Accelerators[[]int{0, 1, 3, 5}[rng.IntN(4)]]
		}
		d := dep{name: fmt.Sprintf("model-%03d", i), acc: a.Name, cpu: int64(1000 * (1 + rng.IntN(8)))}
		if a.Tenancy == scheduler.Shared {
			d.milli = shares[rng.IntN(len(shares))]
		}
		deps[i] = d
	}
	for i := 0; i < arrivals; i++ {
		d := &deps[rng.IntN(len(deps))]
		sc.Arrivals = append(sc.Arrivals, scheduler.Request{
			Replica: fmt.Sprintf("%s-%d", d.name, d.next), Deployment: d.name,
			Accelerator: d.acc, Milli: d.milli, CPUMilli: d.cpu, MemoryMiB: d.cpu * 4,
		})
		d.next++
	}
	return sc
}
