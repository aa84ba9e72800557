package scheduler

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// cluster builds nodes n0..n(k-1), each with cards of one kind.
func cluster(nodes, cards int, kind string) []Node {
	var out []Node
	for i := 0; i < nodes; i++ {
		n := Node{Name: fmt.Sprintf("n%d", i), Alive: true}
		for c := 0; c < cards; c++ {
			n.Cards = append(n.Cards, Card{Index: c, Device: kind, Healthy: true, MemoryMiB: 24576})
		}
		out = append(out, n)
	}
	return out
}

var (
	small = Accelerator{Name: "small", Device: "l4", Tenancy: Shared, MaxModels: 2}
	fast  = Accelerator{Name: "fast", Device: "l4", Tenancy: Shared, MaxModels: 4}
	whole = Accelerator{Name: "whole", Device: "l4", Tenancy: Dedicated, DevicesPerReplica: 1}
	pair  = Accelerator{Name: "pair", Device: "l4", Tenancy: Dedicated, DevicesPerReplica: 2}
	accs  = []Accelerator{small, fast, whole, pair}

	home    = Accelerator{Name: "home", Device: "l4", Tenancy: Shared, MaxModels: 3}
	one     = Accelerator{Name: "one", Device: "l4", Tenancy: Shared, MaxModels: 4}
	anyKind = Accelerator{Name: "any", Tenancy: Shared}
	// every accelerator the tests build states with, for Check in mustPlace
	checked = append(append([]Accelerator(nil), accs...), home, one, anyKind)
)

func newState(t *testing.T, nodes []Node) *State {
	t.Helper()
	s, err := NewState(nodes, accs)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func share(id, acc string, milli int) Request {
	return Request{Replica: id, Deployment: strings.Split(id, "-")[0], Accelerator: acc, Milli: milli}
}

func mustPlace(t *testing.T, s *State, r Request, p Policy) Decision {
	t.Helper()
	d := s.Place(r, p)
	if !d.Placed() {
		t.Fatalf("place %s: %s", r.Replica, d.Reason)
	}
	if err := Check(s.Nodes(), checked); err != nil {
		t.Fatalf("after placing %s: %v", r.Replica, err)
	}
	return d
}

func mustFail(t *testing.T, s *State, r Request, p Policy, reason string) {
	t.Helper()
	d := s.Place(r, p)
	if d.Placed() {
		t.Fatalf("place %s: placed on %s cards %v, want failure %q", r.Replica, d.Node, d.Cards, reason)
	}
	if d.Reason != reason {
		t.Fatalf("place %s: reason\n got %q\nwant %q", r.Replica, d.Reason, reason)
	}
}

func TestSharesNeverExceedTheCard(t *testing.T) {
	for _, p := range Policies() {
		t.Run(string(p), func(t *testing.T) {
			s := newState(t, cluster(1, 1, "l4"))
			mustPlace(t, s, share("a-0", "fast", 450), p)
			mustPlace(t, s, share("b-0", "fast", 450), p)
			mustFail(t, s, share("c-0", "fast", 200), p, "no l4 card has 20% free: 1 card has at most 10% free")
			mustPlace(t, s, share("c-1", "fast", 100), p)
			mustFail(t, s, share("d-0", "fast", 1), p, "no l4 card has 0.1% free: 1 card has at most 0% free")
		})
	}
}

func TestMaxModels(t *testing.T) {
	s := newState(t, cluster(1, 1, "l4"))
	mustPlace(t, s, share("a-0", "small", 100), PolicyDefault)
	mustPlace(t, s, share("b-0", "small", 100), PolicyDefault)
	mustFail(t, s, share("c-0", "small", 100), PolicyDefault,
		"no l4 card has 10% free: 1 card already holds 2 replicas (maxModels)")
}

func TestCardBinding(t *testing.T) {
	s := newState(t, cluster(1, 2, "l4"))
	d := mustPlace(t, s, share("a-0", "fast", 300), PolicyBestFit)
	// The other accelerator may not use the bound card, only the free one.
	e := mustPlace(t, s, share("b-0", "small", 300), PolicyBestFit)
	if e.Cards[0] == d.Cards[0] {
		t.Fatalf("small was placed on card %d, bound to fast", e.Cards[0])
	}
	if f := mustPlace(t, s, share("c-0", "small", 300), PolicyBestFit); f.Cards[0] != e.Cards[0] {
		t.Fatalf("second small replica on card %d, want its own bound card %d", f.Cards[0], e.Cards[0])
	}
}

func TestCardBindingReason(t *testing.T) {
	s := newState(t, cluster(1, 4, "l4"))
	for i := 0; i < 2; i++ {
		mustPlace(t, s, share(fmt.Sprintf("f-%d", i), "fast", 500), PolicySpread)
	}
	for i := 0; i < 2; i++ {
		mustPlace(t, s, share(fmt.Sprintf("s-%d", i), "small", 700), PolicySpread)
	}
	// docs/descriptors.md rule 12's own example.
	mustFail(t, s, share("x-0", "small", 450), PolicyDefault,
		`no l4 card has 45% free: 2 cards bound to "fast", 2 cards have at most 30% free`)
	// Removing a replica unbinds its card once it is empty.
	if !s.Remove("f-0") || !s.Remove("f-1") {
		t.Fatal("remove failed")
	}
	d := mustPlace(t, s, share("x-0", "small", 450), PolicyDefault)
	if d.Cards[0] > 1 {
		t.Fatalf("x-0 on card %d, want a card freed by fast", d.Cards[0])
	}
}

func TestDedicatedTakesWholeCards(t *testing.T) {
	s := newState(t, cluster(1, 2, "l4"))
	mustPlace(t, s, share("a-0", "fast", 100), PolicyDefault)
	d := mustPlace(t, s, Request{Replica: "w-0", Deployment: "w", Accelerator: "whole"}, PolicyDefault)
	if d.Milli != FullCard || len(d.Cards) != 1 {
		t.Fatalf("dedicated decision %v, want one card at 100%%", d)
	}
	mustFail(t, s, Request{Replica: "w-1", Deployment: "w", Accelerator: "whole"}, PolicyDefault,
		`no free l4 card: 1 card bound to "fast", 1 card already holds a replica of "whole"`)
	// A share never joins a dedicated card.
	mustFail(t, s, share("b-0", "small", 10), PolicyDefault,
		`no l4 card has 1% free: 1 card bound to "fast", 1 card bound to "whole"`)
}

func TestDevicesPerReplicaOnOneNode(t *testing.T) {
	s := newState(t, cluster(2, 2, "l4"))
	// One card used on each node: 2 free cards in all, but not on one node.
	mustPlace(t, s, share("a-0", "fast", 100), PolicySpread)
	mustPlace(t, s, share("a-1", "fast", 100), PolicySpread)
	mustFail(t, s, Request{Replica: "p-0", Deployment: "p", Accelerator: "pair"}, PolicyDefault,
		`no node has 2 free l4 cards: 2 cards bound to "fast", 2 nodes have at most 1 free card`)
	s.Remove("a-1")
	d := mustPlace(t, s, Request{Replica: "p-0", Deployment: "p", Accelerator: "pair"}, PolicyDefault)
	if d.Node != "n1" || !slices.Equal(d.Cards, []int{0, 1}) {
		t.Fatalf("pair placed as %v, want n1 cards 0,1", d)
	}
}

func TestDownNodesAndUnhealthyCards(t *testing.T) {
	nodes := cluster(3, 2, "l4")
	nodes[0].Alive = false
	nodes[1].Cards[0].Healthy = false
	nodes[1].Cards[1].Healthy = false
	nodes[2].Cards[1].Healthy = false
	s := newState(t, nodes)
	d := mustPlace(t, s, share("a-0", "fast", 900), PolicySpread)
	if d.Node != "n2" || d.Cards[0] != 0 {
		t.Fatalf("placed %v, want n2 card 0, the only live healthy card", d)
	}
	mustFail(t, s, share("b-0", "small", 200), PolicySpread,
		`no l4 card has 20% free: 1 node down (2 cards), 3 cards unhealthy, 1 card bound to "fast"`)
}

func TestLabelSelector(t *testing.T) {
	nodes := cluster(2, 1, "l4")
	nodes[1].Labels = map[string]string{"zone": "b", "tier": "gold"}
	s := newState(t, nodes)
	r := share("a-0", "fast", 500)
	r.Selector = map[string]string{"zone": "b"}
	if d := mustPlace(t, s, r, PolicyDefault); d.Node != "n1" {
		t.Fatalf("placed on %s, want n1 (zone=b)", d.Node)
	}
	r = share("a-1", "fast", 600)
	r.Selector = map[string]string{"zone": "b", "tier": "gold"}
	mustFail(t, s, r, PolicyDefault,
		"no l4 card has 60% free: 1 node does not match selector tier=gold,zone=b, 1 card has at most 50% free")
}

func TestHostResources(t *testing.T) {
	nodes := cluster(2, 2, "l4")
	nodes[0].CPUMilli, nodes[0].MemoryMiB = 8000, 16384
	nodes[1].CPUMilli, nodes[1].MemoryMiB = 4000, 65536
	s := newState(t, nodes)
	r := share("a-0", "fast", 100)
	r.CPUMilli, r.MemoryMiB = 6000, 8192
	if d := mustPlace(t, s, r, PolicyDefault); d.Node != "n0" {
		t.Fatalf("placed on %s, want n0, the only node with 6 CPUs", d.Node)
	}
	r = share("a-1", "fast", 100)
	r.CPUMilli, r.MemoryMiB = 5000, 20000
	mustFail(t, s, r, PolicyDefault,
		"no l4 card has 10% free: 2 nodes have at most 4000m CPU and 65536 MiB memory free")
	// Host-only requests (openb's CPU tasks) use no card.
	d := mustPlace(t, s, Request{Replica: "cpu-0", Deployment: "cpu", CPUMilli: 4000}, PolicyBestFit)
	if len(d.Cards) != 0 {
		t.Fatalf("host-only request got cards %v", d.Cards)
	}
	mustFail(t, s, Request{Replica: "cpu-1", Deployment: "cpu", CPUMilli: 3000}, PolicyBestFit,
		"no node has 3000m CPU free: 2 nodes have at most 2000m CPU free")
}

func TestRequestErrors(t *testing.T) {
	s := newState(t, cluster(1, 1, "l4"))
	mustPlace(t, s, share("a-0", "fast", 100), PolicyDefault)
	mustFail(t, s, share("a-0", "fast", 100), PolicyDefault, "replica a-0 is already placed on node n0")
	mustFail(t, s, share("b-0", "nope", 100), PolicyDefault, `accelerator "nope" does not exist`)
	mustFail(t, s, share("b-0", "fast", 0), PolicyDefault, "share of 0 milli-cards is outside 1..1000")
	s2, err := NewState(cluster(1, 1, "t4"), accs)
	if err != nil {
		t.Fatal(err)
	}
	mustFail(t, s2, share("b-0", "fast", 100), PolicyDefault, "no l4 cards in the cluster")
}

func TestDeviceSet(t *testing.T) {
	nodes := append(cluster(1, 1, "v100m16"), cluster(1, 1, "p100")...)
	nodes[1].Name = "p"
	s, err := NewState(nodes, []Accelerator{anyKind})
	if err != nil {
		t.Fatal(err)
	}
	r := Request{Replica: "a", Deployment: "a", Accelerator: "any", Milli: 500, Devices: []string{"p100", "t4"}}
	if d := mustPlace(t, s, r, PolicyDefault); d.Node != "p" {
		t.Fatalf("placed on %s, want the p100 node", d.Node)
	}
	r = Request{Replica: "b", Deployment: "b", Accelerator: "any", Milli: 600, Devices: []string{"p100", "t4"}}
	mustFail(t, s, r, PolicyDefault, "no p100|t4 card has 60% free: 1 card has at most 50% free")
}

func TestSpreadTieBreak(t *testing.T) {
	// Every policy spreads a deployment's replicas over equal nodes.
	for _, p := range Policies() {
		t.Run(string(p), func(t *testing.T) {
			s := newState(t, cluster(3, 1, "l4"))
			seen := map[string]bool{}
			for i := 0; i < 3; i++ {
				d := mustPlace(t, s, Request{Replica: fmt.Sprintf("w-%d", i), Deployment: "w", Accelerator: "whole"}, p)
				seen[d.Node] = true
			}
			if len(seen) != 3 {
				t.Fatalf("replicas on %v, want 3 nodes", seen)
			}
		})
	}
	// The spread policy also spreads shared replicas over cards.
	s := newState(t, cluster(1, 2, "l4"))
	a := mustPlace(t, s, share("m-0", "fast", 100), PolicySpread)
	b := mustPlace(t, s, share("m-1", "fast", 100), PolicySpread)
	if a.Cards[0] == b.Cards[0] {
		t.Fatalf("spread put both replicas on card %d", a.Cards[0])
	}
}

func TestBestFitPacks(t *testing.T) {
	s := newState(t, cluster(2, 1, "l4"))
	mustPlace(t, s, share("a-0", "fast", 300), PolicyBestFit)
	d := mustPlace(t, s, share("b-0", "fast", 300), PolicyBestFit)
	if d.Node != "n0" {
		t.Fatalf("bestfit placed b-0 on %s, want n0 next to a-0", d.Node)
	}
}

func TestFGDAvoidsBreakingWholeCards(t *testing.T) {
	// n0's card is partly used; the workload also needs whole cards, so a
	// share should go next to the existing one rather than break n1's card,
	// even though spreading would prefer n1.
	nodes := cluster(2, 1, "l4")
	s := newState(t, nodes)
	s.SetWorkload([]Request{share("x-0", "fast", 300), {Replica: "w", Accelerator: "whole"}})
	mustPlace(t, s, share("a-0", "fast", 300), PolicyFGD)
	for _, p := range []Policy{PolicyFGD, PolicyDefault} {
		d := s.Place(share(fmt.Sprintf("b-%s", p), "fast", 300), p)
		if d.Node != "n0" {
			t.Fatalf("%s placed %v, want n0", p, d)
		}
	}
	if d := mustPlace(t, s, Request{Replica: "w-0", Deployment: "w", Accelerator: "whole"}, PolicyFGD); d.Node != "n1" {
		t.Fatalf("whole card went to %s", d.Node)
	}
}

func TestPlanIsDeterministic(t *testing.T) {
	nodes := cluster(4, 4, "l4")
	var reqs []Request
	for i := 0; i < 30; i++ {
		reqs = append(reqs, share(fmt.Sprintf("d%d-%d", i%5, i), []string{"fast", "small"}[i%2], 100+(i*137)%600))
	}
	for _, p := range Policies() {
		a := newState(t, nodes).Plan(reqs, p)
		b := newState(t, nodes).Plan(reqs, p)
		if fmt.Sprint(a) != fmt.Sprint(b) {
			t.Fatalf("%s: two runs differ", p)
		}
	}
}

func TestNewStateRejectsBrokenView(t *testing.T) {
	nodes := cluster(1, 1, "l4")
	nodes[0].Cards[0].Accelerator = "fast"
	nodes[0].Cards[0].Shares = []Share{{Replica: "a", Accelerator: "fast", Milli: 600}, {Replica: "b", Accelerator: "fast", Milli: 600}}
	if _, err := NewState(nodes, accs); err == nil || !strings.Contains(err.Error(), "shares sum to 120%, over 100%") {
		t.Fatalf("NewState error %v, want the over-commit named", err)
	}
}

func TestParsePolicy(t *testing.T) {
	for in, want := range map[string]Policy{"": PolicyDefault, "default": PolicyDefault, "gpuplane": PolicyDefault,
		"FGD": PolicyFGD, "bestfit": PolicyBestFit, "spread": PolicySpread} {
		if got, err := ParsePolicy(in); err != nil || got != want {
			t.Errorf("ParsePolicy(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := ParsePolicy("random"); err == nil {
		t.Error("ParsePolicy(random) succeeded")
	}
}
