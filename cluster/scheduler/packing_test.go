package scheduler

import (
	"fmt"
	"testing"
)

// generatedCluster builds std nodes with 4 cards and 32 cores each and one
// big node, last, with 4 cards and 64 cores: the only node a pod asking
// more than 32 cores fits, as openb's 128-core G3 nodes are for its
// 120-core 8-card tasks.
func generatedCluster(std int) []Node {
	var nodes []Node
	for i := 0; i <= std; i++ {
		n := Node{Name: fmt.Sprintf("std-%d", i), Alive: true, CPUMilli: 32000, MemoryMiB: 262144}
		if i == std {
			n.Name, n.CPUMilli = "big", 64000
		}
		for c := 0; c < 4; c++ {
			n.Cards = append(n.Cards, Card{Index: c, Device: "l4", Healthy: true, MemoryMiB: 24576})
		}
		nodes = append(nodes, n)
	}
	return nodes
}

// TestMultiCardPodsFindWholeCardsAfterShares: shared replicas of two sizes
// arrive first, then pods that need a whole node's four cards, one of them
// with more CPU than only the big node has. The cluster holds exactly what
// arrives, so the policy must pair the shares on as few cards as possible,
// on one node, and keep them off the big node: then every pod is placed.
// Spreading the shares (the spread policy) leaves no node with four free
// cards, which shows the test can fail.
func TestMultiCardPodsFindWholeCardsAfterShares(t *testing.T) {
	quad := Accelerator{Name: "quad", Device: "l4", Tenancy: Dedicated, DevicesPerReplica: 4}
	accs := []Accelerator{anyKind, quad}
	var arrivals []Request
	// 600s then 400s: pairs that fill a card only when put together.
	for i, milli := range []int{600, 600, 600, 600, 400, 400, 400, 400} {
		arrivals = append(arrivals, Request{Replica: fmt.Sprintf("s-%d", i), Deployment: fmt.Sprintf("s%d", i),
			Accelerator: "any", Milli: milli, CPUMilli: 2000, MemoryMiB: 8192})
	}
	arrivals = append(arrivals,
		Request{Replica: "wide-0", Deployment: "wide", Accelerator: "quad", CPUMilli: 48000, MemoryMiB: 65536},
		Request{Replica: "quad-0", Deployment: "quad0", Accelerator: "quad", CPUMilli: 16000, MemoryMiB: 65536},
		Request{Replica: "quad-1", Deployment: "quad1", Accelerator: "quad", CPUMilli: 16000, MemoryMiB: 65536},
	)
	place := func(p Policy) (placed int, nodes []Node, decisions []Decision) {
		s, err := NewState(generatedCluster(3), accs)
		if err != nil {
			t.Fatal(err)
		}
		s.SetWorkload(arrivals)
		for _, r := range arrivals {
			d := s.Place(r, p)
			if d.Placed() {
				placed++
			}
			decisions = append(decisions, d)
		}
		if err := Check(s.Nodes(), accs); err != nil {
			t.Fatalf("%s broke rule 11: %v", p, err)
		}
		return placed, s.Nodes(), decisions
	}
	for _, p := range []Policy{PolicyDefault, PolicyFGD} {
		placed, nodes, decisions := place(p)
		if placed != len(arrivals) {
			t.Errorf("%s placed %d of %d: %v", p, placed, len(arrivals), decisions)
			continue
		}
		// The shares sit in pairs on one node's four cards.
		shared := map[string]bool{}
		for _, n := range nodes {
			for _, c := range n.Cards {
				if len(c.Shares) > 0 && c.Accelerator == "any" {
					shared[n.Name] = true
					if c.Used() != FullCard {
						t.Errorf("%s: card %s/%d holds %d milli of shares, want a 600+400 pair", p, n.Name, c.Index, c.Used())
					}
				}
			}
		}
		if len(shared) != 1 || shared["big"] {
			t.Errorf("%s: shares on nodes %v, want one std node", p, shared)
		}
		if d := decisions[len(arrivals)-3]; d.Node != "big" {
			t.Errorf("%s: the 48-core pod went to %q, want big", p, d.Node)
		}
	}
	if placed, _, _ := place(PolicySpread); placed == len(arrivals) {
		t.Errorf("spread placed every pod; the cluster is not tight enough to tell policies apart")
	}
}

// TestNodesOnlySomeTasksFitStayWhole: a 4-card pod asking 48 cores fits
// only the big node. A 2-card pod arrives first; on a 32-core node it
// leaves the node's last two cards too little memory for the popular
// 1-card pods, on the big node it leaves room for all of them, so the
// paper's measure (fgd) sends it to the big node and the 48-core pod
// finds no home. The default policy weighs a task type by how few cards
// it could ever use, host capacity included (openb's 120-core 8-card tasks
// fit only its 128-core nodes), and keeps the big node whole.
func TestNodesOnlySomeTasksFitStayWhole(t *testing.T) {
	quad := Accelerator{Name: "quad", Device: "l4", Tenancy: Dedicated, DevicesPerReplica: 4}
	duo := Accelerator{Name: "duo", Device: "l4", Tenancy: Dedicated, DevicesPerReplica: 2}
	accs := []Accelerator{whole, duo, quad}
	nodes := generatedCluster(3)
	for i := range nodes {
		nodes[i].MemoryMiB = 65536
		if nodes[i].Name == "big" {
			nodes[i].MemoryMiB = 262144
		}
	}
	wide := Request{Replica: "wide-0", Deployment: "wide", Accelerator: "quad", CPUMilli: 48000, MemoryMiB: 65536}
	two := Request{Replica: "two-0", Deployment: "two", Accelerator: "duo", CPUMilli: 20000, MemoryMiB: 61440}
	workload := []Request{wide, two}
	for i := 0; i < 2; i++ {
		workload = append(workload, Request{Replica: fmt.Sprintf("m-%d", i), Accelerator: "whole", CPUMilli: 8000, MemoryMiB: 16384})
	}
	for i := 0; i < 6; i++ {
		workload = append(workload, Request{Replica: fmt.Sprintf("s-%d", i), Accelerator: "whole", CPUMilli: 2000, MemoryMiB: 2048})
	}
	run := func(p Policy) (Decision, Decision) {
		s, err := NewState(nodes, accs)
		if err != nil {
			t.Fatal(err)
		}
		s.SetWorkload(workload)
		d1 := s.Place(two, p)
		d2 := s.Place(wide, p)
		if err := Check(s.Nodes(), accs); err != nil {
			t.Fatalf("%s broke rule 11: %v", p, err)
		}
		return d1, d2
	}
	d1, d2 := run(PolicyDefault)
	if !d1.Placed() || d1.Node == "big" {
		t.Errorf("default put the 2-card pod on %q (%s), want a 32-core node", d1.Node, d1.Reason)
	}
	if !d2.Placed() || d2.Node != "big" {
		t.Errorf("default: the 48-core pod got %q (%s), want big", d2.Node, d2.Reason)
	}
	if f1, f2 := run(PolicyFGD); f1.Node != "big" || f2.Placed() {
		t.Logf("fgd no longer breaks the big node here (2-card pod on %q, 48-core pod on %q): the case no longer separates the policies", f1.Node, f2.Node)
	}
}

// TestNoCardLeftWithoutHostRoom: a 32-core 4-card node already holds two
// 1-card replicas and 13 cores; two empty 8-card nodes remain. A 1-card pod
// asking 18.7 cores would leave the small node's last card with 0.3 cores,
// usable by no pod of the workload ever again (nothing departs), while on
// an 8-card node it only breaks one of two nodes the rare 8-card pods
// could use. The default policy's scarcity measure alone prefers the small
// node (the 8-card pods, most of its weight, saw its free cards as
// fragment already, so filling it lowers the measure); charging dead
// capacity in full sends the pod to an 8-card node. The workload also has
// 1-card pods asking one core, so it asks less CPU per card than the
// cluster has and cards, not CPU, are what runs out
// (TestCPUBoundWorkloadFillsHostCPU is the same cluster without them).
func TestNoCardLeftWithoutHostRoom(t *testing.T) {
	s, one := cardOrCPUCase(t, 12)
	d := s.Place(one, PolicyDefault)
	if !d.Placed() || d.Node == "small" {
		t.Fatalf("default placed the 18.7-core pod on %q (%s), want an 8-card node: on small it strands a card", d.Node, d.Reason)
	}
	octoPod := Request{Replica: "octo-0", Deployment: "octo", Accelerator: "octo", CPUMilli: 88000, MemoryMiB: 327680}
	if d := s.Place(octoPod, PolicyDefault); !d.Placed() {
		t.Fatalf("the 8-card pod found no node: %s", d.Reason)
	}
}

// TestCPUBoundWorkloadFillsHostCPU: the cluster of
// TestNoCardLeftWithoutHostRoom with a workload of 18.7-core 1-card pods
// and one 88-core 8-card pod only: it asks 1.4 times the cluster's CPU per
// card, so CPU runs out before cards and a card left without cores is not
// what limits it. The default policy then packs CPU: the 18.7-core pod
// takes the small node's last 19 cores rather than leave them in a piece no
// pod of the workload can use after the large nodes' CPU is spent, and the
// 8-card pod still finds an 8-card node.
func TestCPUBoundWorkloadFillsHostCPU(t *testing.T) {
	s, one := cardOrCPUCase(t, 0)
	d := s.Place(one, PolicyDefault)
	if !d.Placed() || d.Node != "small" {
		t.Fatalf("default placed the 18.7-core pod on %q (%s), want small: the workload is CPU-bound and small's 19 free cores fit it", d.Node, d.Reason)
	}
	octoPod := Request{Replica: "octo-0", Deployment: "octo", Accelerator: "octo", CPUMilli: 88000, MemoryMiB: 327680}
	if d := s.Place(octoPod, PolicyDefault); !d.Placed() {
		t.Fatalf("the 8-card pod found no node: %s", d.Reason)
	}
}

// cardOrCPUCase builds the cluster of TestNoCardLeftWithoutHostRoom and a
// workload of one 88-core 8-card pod, twelve 18.7-core 1-card pods and
// light 1-core 1-card pods; it returns the State and the 18.7-core request.
func cardOrCPUCase(t *testing.T, light int) (*State, Request) {
	t.Helper()
	octo := Accelerator{Name: "octo", Device: "l4", Tenancy: Dedicated, DevicesPerReplica: 8}
	accs := []Accelerator{whole, octo}
	var nodes []Node
	for _, spec := range []struct {
		name  string
		cards int
		cpu   int64
	}{{"small", 4, 32000}, {"large-0", 8, 96000}, {"large-1", 8, 96000}} {
		n := Node{Name: spec.name, Alive: true, CPUMilli: spec.cpu, MemoryMiB: 393216}
		for c := 0; c < spec.cards; c++ {
			n.Cards = append(n.Cards, Card{Index: c, Device: "l4", Healthy: true, MemoryMiB: 24576})
		}
		nodes = append(nodes, n)
	}
	for c := 0; c < 2; c++ {
		nodes[0].Cards[c].Accelerator = "whole"
		nodes[0].Cards[c].Shares = []Share{{Replica: fmt.Sprintf("old-%d", c), Deployment: "old", Accelerator: "whole", Milli: FullCard}}
	}
	nodes[0].CPUUsedMilli = 13000
	one := Request{Replica: "one-0", Deployment: "one", Accelerator: "whole", CPUMilli: 18700, MemoryMiB: 65536}
	workload := []Request{{Replica: "octo", Accelerator: "octo", CPUMilli: 88000, MemoryMiB: 327680}}
	for i := 0; i < 12; i++ {
		workload = append(workload, one)
	}
	s, err := NewState(nodes, accs)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < light; i++ {
		workload = append(workload, Request{Replica: "light", Deployment: "light", Accelerator: "whole", CPUMilli: 1000, MemoryMiB: 4096})
	}
	s.SetWorkload(workload)
	return s, one
}
