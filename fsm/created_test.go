package fsm

import (
	"testing"

	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// TestModelCreatedUnix: a deployment records the log time of the entry
// that created it (the gateway's /v1/models `created`), kept by a later
// change of its spec and by a snapshot.
func TestModelCreatedUnix(t *testing.T) {
	f := New()
	at := func(s int64) *timestamppb.Timestamp { return &timestamppb.Timestamp{Seconds: s, Nanos: 5e8} }
	apply := func(i uint64, sec int64, replicas uint32) {
		t.Helper()
		env := &pb.Envelope{ProposedAt: at(sec), Command: &pb.Envelope_ApplyModel{ApplyModel: &pb.ApplyModel{Name: "m",
			Spec: &pb.ModelSpec{Model: "/w", Replicas: replicas, Placement: &pb.PlacementSpec{Accelerator: "a"}, Engine: &pb.EngineSpec{Kind: "sim", MemoryPercent: 10}}}}}
		if r := f.Apply(i, env); r.GetCode() != pb.Code_CODE_OK {
			t.Fatalf("apply: %v", r)
		}
	}
	f.Apply(1, &pb.Envelope{ProposedAt: at(1767225000), Command: &pb.Envelope_CreateAccelerator{CreateAccelerator: &pb.CreateAccelerator{Name: "a",
		Spec: &pb.AcceleratorSpec{Device: "l4", Tenancy: pb.Tenancy_TENANCY_SHARED, MaxModels: 4}}}})
	apply(2, 1767225600, 1)
	apply(3, 1767229200, 2)
	m, _, ok := f.Model("m")
	if !ok || m.GetCreatedUnix() != 1767225600 {
		t.Fatalf("created %d, want 1767225600 (the creating entry's log time)", m.GetCreatedUnix())
	}
	data, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	g := New()
	if err := g.Restore(data); err != nil {
		t.Fatal(err)
	}
	if m, _, _ := g.Model("m"); m.GetCreatedUnix() != 1767225600 {
		t.Fatalf("restored created %d", m.GetCreatedUnix())
	}
}
