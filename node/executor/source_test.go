package executor

import (
	"testing"

	"github.com/gpuplane/gpuplane/fsm"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// The state machine is what agents build snapshots from.
var _ StateView = (*fsm.FSM)(nil)

// view is a state with deployments and replicas, as the FSM answers.
type view struct {
	models   map[string]*pb.ModelDeployment
	replicas []*pb.Replica
}

func (v view) ReplicasOn(node string) []*pb.Replica {
	var out []*pb.Replica
	for _, r := range v.replicas {
		if r.Node == node {
			out = append(out, r)
		}
	}
	return out
}

func (v view) ModelSpec(name string) (*pb.ModelSpec, bool) {
	m, ok := v.models[name]
	return m.GetSpec(), ok
}

func TestSnapshotOfTakesThisNodesReplicasWithTheirSpecs(t *testing.T) {
	chat := &pb.ModelSpec{Model: "sim://chat", Engine: &pb.EngineSpec{Kind: "sim"}}
	v := view{
		models: map[string]*pb.ModelDeployment{"chat": {Name: "chat", Spec: chat}},
		replicas: []*pb.Replica{
			{Model: "chat", Index: 0, Node: "node-a", Cards: []uint32{0}},
			{Model: "chat", Index: 1, Node: "node-b", Cards: []uint32{0}},
			{Model: "chat", Index: 2}, // pending
			{Model: "gone", Index: 0, Node: "node-a", Cards: []uint32{1}},
		},
	}
	snap := SnapshotOf(42, "node-a", v)
	if snap.Index != 42 || len(snap.Replicas) != 1 || snap.Replicas[0].Replica.Index != 0 || snap.Replicas[0].Spec != chat {
		t.Fatalf("SnapshotOf = %+v, want chat/0 with its spec at index 42", snap)
	}
}
