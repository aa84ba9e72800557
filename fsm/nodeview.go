package fsm

import (
	"slices"

	"google.golang.org/protobuf/proto"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// ReplicasOn returns the replicas placed on node, by deployment and
// ordinal, as Replicas("", node) does, but from the by-node index: its cost
// is the node's replicas, not the whole state's. A client node's snapshot
// and an event stream's node filter read it once per entry about the node.
func (f *FSM) ReplicasOn(node string) []*pb.Replica {
	on := f.onNode[node]
	if node == "" || len(on) == 0 {
		return nil
	}
	keys := make([]replicaKey, 0, len(on))
	for k := range on {
		keys = append(keys, k)
	}
	sortReplicaKeys(keys)
	out := make([]*pb.Replica, 0, len(keys))
	for _, k := range keys {
		out = append(out, replicaView(on[k]))
	}
	return out
}

// replicaView is a copy of r as the views show it: a placed replica its
// node has said nothing about yet holds nothing on its cards. Cold is
// derived, not stored, so that a replay of a log from before residency
// rebuilds the state its snapshots hold.
func replicaView(r *pb.Replica) *pb.Replica {
	c := proto.Clone(r).(*pb.Replica)
	if c.Node != "" && c.Residency == pb.ReplicaResidency_REPLICA_RESIDENCY_UNSPECIFIED {
		c.Residency = pb.ReplicaResidency_REPLICA_RESIDENCY_COLD
	}
	return c
}

// ModelSpec returns a copy of a deployment's spec, without the status
// Model derives from all its replicas.
func (f *FSM) ModelSpec(name string) (*pb.ModelSpec, bool) {
	m, ok := f.models[name]
	if !ok {
		return nil, false
	}
	return proto.Clone(m.Spec).(*pb.ModelSpec), true
}

// TrackNodes makes the state record, until Touched, every node whose placed
// replicas an apply may change, with the node's replicas (ReplicasOn) as
// they were before the first change. A shared event stream (events.Feed)
// compares them with the replicas after the entry to tell which nodes'
// streams the entry concerns, at the cost of those nodes' replicas rather
// than the whole state's. The live state machine never tracks.
func (f *FSM) TrackNodes() {
	if f.touched == nil {
		f.touched = map[string][]*pb.Replica{}
	}
	clear(f.touched)
	f.tracking = true
}

// Touched stops tracking and returns the nodes recorded since TrackNodes,
// each with its replicas before. The map is reused by the next TrackNodes.
func (f *FSM) Touched() map[string][]*pb.Replica {
	f.tracking = false
	return f.touched
}

// touch records node's replicas before a change to them, once per
// tracking; it must be called before the change.
func (f *FSM) touch(node string) {
	if !f.tracking || node == "" {
		return
	}
	if _, ok := f.touched[node]; !ok {
		f.touched[node] = f.ReplicasOn(node)
	}
}

// NodesOf returns the nodes holding a placed replica of deployment model,
// sorted. A change to a deployment's spec alone (adapters, residency, SLO)
// leaves its replicas as they were, yet concerns every node running them.
func (f *FSM) NodesOf(model string) []string {
	var out []string
	for k, r := range f.replicas {
		if k.model == model && r.GetNode() != "" && !slices.Contains(out, r.GetNode()) {
			out = append(out, r.GetNode())
		}
	}
	slices.Sort(out)
	return out
}
