package fsm

import (
	"fmt"
	"iter"

	"google.golang.org/protobuf/proto"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// State returns the whole state as one message, with every list sorted, so
// that equal states have equal encodings.
func (f *FSM) State() *pb.State {
	st := &pb.State{AppliedIndex: f.applied, Hash: f.hash}
	for _, name := range sortedKeys(f.nodes) {
		st.Nodes = append(st.Nodes, proto.Clone(f.nodes[name]).(*pb.Node))
	}
	for _, name := range sortedKeys(f.accelerators) {
		st.Accelerators = append(st.Accelerators, proto.Clone(f.accelerators[name]).(*pb.StoredAccelerator))
	}
	for _, name := range sortedKeys(f.models) {
		st.Models = append(st.Models, proto.Clone(f.models[name]).(*pb.ModelDeployment))
	}
	for _, k := range f.sortedReplicaKeys() {
		st.Replicas = append(st.Replicas, proto.Clone(f.replicas[k]).(*pb.Replica))
	}
	for _, name := range sortedKeys(f.tokens) {
		st.Tokens = append(st.Tokens, proto.Clone(f.tokens[name]).(*pb.ACLToken))
	}
	st.AclBootstrapped = f.aclBootstrapped
	for _, id := range sortedKeys(f.requests) {
		st.AppliedRequests = append(st.AppliedRequests, &pb.AppliedRequest{RequestId: id, Result: proto.Clone(f.requests[id]).(*pb.Result)})
	}
	return st
}

// Snapshot encodes the whole state deterministically.
func (f *FSM) Snapshot() ([]byte, error) {
	return proto.MarshalOptions{Deterministic: true}.Marshal(f.State())
}

// Restore replaces the state with a snapshot taken by Snapshot.
func (f *FSM) Restore(data []byte) error {
	st := &pb.State{}
	if err := proto.Unmarshal(data, st); err != nil {
		return fmt.Errorf("restore snapshot: %w", err)
	}
	next := New()
	next.applied = st.AppliedIndex
	if st.Hash != "" {
		next.hash = st.Hash
	}
	for _, n := range st.Nodes {
		next.nodes[n.Name] = n
	}
	for _, a := range st.Accelerators {
		next.accelerators[a.Name] = a
	}
	for _, m := range st.Models {
		next.models[m.Name] = m
	}
	for _, r := range st.Replicas {
		next.replicas[keyOf(r)] = r
		if r.Node != "" {
			next.occupy(r)
		}
	}
	for _, t := range st.Tokens {
		next.tokens[t.Name] = t
	}
	next.aclBootstrapped = st.AclBootstrapped
	for _, r := range st.AppliedRequests {
		next.requests[r.RequestId] = r.Result
	}
	*f = *next
	return nil
}

// Replay rebuilds the state by applying entries (log index, marshalled
// envelope) in order from an empty state, stopping after index upTo (0: all).
// It is the same apply code the live cluster runs.
func Replay(entries iter.Seq2[uint64, []byte], upTo uint64) *FSM {
	f := New()
	for index, data := range entries {
		if upTo != 0 && index > upTo {
			break
		}
		f.ApplyBytes(index, data)
	}
	return f
}
