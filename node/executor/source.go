package executor

import (
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// StateView is the part of the state machine a Source reads to build a
// Snapshot; *fsm.FSM has it (read it under cluster.View).
type StateView interface {
	// ReplicasOn returns the replicas placed on node.
	ReplicasOn(node string) []*pb.Replica
	// ModelSpec returns a deployment's spec.
	ModelSpec(name string) (*pb.ModelSpec, bool)
}

// SnapshotOf builds node's Snapshot from a view of the state as of index:
// every replica placed on node, with its deployment's spec.
func SnapshotOf(index uint64, node string, v StateView) Snapshot {
	snap := Snapshot{Index: index}
	specs := map[string]*pb.ModelSpec{}
	for _, r := range v.ReplicasOn(node) {
		if r.GetNode() != node {
			continue
		}
		spec, ok := specs[r.GetModel()]
		if !ok {
			spec, _ = v.ModelSpec(r.GetModel())
			specs[r.GetModel()] = spec
		}
		if spec == nil {
			continue
		}
		snap.Replicas = append(snap.Replicas, Desired{Replica: r, Spec: spec})
	}
	return snap
}
