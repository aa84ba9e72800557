package scheduler

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

func TestCheckFindsEachViolation(t *testing.T) {
	sh := func(id, acc string, milli int) Share {
		return Share{Replica: id, Deployment: id, Accelerator: acc, Milli: milli}
	}
	for _, tc := range []struct {
		name  string
		cards [][]Share // node n0's cards; bound to the first share's accelerator
		want  string
	}{
		{"over 100%", [][]Share{{sh("a", "fast", 600), sh("b", "fast", 500)}}, "node n0 card 0: shares sum to 110%, over 100%"},
		{"maxModels", [][]Share{{sh("a", "small", 100), sh("b", "small", 100), sh("c", "small", 100)}},
			`node n0 card 0 holds 3 replicas of "small", over maxModels 2`},
		{"two accelerators", [][]Share{{sh("a", "fast", 100), sh("b", "small", 100)}},
			`node n0 card 0 is bound to "fast" but holds replica b of accelerator "small"`},
		{"dedicated shared", [][]Share{{sh("a", "whole", 1000), sh("b", "whole", 1000)}}, `node n0 card 0 is dedicated to "whole" but holds 2 replicas`},
		{"dedicated partial", [][]Share{{sh("a", "whole", 500)}}, `node n0 card 0 is dedicated to "whole" but holds 1 replicas using 50%`},
		{"pair on one card", [][]Share{{sh("p", "pair", 1000)}}, "replica p holds 1 cards of n0, want 2"},
		{"share on two cards", [][]Share{{sh("a", "fast", 100)}, {sh("a", "fast", 100)}}, "replica a holds 2 cards of n0, want 1"},
		{"bad share", [][]Share{{sh("a", "fast", 0)}}, "share 0 milli, outside 1..1000"},
		{"unknown accelerator", [][]Share{{sh("a", "gone", 100)}}, `bound to unknown accelerator "gone"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nodes := cluster(1, len(tc.cards), "l4")
			for i, shares := range tc.cards {
				nodes[0].Cards[i].Shares = shares
				nodes[0].Cards[i].Accelerator = shares[0].Accelerator
			}
			err := Check(nodes, accs)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Check = %v, want it to contain %q", err, tc.want)
			}
		})
	}
	// A replica split over two nodes, and host over-commit.
	nodes := cluster(2, 1, "l4")
	for i := range nodes {
		nodes[i].Cards[0].Accelerator = "pair"
		nodes[i].Cards[0].Shares = []Share{sh("p", "pair", 1000)}
	}
	nodes[1].CPUMilli, nodes[1].CPUUsedMilli = 1000, 2000
	err := Check(nodes, accs)
	for _, want := range []string{"replica p is on node n0 and on node n1", "node n1: 2000m CPU reserved of 1000m"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Check = %v, want it to contain %q", err, want)
		}
	}
	if err := Check(cluster(2, 2, "l4"), accs); err != nil {
		t.Errorf("Check of an empty cluster: %v", err)
	}
}

// TestRandomPlansKeepRule11 drives every policy with random requests and
// removals over random clusters and re-checks the state after each step
// with Check, and each decision against the view it was made on.
func TestRandomPlansKeepRule11(t *testing.T) {
	kinds := []string{"l4", "t4", "h100"}
	total := 0
	for seed := uint64(1); seed <= 12; seed++ {
		rng := rand.New(rand.NewPCG(seed, 7))
		var nodes []Node
		for i := 0; i < 2+rng.IntN(8); i++ {
			n := Node{Name: fmt.Sprintf("n%d", i), Alive: rng.IntN(6) > 0,
				Labels: map[string]string{"zone": []string{"a", "b"}[rng.IntN(2)]}}
			if rng.IntN(2) == 0 {
				n.CPUMilli, n.MemoryMiB = int64(4000+rng.IntN(60000)), int64(8192+rng.IntN(100000))
			}
			for c := 0; c < 1+rng.IntN(8); c++ {
				n.Cards = append(n.Cards, Card{Index: c, Device: kinds[rng.IntN(2)+c%2], Healthy: rng.IntN(8) > 0})
			}
			nodes = append(nodes, n)
		}
		var as []Accelerator
		for i := 0; i < 5; i++ {
			a := Accelerator{Name: fmt.Sprintf("a%d", i), Device: kinds[rng.IntN(len(kinds))]}
			if rng.IntN(3) > 0 {
				a.Tenancy, a.MaxModels = Shared, rng.IntN(4)
			} else {
				a.DevicesPerReplica = 1 + rng.IntN(3)
			}
			as = append(as, a)
		}
		for _, p := range Policies() {
			s, err := NewState(nodes, as)
			if err != nil {
				t.Fatal(err)
			}
			var placed []string
			for step := 0; step < 300; step++ {
				if len(placed) > 0 && rng.IntN(5) == 0 {
					i := rng.IntN(len(placed))
					if !s.Remove(placed[i]) {
						t.Fatalf("seed %d %s: remove %s failed", seed, p, placed[i])
					}
					placed = append(placed[:i], placed[i+1:]...)
					continue
				}
				a := as[rng.IntN(len(as))]
				r := Request{Replica: fmt.Sprintf("r%d", step), Deployment: fmt.Sprintf("d%d", rng.IntN(6)),
					Accelerator: a.Name, Milli: 1 + rng.IntN(1000)}
				if rng.IntN(3) == 0 {
					r.CPUMilli, r.MemoryMiB = int64(rng.IntN(16000)), int64(rng.IntN(32768))
				}
				if rng.IntN(4) == 0 {
					r.Selector = map[string]string{"zone": "a"}
				}
				before := s.Nodes()
				d := s.Place(r, p)
				if d.Placed() {
					placed = append(placed, r.Replica)
					total++
					verifyDecision(t, before, a, r, d)
				} else if d.Reason == "" || strings.Contains(d.Reason, "%!") {
					t.Fatalf("seed %d %s: bad reason %q", seed, p, d.Reason)
				}
				if err := Check(s.Nodes(), as); err != nil {
					t.Fatalf("seed %d %s step %d: %v", seed, p, step, err)
				}
			}
		}
	}
	if total < 1000 {
		t.Fatalf("only %d placements in all: the test exercises too little", total)
	}
}

// verifyDecision checks a placement against the view it was made on.
func verifyDecision(t *testing.T, view []Node, a Accelerator, r Request, d Decision) {
	t.Helper()
	var n *Node
	for i := range view {
		if view[i].Name == d.Node {
			n = &view[i]
		}
	}
	if n == nil || !n.Alive {
		t.Fatalf("%s placed on missing or down node %q", r.Replica, d.Node)
	}
	for k, v := range r.Selector {
		if n.Labels[k] != v {
			t.Fatalf("%s placed on %s whose labels %v miss %s=%s", r.Replica, n.Name, n.Labels, k, v)
		}
	}
	if len(d.Cards) != a.cardsPerReplica() {
		t.Fatalf("%s got %d cards, want %d", r.Replica, len(d.Cards), a.cardsPerReplica())
	}
	for _, ci := range d.Cards {
		c := n.Cards[ci]
		if !c.Healthy || c.Device != a.Device {
			t.Fatalf("%s placed on card %d (%s, healthy %v), want a healthy %s", r.Replica, ci, c.Device, c.Healthy, a.Device)
		}
	}
}
