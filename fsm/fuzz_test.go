package fsm_test

import (
	"bytes"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/gpuplane/gpuplane/fsm"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// FuzzApplyBytes feeds arbitrary log entries to the command decoder on top of
// a populated state. Whatever the bytes, apply must not panic, must answer
// with a result, must leave a state that snapshots and restores to itself,
// and a rejected entry must change nothing but the hash chain.
func FuzzApplyBytes(f *testing.F) {
	seeds := []*pb.Envelope{
		{RequestId: "a", Command: &pb.Envelope_CreateAccelerator{CreateAccelerator: &pb.CreateAccelerator{Name: "x", Spec: &pb.AcceleratorSpec{Device: "l4", Tenancy: pb.Tenancy_TENANCY_SHARED}}}},
		{Command: &pb.Envelope_ApplyModel{ApplyModel: &pb.ApplyModel{Name: "m", Spec: &pb.ModelSpec{Model: "w", Replicas: 2, Placement: &pb.PlacementSpec{Accelerator: "small"}, Engine: &pb.EngineSpec{MemoryPercent: 40}}}}},
		{Command: &pb.Envelope_PlaceReplicas{PlaceReplicas: &pb.PlaceReplicas{Placements: []*pb.Placement{{Model: "chat", Replica: 0, Generation: 1, Node: "n1", Cards: []uint32{0}}}}}},
		{Command: &pb.Envelope_SetNodeStatus{SetNodeStatus: &pb.SetNodeStatus{Node: "n1", Status: pb.NodeStatus_NODE_STATUS_DOWN}}},
		{Command: &pb.Envelope_DeleteAccelerator{DeleteAccelerator: &pb.DeleteAccelerator{Name: "small", Force: true}}},
		{Command: &pb.Envelope_ReplicaStatus{ReplicaStatus: &pb.ReplicaStatus{Model: "chat", Replica: 0, Generation: 1, Node: "n1", State: pb.ReplicaState_REPLICA_STATE_RUNNING}}},
	}
	for _, env := range seeds {
		data, err := fsm.Marshal(env)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte{0xff, 0x01})
	f.Fuzz(func(t *testing.T, data []byte) {
		s := populated(t)
		before := s.State()
		res := s.ApplyBytes(100, data)
		if res == nil || res.Code == pb.Code_CODE_UNSPECIFIED {
			t.Fatalf("no result for %x", data)
		}
		if res.Code != pb.Code_CODE_OK {
			after := s.State()
			after.Hash, before.Hash = "", ""
			after.AppliedIndex, before.AppliedIndex = 0, 0
			// A request id is remembered with its rejection, by design.
			after.AppliedRequests, before.AppliedRequests = nil, nil
			// Every applied entry advances log time, and the envelope's
			// request window is the leader's setting, not the command's:
			// bookkeeping like the applied index, kept even when the
			// command is refused (docs/archive.md).
			after.LogTime, before.LogTime = nil, nil
			after.RequestWindow, before.RequestWindow = nil, nil
			if !proto.Equal(before, after) {
				t.Fatalf("rejected entry changed the state: %v", res)
			}
		}
		snap, err := s.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		g := fsm.New()
		if err := g.Restore(snap); err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(s.State(), g.State()) {
			t.Fatal("snapshot does not restore the same state")
		}
		h := fsm.New()
		if err := h.RestoreFrom(bytes.NewReader(snap)); err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(s.State(), h.State()) || h.Hash() != s.Hash() {
			t.Fatal("snapshot read from a reader does not restore the same state")
		}
	})
}

// populated returns a state with a node, two accelerators and a placed
// deployment, for fuzzed entries to act on.
func populated(t *testing.T) *fsm.FSM {
	s := fsm.New()
	envs := []*pb.Envelope{
		{Command: &pb.Envelope_RegisterNode{RegisterNode: &pb.RegisterNode{Node: &pb.Node{Name: "n1", Role: pb.NodeRole_NODE_ROLE_SERVER, Cards: []*pb.Card{
			{Index: 0, Uuid: "a", Device: "l4", MemoryMib: 23034, Healthy: true}, {Index: 1, Uuid: "b", Device: "l4", MemoryMib: 23034, Healthy: true}}}}}},
		{Command: &pb.Envelope_CreateAccelerator{CreateAccelerator: &pb.CreateAccelerator{Name: "small", Spec: &pb.AcceleratorSpec{Device: "l4", Tenancy: pb.Tenancy_TENANCY_SHARED, MaxModels: 2}}}},
		{Command: &pb.Envelope_CreateAccelerator{CreateAccelerator: &pb.CreateAccelerator{Name: "fast", Spec: &pb.AcceleratorSpec{Device: "l4"}}}},
		{Command: &pb.Envelope_ApplyModel{ApplyModel: &pb.ApplyModel{Name: "chat", Spec: &pb.ModelSpec{Model: "w", Replicas: 2, Placement: &pb.PlacementSpec{Accelerator: "small"}, Engine: &pb.EngineSpec{MemoryPercent: 45}}}}},
		{Command: &pb.Envelope_PlaceReplicas{PlaceReplicas: &pb.PlaceReplicas{Placements: []*pb.Placement{{Model: "chat", Replica: 0, Generation: 1, Node: "n1", Cards: []uint32{0}}}}}},
	}
	for i, env := range envs {
		if res := s.Apply(uint64(i+1), env); res.Code != pb.Code_CODE_OK {
			t.Fatalf("setup entry %d: %v", i+1, res)
		}
	}
	return s
}
