package cluster

import (
	"testing"

	"github.com/gpuplane/gpuplane/fsm"
	"github.com/gpuplane/gpuplane/node/inventory"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// TestDigestCacheFollowsInventoryChanges checks that the leader's digest
// cache hashes a node's cards once, and again whenever the state changes
// them (a re-registration, an inventory update), but not when only its
// status changes: a stale digest would make the leader miss a changed
// inventory, or fetch a node every round.
func TestDigestCacheFollowsInventoryChanges(t *testing.T) {
	f := fsm.New()
	index := uint64(0)
	apply := func(env *pb.Envelope) {
		t.Helper()
		index++
		if res := f.Apply(index, env); res.GetCode() != pb.Code_CODE_OK {
			t.Fatalf("apply: %s", res.GetMessage())
		}
	}
	card := func(i uint32, mem uint64) *pb.Card {
		return &pb.Card{Index: i, Uuid: "GPU-" + string(rune('a'+i)), Device: "h100", MemoryMib: mem, Healthy: true}
	}
	apply(&pb.Envelope{Command: &pb.Envelope_RegisterNode{RegisterNode: &pb.RegisterNode{Node: &pb.Node{
		Name: "n1", Role: pb.NodeRole_NODE_ROLE_CLIENT, Cards: []*pb.Card{card(0, 80000), card(1, 80000)}}}}})

	var d digestCache
	hashed := 0
	digest := func(cs []*pb.Card) string { hashed++; return inventory.Digest(cs) }
	of := func() string {
		var out string
		f.RangeNodes(func(n *pb.Node) { out = d.of(n, digest) })
		return out
	}
	want := func() string {
		n, _ := f.Node("n1")
		return inventory.Digest(n.GetCards())
	}
	if got := of(); got != want() || hashed != 1 {
		t.Fatalf("first: %q (hashed %d), want %q hashed once", got, hashed, want())
	}
	apply(statusEnvelope("n1", pb.NodeStatus_NODE_STATUS_DOWN))
	if got := of(); got != want() || hashed != 1 {
		t.Fatalf("after a status change: %q (hashed %d), want %q from the cache", got, hashed, want())
	}
	apply(&pb.Envelope{Command: &pb.Envelope_UpdateInventory{UpdateInventory: &pb.UpdateInventory{
		Node: "n1", Cards: []*pb.Card{card(0, 40000), card(1, 80000)}}}})
	if got := of(); got != want() || hashed != 2 {
		t.Fatalf("after an inventory update: %q (hashed %d), want %q hashed anew", got, hashed, want())
	}
	apply(&pb.Envelope{Command: &pb.Envelope_RegisterNode{RegisterNode: &pb.RegisterNode{Node: &pb.Node{
		Name: "n1", Role: pb.NodeRole_NODE_ROLE_CLIENT, Cards: []*pb.Card{card(0, 40000)}}}}})
	if got := of(); got != want() || hashed != 3 {
		t.Fatalf("after a re-registration: %q (hashed %d), want %q hashed anew", got, hashed, want())
	}
}
