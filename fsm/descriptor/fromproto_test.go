package descriptor

import (
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/gpuplane/gpuplane/fsm"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// TestFromProtoRoundTrips checks that the descriptor form of a stored spec
// passes the file's checks and converts back to the very spec, which is what
// makes `get -o yaml | apply -f -` "unchanged".
func TestFromProtoRoundTrips(t *testing.T) {
	for _, acc := range []*pb.AcceleratorSpec{
		{Device: "l4", Tenancy: pb.Tenancy_TENANCY_DEDICATED, DevicesPerReplica: 2},
		{Device: "l4", Tenancy: pb.Tenancy_TENANCY_SHARED, MaxModels: 3, DevicesPerReplica: 1},
	} {
		s := AcceleratorSpecFromProto(acc)
		if vs := s.Check(); len(vs) > 0 {
			t.Errorf("%v: descriptor form %+v fails its checks: %v", acc, s, vs)
		}
		if got := s.Proto(); !proto.Equal(got, acc) {
			t.Errorf("accelerator %v came back as %v", acc, got)
		}
	}
	for _, spec := range []*pb.ModelSpec{
		{Model: "/m", Replicas: 2, Placement: &pb.PlacementSpec{Accelerator: "small"}, Engine: &pb.EngineSpec{Kind: "vllm", MemoryPercent: 45}},
		{Model: "/m", Replicas: 0, Placement: &pb.PlacementSpec{Accelerator: "small", NodeSelector: map[string]string{"zone": "a"}},
			Engine: &pb.EngineSpec{Kind: "sim", MemoryMib: 2048, ComputePercent: 40, MaxModelLen: 4096, Args: []string{"-v"},
				Env: map[string]string{"A": "1"}, StartTimeoutSeconds: 90, Quantization: "fp8"},
			Resources: &pb.HostResources{CpuMilli: 500, MemoryMib: 1024}, Residency: pb.Residency_RESIDENCY_ON_DEMAND,
			Priority: pb.Priority_PRIORITY_BACKGROUND, Slo: &pb.SLO{TtftMs: 800},
			Idle: &pb.IdleTimeouts{SleepAfterSeconds: 120, UnloadAfterSeconds: 600}},
		{Model: "/m", Replicas: 1, Placement: &pb.PlacementSpec{Accelerator: "small"},
			Engine:   &pb.EngineSpec{Kind: "sim", MemoryPercent: 40, MaxAdapters: 8, MaxInFlight: 16},
			Adapters: []*pb.Adapter{{Name: "sql", Source: "/a/sql", Rank: 16}, {Name: "law", Source: "/a/law", Rank: 8, Tenants: []string{"acme"}}},
			Aliases:  []string{"helpdesk", "support"}},
	} {
		stored := fsm.NormalizeModelSpec("chat", spec)
		s := ModelDeploymentSpecFromProto(stored)
		if vs := s.Check(); len(vs) > 0 {
			t.Errorf("%v: descriptor form fails its checks: %v", stored, vs)
		}
		s.SetDefaults("chat")
		if got := fsm.NormalizeModelSpec("chat", s.Proto()); !proto.Equal(got, stored) {
			t.Errorf("deployment %v came back as %v", stored, got)
		}
	}
}
