package cluster

import (
	"testing"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// TestReadNodeReadsOneNodesReplicasWithTheirSpecs: ReadNode (what a client
// node's executor reads after each event about it) answers the replicas
// placed on that node alone, each with its deployment's spec, as of an
// applied index at least the one asked for.
func TestReadNodeReadsOneNodesReplicasWithTheirSpecs(t *testing.T) {
	c, _ := startDev(t)
	mustApply(t, c, registerNode("a"))
	mustApply(t, c, registerNode("b"))
	mustApply(t, c, createAccelerator("l4"))
	spec := &pb.ModelSpec{Model: "sim://chat", Replicas: 2, Placement: &pb.PlacementSpec{Accelerator: "l4"}, Engine: &pb.EngineSpec{Kind: "sim"}}
	mustApply(t, c, &pb.Envelope{Command: &pb.Envelope_ApplyModel{ApplyModel: &pb.ApplyModel{Name: "chat", Spec: spec}}})
	mustApply(t, c, &pb.Envelope{Command: &pb.Envelope_ApplyModel{ApplyModel: &pb.ApplyModel{Name: "other", Spec: spec}}})
	placed := mustApply(t, c, &pb.Envelope{Command: &pb.Envelope_PlaceReplicas{PlaceReplicas: &pb.PlaceReplicas{Placements: []*pb.Placement{
		{Model: "chat", Replica: 1, Generation: 1, Node: "a", Cards: []uint32{0}},
		{Model: "other", Replica: 0, Generation: 1, Node: "b", Cards: []uint32{0}},
	}}}})
	for _, stale := range []bool{false, true} {
		resp, err := c.ReadNode(testCtx(t), "a", stale, placed.Index)
		if err != nil {
			t.Fatal(err)
		}
		if resp.AppliedIndex < placed.Index {
			t.Errorf("stale %v: read as of %d, want at least %d", stale, resp.AppliedIndex, placed.Index)
		}
		rs := resp.GetReplicas()
		if len(rs) != 1 || rs[0].GetModel() != "chat" || rs[0].GetIndex() != 1 || rs[0].GetNode() != "a" {
			t.Fatalf("stale %v: replicas on a: %v, want chat/1 alone", stale, rs)
		}
		if len(resp.Specs) != 1 || resp.Specs["chat"].GetModel() != "sim://chat" {
			t.Errorf("stale %v: specs %v, want chat's alone", stale, resp.Specs)
		}
	}
	resp, err := c.ReadNode(testCtx(t), "nobody", true, 0)
	if err != nil || len(resp.GetReplicas()) != 0 {
		t.Errorf("a node without replicas: %v, %v; want none", resp, err)
	}
}
