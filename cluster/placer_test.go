package cluster

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/gpuplane/gpuplane/cluster/scheduler"
	"github.com/gpuplane/gpuplane/fsm"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// checkRule11 is an independent check of docs/descriptors.md rule 11 (as docs/residency.md restates it)
// over the state machine's replicas: on each card the reserved shares
// (pinned and warm) sum to ≤ 100 %, each onDemand share fits in the card
// minus its pinned shares, at most maxModels replicas, one accelerator per
// card, a dedicated card holds one pinned replica, and every placed replica
// sits on live cards of its device.
func checkRule11(f *fsm.FSM) error {
	type use struct {
		milli    uint32 // reserved
		pinned   uint32
		odMax    uint32
		replicas int
		accs     map[string]bool
	}
	residency := map[string]pb.Residency{}
	for _, m := range f.Models() {
		residency[m.Name] = m.Spec.GetResidency()
	}
	nodes := map[string]*pb.Node{}
	for _, n := range f.Nodes() {
		nodes[n.Name] = n
	}
	accs := map[string]*pb.AcceleratorSpec{}
	for _, a := range f.Accelerators() {
		accs[a.Name] = a.Spec
	}
	cards := map[string]*use{}
	for _, r := range f.Replicas("", "") {
		if r.Node == "" {
			if len(r.Cards) != 0 || r.ShareMilli != 0 {
				return fmt.Errorf("pending replica %s/%d holds cards", r.Model, r.Index)
			}
			continue
		}
		n := nodes[r.Node]
		if n == nil || n.Status != pb.NodeStatus_NODE_STATUS_ALIVE {
			return fmt.Errorf("replica %s/%d placed on missing or dead node %q", r.Model, r.Index, r.Node)
		}
		acc := accs[r.Accelerator]
		if acc == nil {
			return fmt.Errorf("replica %s/%d placed for missing accelerator %q", r.Model, r.Index, r.Accelerator)
		}
		for _, idx := range r.Cards {
			var card *pb.Card
			for _, c := range n.Cards {
				if c.Index == idx {
					card = c
				}
			}
			if card == nil || card.Device != acc.Device {
				return fmt.Errorf("replica %s/%d on card %s/%d of the wrong device", r.Model, r.Index, r.Node, idx)
			}
			k := fmt.Sprintf("%s/%d", r.Node, idx)
			u := cards[k]
			if u == nil {
				u = &use{accs: map[string]bool{}}
				cards[k] = u
			}
			switch res := residency[r.Model]; res {
			case pb.Residency_RESIDENCY_ON_DEMAND:
				u.odMax = max(u.odMax, r.ShareMilli)
			case pb.Residency_RESIDENCY_WARM:
				u.milli += r.ShareMilli
			case pb.Residency_RESIDENCY_UNSPECIFIED: // pinned, the default
				u.milli += r.ShareMilli
				u.pinned += r.ShareMilli
			default:
				return fmt.Errorf("replica %s/%d of a deployment with residency %v", r.Model, r.Index, res)
			}
			u.replicas++
			u.accs[r.Accelerator] = true
			switch {
			case u.milli > 1000:
				return fmt.Errorf("card %s over-committed: %d‰ reserved", k, u.milli)
			case u.pinned+u.odMax > 1000:
				return fmt.Errorf("card %s: an onDemand share of %d‰ beside %d‰ pinned", k, u.odMax, u.pinned)
			case acc.Tenancy != pb.Tenancy_TENANCY_SHARED && residency[r.Model] != pb.Residency_RESIDENCY_UNSPECIFIED:
				return fmt.Errorf("dedicated card %s holds a %v replica", k, residency[r.Model])
			case len(u.accs) > 1:
				return fmt.Errorf("card %s bound to %d accelerators", k, len(u.accs))
			case acc.Tenancy == pb.Tenancy_TENANCY_SHARED && uint32(u.replicas) > acc.MaxModels:
				return fmt.Errorf("card %s holds %d replicas, maxModels %d", k, u.replicas, acc.MaxModels)
			case acc.Tenancy != pb.Tenancy_TENANCY_SHARED && u.replicas > 1:
				return fmt.Errorf("dedicated card %s holds %d replicas", k, u.replicas)
			}
		}
	}
	// The state machine's own card index (what devices get shows) must agree
	// with the replicas.
	for _, d := range f.Devices() {
		_, statuses, _ := f.Device(d.Name)
		for _, cs := range statuses {
			k := fmt.Sprintf("%s/%d", cs.Node, cs.Index)
			want := 0
			if u := cards[k]; u != nil {
				want = u.replicas
			}
			if len(cs.Replicas) != want {
				return fmt.Errorf("card %s lists %d replicas, %d are placed on it", k, len(cs.Replicas), want)
			}
		}
	}
	return nil
}

// TestRule11UnderRandomInterleavings applies random streams of deployments,
// scaling, deletions, node failures and recoveries, and scheduling plans —
// including plans made on stale state (as two racing leaders or a delayed
// proposal would make them) and hand-made over-committing ones — and checks
// rule 11 after every applied entry. Plans are what the real scheduler
// proposes; the state machine alone must keep them honest.
func TestRule11UnderRandomInterleavings(t *testing.T) {
	policies := scheduler.Policies()
	for seed := uint64(1); seed <= 30; seed++ {
		rng := rand.New(rand.NewPCG(seed, 42))
		f := fsm.New()
		index := uint64(0)
		apply := func(env *pb.Envelope) *pb.Result {
			index++
			res := f.Apply(index, env)
			if err := checkRule11(f); err != nil {
				t.Fatalf("seed %d, entry %d (%v): rule 11 broken: %v", seed, index, env.GetCommand(), err)
			}
			return res
		}
		for i := 0; i < 4; i++ {
			var cards []*pb.Card
			for c := 0; c < 1+rng.IntN(4); c++ {
				dev := []string{"l4", "h100"}[rng.IntN(2)]
				cards = append(cards, &pb.Card{Index: uint32(c), Uuid: fmt.Sprintf("n%d-%d", i, c), Device: dev, MemoryMib: 23034, Healthy: rng.IntN(10) > 0})
			}
			apply(&pb.Envelope{Command: &pb.Envelope_RegisterNode{RegisterNode: &pb.RegisterNode{Node: &pb.Node{
				Name: fmt.Sprintf("n%d", i), Role: pb.NodeRole_NODE_ROLE_CLIENT, Cards: cards}}}})
		}
		for _, a := range []*pb.CreateAccelerator{
			{Name: "shared-l4", Spec: &pb.AcceleratorSpec{Device: "l4", Tenancy: pb.Tenancy_TENANCY_SHARED, MaxModels: 3}},
			{Name: "dedicated-l4", Spec: &pb.AcceleratorSpec{Device: "l4"}},
			{Name: "pair-h100", Spec: &pb.AcceleratorSpec{Device: "h100", DevicesPerReplica: 2}},
			{Name: "shared-h100", Spec: &pb.AcceleratorSpec{Device: "h100", Tenancy: pb.Tenancy_TENANCY_SHARED, MaxModels: 2}},
		} {
			apply(&pb.Envelope{Command: &pb.Envelope_CreateAccelerator{CreateAccelerator: a}})
		}
		var stale []*pb.PlaceReplicas
		for step := 0; step < 150; step++ {
			switch op := rng.IntN(10); {
			case op < 3 && rng.IntN(3) == 0: // change only a shared deployment's residency: nothing re-placed unless rule 11 requires it
				name := fmt.Sprintf("d%d", rng.IntN(6))
				m, _, ok := f.Model(name)
				if !ok || m.Spec.Engine.GetMemoryPercent() == 0 {
					continue
				}
				spec := m.Spec
				spec.Residency = pb.Residency(1 + rng.IntN(3))
				apply(&pb.Envelope{Command: &pb.Envelope_ApplyModel{ApplyModel: &pb.ApplyModel{Name: name, Spec: spec}}})
			case op < 3: // deploy or change a deployment
				accs := []string{"shared-l4", "dedicated-l4", "pair-h100", "shared-h100"}
				acc := accs[rng.IntN(len(accs))]
				spec := &pb.ModelSpec{Model: "m", Replicas: uint32(rng.IntN(5)), Placement: &pb.PlacementSpec{Accelerator: acc},
					Engine: &pb.EngineSpec{Kind: "sim"}}
				if acc == "pair-h100" {
					spec.Engine.TensorParallel = 2
				}
				if acc == "shared-l4" || acc == "shared-h100" {
					spec.Engine.MemoryPercent = uint32(10 + rng.IntN(60))
					// Residency changes apply without re-placing unless
					// the reservations require it.
					spec.Residency = pb.Residency(rng.IntN(4))
				}
				apply(&pb.Envelope{Command: &pb.Envelope_ApplyModel{ApplyModel: &pb.ApplyModel{Name: fmt.Sprintf("d%d", rng.IntN(6)), Spec: spec}}})
			case op == 3:
				apply(&pb.Envelope{Command: &pb.Envelope_DeleteModel{DeleteModel: &pb.DeleteModel{Name: fmt.Sprintf("d%d", rng.IntN(6))}}})
			case op == 4: // a node fails or comes back
				status := []pb.NodeStatus{pb.NodeStatus_NODE_STATUS_DOWN, pb.NodeStatus_NODE_STATUS_ALIVE}[rng.IntN(2)]
				apply(&pb.Envelope{Command: &pb.Envelope_SetNodeStatus{SetNodeStatus: &pb.SetNodeStatus{Node: fmt.Sprintf("n%d", rng.IntN(4)), Status: status}}})
			case op < 8: // the scheduler plans; sometimes the plan is held back and applied later (stale)
				plan, err := Plan(f, policies[rng.IntN(len(policies))])
				if err != nil {
					t.Fatalf("seed %d: plan: %v", seed, err)
				}
				if plan == nil {
					continue
				}
				if rng.IntN(3) == 0 {
					stale = append(stale, plan)
					continue
				}
				apply(&pb.Envelope{Command: &pb.Envelope_PlaceReplicas{PlaceReplicas: plan}})
			case op == 8 && len(stale) > 0: // a stale or concurrent plan arrives
				i := rng.IntN(len(stale))
				apply(&pb.Envelope{Command: &pb.Envelope_PlaceReplicas{PlaceReplicas: stale[i]}})
				stale = append(stale[:i], stale[i+1:]...)
			default: // a hand-made plan piling a replica onto a random card
				reps := f.Replicas("", "")
				if len(reps) == 0 {
					continue
				}
				r := reps[rng.IntN(len(reps))]
				if _, _, ok := f.ReplicaShare(r.Model); !ok {
					continue
				}
				apply(&pb.Envelope{Command: &pb.Envelope_PlaceReplicas{PlaceReplicas: &pb.PlaceReplicas{Placements: []*pb.Placement{{
					Model: r.Model, Replica: r.Index, Generation: r.Generation, Node: fmt.Sprintf("n%d", rng.IntN(4)),
					Cards: []uint32{uint32(rng.IntN(4))}}}}}})
			}
		}
	}
}

// TestPlanConverges checks that the leader's loop reaches a fixed point: after
// applying its plan, planning again proposes nothing.
func TestPlanConverges(t *testing.T) {
	f := fsm.New()
	f.Apply(1, &pb.Envelope{Command: &pb.Envelope_RegisterNode{RegisterNode: &pb.RegisterNode{Node: &pb.Node{Name: "n", Role: pb.NodeRole_NODE_ROLE_SERVER, Cards: []*pb.Card{
		{Index: 0, Device: "l4", MemoryMib: 23034, Healthy: true}, {Index: 1, Device: "l4", MemoryMib: 23034, Healthy: true}}}}}})
	f.Apply(2, &pb.Envelope{Command: &pb.Envelope_CreateAccelerator{CreateAccelerator: &pb.CreateAccelerator{Name: "small", Spec: &pb.AcceleratorSpec{Device: "l4", Tenancy: pb.Tenancy_TENANCY_SHARED, MaxModels: 2}}}})
	f.Apply(3, &pb.Envelope{Command: &pb.Envelope_ApplyModel{ApplyModel: &pb.ApplyModel{Name: "chat", Spec: &pb.ModelSpec{Model: "m", Replicas: 5,
		Placement: &pb.PlacementSpec{Accelerator: "small"}, Engine: &pb.EngineSpec{Kind: "sim", MemoryPercent: 45}}}}})
	plan, err := Plan(f, "")
	if err != nil || plan == nil {
		t.Fatalf("plan = %v, %v", plan, err)
	}
	if len(plan.Placements) != 4 || len(plan.Pending) != 1 {
		t.Fatalf("plan places %d and explains %d, want 4 and 1: %v", len(plan.Placements), len(plan.Pending), plan)
	}
	if res := f.Apply(4, &pb.Envelope{Command: &pb.Envelope_PlaceReplicas{PlaceReplicas: plan}}); res.Code != pb.Code_CODE_OK {
		t.Fatalf("apply plan: %v", res)
	}
	m, _, _ := f.Model("chat")
	if m.Status.Placed != 4 || m.Status.Ready {
		t.Fatalf("status = %v", m.Status)
	}
	if want := "1 of 5 replicas pending: no l4 card has 45% free"; len(m.Status.Reason) < len(want) || m.Status.Reason[:len(want)] != want {
		t.Fatalf("reason = %q, want prefix %q", m.Status.Reason, want)
	}
	if again, err := Plan(f, ""); err != nil || again != nil {
		t.Fatalf("second plan = %v, %v; want nothing to do", again, err)
	}
}
