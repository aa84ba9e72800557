package cli

import (
	"strings"
	"testing"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// TestModelsGetShowsAdapterTiers: `models get` lists a deployment's
// adapters with where each is on each placed replica (unreported: disk),
// those on a card first.
func TestModelsGetShowsAdapterTiers(t *testing.T) {
	spec := &pb.ModelSpec{ServedModelName: "chat", Placement: &pb.PlacementSpec{Accelerator: "lora"}, Engine: &pb.EngineSpec{Kind: "sim"},
		Adapters: []*pb.Adapter{{Name: "law", Source: "/a/law", Rank: 16}, {Name: "sql", Source: "/a/sql", Rank: 8},
			{Name: "zed", Source: "/a/zed", Rank: 64, Tenants: []string{"acme", "beta"}}}}
	m := &pb.GetModelResponse{
		Model: &pb.ModelDeployment{Name: "chat", Spec: spec, Status: &pb.ModelStatus{}},
		Replicas: []*pb.Replica{
			{Model: "chat", Index: 0, Node: "vm", Cards: []uint32{0}, Adapters: []*pb.AdapterStatus{
				{Name: "zed", Tier: pb.AdapterTier_ADAPTER_TIER_CARD}, {Name: "law", Tier: pb.AdapterTier_ADAPTER_TIER_HOST}}},
			{Model: "chat", Index: 1, Node: "vm", Cards: []uint32{1}, Adapters: []*pb.AdapterStatus{
				{Name: "sql", Tier: pb.AdapterTier_ADAPTER_TIER_LOADING}}},
		},
	}
	out := printed(t, outputTable, func(g *globals) error { return g.printModel(m) })
	i := strings.Index(out, "ADAPTER")
	if i < 0 {
		t.Fatalf("no adapters section:\n%s", out)
	}
	var rows []string
	for _, l := range strings.Split(strings.TrimSpace(out[i:]), "\n")[1:] {
		rows = append(rows, strings.Join(strings.Fields(l), " "))
	}
	want := []string{
		"zed 64 /a/zed acme,beta 0:card 1:disk",
		"sql 8 /a/sql - 0:disk 1:loading",
		"law 16 /a/law - 0:host 1:disk",
	}
	if strings.Join(rows, "\n") != strings.Join(want, "\n") {
		t.Fatalf("adapters:\n%s\nwant\n%s", strings.Join(rows, "\n"), strings.Join(want, "\n"))
	}
}
