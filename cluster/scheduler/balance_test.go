package scheduler

import (
	"fmt"
	"testing"
)

// oneCard is a whole card of any kind, as openb's 1-card tasks.
var oneCard = Accelerator{Name: "one", Tenancy: Dedicated, DevicesPerReplica: 1}

func cardNode(name, device string, cards int, cpuMilli int64) Node {
	n := Node{Name: name, Alive: true, CPUMilli: cpuMilli, MemoryMiB: 1 << 20}
	for c := 0; c < cards; c++ {
		n.Cards = append(n.Cards, Card{Index: c, Device: device, Healthy: true, MemoryMiB: 24576})
	}
	return n
}

// placeAll places the arrivals in order under p, packing for them, and
// returns how many were placed and the decisions.
func placeAll(t *testing.T, nodes []Node, accs []Accelerator, arrivals []Request, p Policy) (int, []Decision) {
	t.Helper()
	s, err := NewState(nodes, accs)
	if err != nil {
		t.Fatal(err)
	}
	s.SetWorkload(arrivals)
	placed := 0
	var ds []Decision
	for _, r := range arrivals {
		d := s.Place(r, p)
		if d.Placed() {
			placed++
		}
		ds = append(ds, d)
	}
	if err := Check(s.Nodes(), accs); err != nil {
		t.Fatalf("%s broke rule 11: %v", p, err)
	}
	return placed, ds
}

// TestCPUHungryTasksGoWhereCPUFeedsTheCards: two 8-card nodes, one with 32
// cores and one with 128. Two 1-card tasks asking 12 cores arrive first,
// then fourteen asking 4. Each 12-core task on the 32-core node uses the
// cores of three cards and leaves two cards without any; on the 128-core
// node the cores are plenty. The default policy must put them where their
// cores do not strand cards, and then place every task. Bestfit, which
// fills the fuller node, strands cards and shows the test can fail.
func TestCPUHungryTasksGoWhereCPUFeedsTheCards(t *testing.T) {
	nodes := []Node{cardNode("tight", "l4", 8, 32000), cardNode("roomy", "l4", 8, 128000)}
	accs := []Accelerator{oneCard}
	var arrivals []Request
	for i := 0; i < 2; i++ {
		arrivals = append(arrivals, Request{Replica: fmt.Sprintf("hungry-%d", i), Deployment: fmt.Sprintf("hungry%d", i),
			Accelerator: "one", CPUMilli: 12000})
	}
	for i := 0; i < 14; i++ {
		arrivals = append(arrivals, Request{Replica: fmt.Sprintf("t-%d", i), Deployment: fmt.Sprintf("t%d", i),
			Accelerator: "one", CPUMilli: 4000})
	}
	placed, ds := placeAll(t, nodes, accs, arrivals, PolicyDefault)
	for _, d := range ds[:2] {
		if d.Node != "roomy" {
			t.Errorf("12-core task %s went to %s, want roomy", d.Replica, d.Node)
		}
	}
	if placed != len(arrivals) {
		t.Errorf("default placed %d of %d tasks, want all: the cluster has the cards and cores for them", placed, len(arrivals))
	}
	if placed, _ := placeAll(t, nodes, accs, arrivals, PolicyBestFit); placed == len(arrivals) {
		t.Errorf("bestfit placed all %d too; the test no longer tells the policies apart", placed)
	}
}

// TestUntypedWorkLeavesTypedTasksTheirKind: a 2-card T4 node and an 8-card
// L4 node; six 1-card tasks that run on any kind arrive, then four that
// need a T4 (two of them can ever run), then an 8-card task (which cannot
// fit once anything is on the L4 node). Fragmentation alone prefers breaking the small node to
// breaking the last 8-card set, so the untyped tasks take the T4 cards and
// the T4 tasks find none (the fgd policy shows the test can fail). The
// default policy must leave the T4 cards to the tasks that can use nothing
// else.
func TestUntypedWorkLeavesTypedTasksTheirKind(t *testing.T) {
	eight := Accelerator{Name: "eight", Tenancy: Dedicated, DevicesPerReplica: 8}
	nodes := []Node{cardNode("t4-0", "t4", 2, 16000), cardNode("l4-0", "l4", 8, 96000)}
	accs := []Accelerator{oneCard, eight}
	var arrivals []Request
	for i := 0; i < 6; i++ {
		arrivals = append(arrivals, Request{Replica: fmt.Sprintf("u-%d", i), Deployment: fmt.Sprintf("u%d", i),
			Accelerator: "one", CPUMilli: 8000})
	}
	for i := 0; i < 4; i++ {
		arrivals = append(arrivals, Request{Replica: fmt.Sprintf("t4-%d", i), Deployment: fmt.Sprintf("t4%d", i),
			Accelerator: "one", CPUMilli: 8000, Devices: []string{"t4"}})
	}
	arrivals = append(arrivals, Request{Replica: "wide", Deployment: "wide", Accelerator: "eight", CPUMilli: 32000})
	typedPlaced := func(ds []Decision) (n int) {
		for _, d := range ds[6:10] {
			if d.Placed() {
				n++
			}
		}
		return n
	}
	_, ds := placeAll(t, nodes, accs, arrivals, PolicyDefault)
	for _, d := range ds[:6] {
		if d.Node == "t4-0" {
			t.Errorf("untyped %s took a T4 card while L4 cards were free", d.Replica)
		}
	}
	if n := typedPlaced(ds); n != 2 {
		t.Errorf("default placed %d of the T4 tasks, want 2 (the T4 cards): %v", n, ds[6:10])
	}
	if _, ds := placeAll(t, nodes, accs, arrivals, PolicyFGD); typedPlaced(ds) == 2 {
		t.Errorf("fgd placed two T4 tasks too; the test no longer tells the policies apart")
	}
}

// TestCPUHungryTasksLeaveTheOnlyRoomyNodeWhole: one 8-card node with 128
// cores and two with 96, as openb's G3 and G2 nodes. Two 1-card tasks
// asking 24 cores arrive, then an 8-card task asking 120 cores, which only
// the 128-core node can hold, then many 1-card tasks asking 11 cores (the
// workload's CPU per card is about 11 cores, so a 24-core task on a 96-core
// node leaves a card its CPU can no longer feed, and on the 128-core node
// none). Counting only the cards left without CPU, the 128-core node looks
// the cheaper place and the 8-card task then finds no node; the default
// policy must keep that node whole for it.
func TestCPUHungryTasksLeaveTheOnlyRoomyNodeWhole(t *testing.T) {
	eight := Accelerator{Name: "eight", Tenancy: Dedicated, DevicesPerReplica: 8}
	nodes := []Node{cardNode("g2-0", "g2", 8, 96000), cardNode("g3", "g3", 8, 128000), cardNode("g2-1", "g2", 8, 96000)}
	accs := []Accelerator{oneCard, eight}
	var arrivals []Request
	for i := 0; i < 2; i++ {
		arrivals = append(arrivals, Request{Replica: fmt.Sprintf("hungry-%d", i), Deployment: fmt.Sprintf("hungry%d", i),
			Accelerator: "one", CPUMilli: 24000})
	}
	arrivals = append(arrivals, Request{Replica: "wide", Deployment: "wide", Accelerator: "eight", CPUMilli: 120000})
	for i := 0; i < 200; i++ {
		arrivals = append(arrivals, Request{Replica: fmt.Sprintf("t-%d", i), Deployment: fmt.Sprintf("t%d", i),
			Accelerator: "one", CPUMilli: 11000})
	}
	_, ds := placeAll(t, nodes, accs, arrivals, PolicyDefault)
	for _, d := range ds[:2] {
		if d.Node == "g3" {
			t.Errorf("24-core task %s broke the only node the 120-core task fits", d.Replica)
		}
	}
	if d := ds[2]; d.Node != "g3" {
		t.Errorf("the 8-card 120-core task was not placed on g3: %+v", d)
	}
}
