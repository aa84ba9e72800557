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
