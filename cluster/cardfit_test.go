package cluster

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/gpuplane/gpuplane/cluster/scheduler"
	"github.com/gpuplane/gpuplane/fsm"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// TestSchedulerAndStateMachineAgreeOnCardFit loads one card of a shared
// accelerator with random replicas of random residency and share (placed
// by hand, so the loads are not only those the scheduler would choose),
// then offers one more replica. The scheduler's plan (through the leader's
// view of the state machine) must place it exactly when the state machine
// accepts it on that card: if they disagreed, the leader would propose
// plans that are refused forever, or leave placeable replicas pending.
func TestSchedulerAndStateMachineAgreeOnCardFit(t *testing.T) {
	policies := scheduler.Policies()
	var fit, refused int
	for seed := uint64(1); seed <= 400; seed++ {
		rng := rand.New(rand.NewPCG(seed, 11))
		f := fsm.New()
		index := uint64(0)
		apply := func(env *pb.Envelope) *pb.Result {
			index++
			return f.Apply(index, env)
		}
		apply(&pb.Envelope{Command: &pb.Envelope_RegisterNode{RegisterNode: &pb.RegisterNode{Node: &pb.Node{
			Name: "n", Role: pb.NodeRole_NODE_ROLE_CLIENT,
			Cards: []*pb.Card{{Index: 0, Uuid: "n-0", Device: "l4", MemoryMib: 23034, Healthy: true}}}}}})
		maxModels := uint32(1 + rng.IntN(4))
		if res := apply(&pb.Envelope{Command: &pb.Envelope_CreateAccelerator{CreateAccelerator: &pb.CreateAccelerator{
			Name: "shared", Spec: &pb.AcceleratorSpec{Device: "l4", Tenancy: pb.Tenancy_TENANCY_SHARED, MaxModels: maxModels}}}}); res.Code != pb.Code_CODE_OK {
			t.Fatalf("seed %d: create accelerator: %v", seed, res)
		}
		deploy := func(name string) {
			spec := &pb.ModelSpec{Model: "m", Replicas: 1, Placement: &pb.PlacementSpec{Accelerator: "shared"},
				Engine:    &pb.EngineSpec{Kind: "sim", MemoryPercent: uint32(5 + 5*rng.IntN(19))},
				Residency: pb.Residency(rng.IntN(4))}
			if res := apply(&pb.Envelope{Command: &pb.Envelope_ApplyModel{ApplyModel: &pb.ApplyModel{Name: name, Spec: spec}}}); res.Code != pb.Code_CODE_OK {
				t.Fatalf("seed %d: apply %s: %v", seed, name, res)
			}
		}
		// placeByHand proposes name's replica on card 0 as a plan would,
		// and reports whether the state machine took it.
		placeByHand := func(name string) bool {
			reps := f.Replicas(name, "")
			_, _, ok := f.ReplicaShare(name)
			if len(reps) != 1 || !ok {
				t.Fatalf("seed %d: %s has %d replicas (share known %v)", seed, name, len(reps), ok)
			}
			res := apply(&pb.Envelope{Command: &pb.Envelope_PlaceReplicas{PlaceReplicas: &pb.PlaceReplicas{Placements: []*pb.Placement{{
				Model: name, Replica: 0, Generation: reps[0].Generation, Node: "n", Cards: []uint32{0}}}}}})
			return res.Code == pb.Code_CODE_OK
		}
		for i := range rng.IntN(int(maxModels) + 2) {
			name := fmt.Sprintf("held%d", i)
			deploy(name)
			if !placeByHand(name) {
				// Only the offered replica may be pending when the
				// scheduler plans.
				apply(&pb.Envelope{Command: &pb.Envelope_DeleteModel{DeleteModel: &pb.DeleteModel{Name: name}}})
			}
		}
		deploy("offered")
		plan, err := Plan(f, policies[rng.IntN(len(policies))])
		if err != nil {
			t.Fatalf("seed %d: plan: %v", seed, err)
		}
		planned := false
		for _, p := range plan.GetPlacements() {
			planned = planned || p.Model == "offered"
		}
		accepted := placeByHand("offered")
		if planned != accepted {
			m, _, _ := f.Model("offered")
			t.Errorf("seed %d: the scheduler places the offered replica: %v, the state machine accepts it: %v (maxModels %d, offered %v %d%%, card holds %v)",
				seed, planned, accepted, maxModels, m.Spec.Residency, m.Spec.Engine.MemoryPercent, held(f))
		}
		if accepted {
			fit++
		} else {
			refused++
		}
	}
	t.Logf("%d offers fit, %d refused", fit, refused)
	// Both answers must be common, or the test proves little.
	if fit < 50 || refused < 50 {
		t.Fatalf("%d offers fit and %d were refused; want at least 50 of each", fit, refused)
	}
}

// held lists the replicas placed on the card, for a failure message.
func held(f *fsm.FSM) []string {
	var out []string
	for _, r := range f.Replicas("", "n") {
		m, _, _ := f.Model(r.Model)
		out = append(out, fmt.Sprintf("%s %v %d‰", r.Model, m.Spec.GetResidency(), r.ShareMilli))
	}
	return out
}
