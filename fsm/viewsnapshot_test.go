package fsm_test

import (
	"fmt"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/gpuplane/gpuplane/fsm"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// TestViewSnapshotLeavesOutRequests: the snapshot a server sends a client
// node restores to the same listings and hash head, without the request
// ids, which are most of a long-lived state's bytes.
func TestViewSnapshotLeavesOutRequests(t *testing.T) {
	f := fsm.New()
	var index uint64
	apply := func(env *pb.Envelope) {
		t.Helper()
		index++
		env.RequestId = fmt.Sprintf("%032x", index)
		data, err := fsm.Marshal(env)
		if err != nil {
			t.Fatal(err)
		}
		if res := f.ApplyBytes(index, data); res.GetCode() != pb.Code_CODE_OK {
			t.Fatalf("entry %d: %v", index, res)
		}
	}
	apply(&pb.Envelope{Command: &pb.Envelope_RegisterNode{RegisterNode: &pb.RegisterNode{Node: &pb.Node{Name: "n1", Role: pb.NodeRole_NODE_ROLE_CLIENT,
		Cards: []*pb.Card{{Index: 0, Uuid: "u0", Device: "l4", MemoryMib: 23034, Healthy: true}, {Index: 1, Uuid: "u1", Device: "l4", MemoryMib: 23034, Healthy: true}}}}}})
	apply(&pb.Envelope{Command: &pb.Envelope_CreateAccelerator{CreateAccelerator: &pb.CreateAccelerator{Name: "small",
		Spec: &pb.AcceleratorSpec{Device: "l4", Tenancy: pb.Tenancy_TENANCY_SHARED}}}})
	apply(&pb.Envelope{Command: &pb.Envelope_ApplyModel{ApplyModel: &pb.ApplyModel{Name: "chat", Spec: &pb.ModelSpec{Model: "w", Replicas: 2,
		Placement: &pb.PlacementSpec{Accelerator: "small"}, Engine: &pb.EngineSpec{MemoryPercent: 40}}}}})
	for range 200 { // many requests, as a long-lived cluster has
		apply(&pb.Envelope{Command: &pb.Envelope_CreateAccelerator{CreateAccelerator: &pb.CreateAccelerator{Name: "small", Upsert: true,
			Spec: &pb.AcceleratorSpec{Device: "l4", Tenancy: pb.Tenancy_TENANCY_SHARED}}}})
	}

	full, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	view, err := f.ViewSnapshot()
	if err != nil {
		t.Fatal(err)
	}
	var st pb.State
	if err := proto.Unmarshal(view, &st); err != nil {
		t.Fatal(err)
	}
	if n := len(st.GetAppliedRequests()); n != 0 {
		t.Fatalf("view snapshot holds %d applied requests, want none", n)
	}
	if len(view) >= len(full)/4 {
		t.Fatalf("view snapshot %d bytes, full %d: the request ids should be most of it", len(view), len(full))
	}
	restored := fsm.New()
	if err := restored.Restore(view); err != nil {
		t.Fatal(err)
	}
	if got, want := formatState(restored), formatState(f); got != want {
		t.Fatalf("restored view reads differently:\n%s\nwant:\n%s", got, want)
	}
}
