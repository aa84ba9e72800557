package cluster

import (
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/gpuplane/gpuplane/fsm"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// TestLeaderDeregistersLeftNodes: a node left for ReapLeftAfter is
// deregistered by the leader (a DeregisterNode entry in the log, so replay
// explains it); a down node, or one that left and came back, stays.
func TestLeaderDeregistersLeftNodes(t *testing.T) {
	c, err := New(Config{
		NodeName: "n1", DataDir: t.TempDir(), RaftBind: freeAddr(t), Server: true, Bootstrap: true,
		GossipBind: freeAddr(t), Logger: testLogger(), ReapLeftAfter: 500 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Shutdown() })
	// The leader's duties, reaping included, run with gossip.
	if err := c.StartGossip(func() *pb.Node { return &pb.Node{Name: "n1", Role: pb.NodeRole_NODE_ROLE_SERVER} }); err != nil {
		t.Fatal(err)
	}
	waitLeader(t, c)
	status := func(name string, s pb.NodeStatus) *pb.Envelope {
		return &pb.Envelope{Command: &pb.Envelope_SetNodeStatus{SetNodeStatus: &pb.SetNodeStatus{Node: name, Status: s}}}
	}
	for _, n := range []string{"gone", "flaky", "back"} {
		mustApply(t, c, registerNode(n))
	}
	start := time.Now()
	mustApply(t, c, status("gone", pb.NodeStatus_NODE_STATUS_LEFT))
	mustApply(t, c, status("flaky", pb.NodeStatus_NODE_STATUS_DOWN))
	mustApply(t, c, status("back", pb.NodeStatus_NODE_STATUS_LEFT))
	mustApply(t, c, status("back", pb.NodeStatus_NODE_STATUS_ALIVE))

	has := func(name string) bool {
		var ok bool
		c.View(func(f *fsm.FSM) {
			for _, n := range f.Nodes() {
				ok = ok || n.GetName() == name
			}
		})
		return ok
	}
	deadline := time.Now().Add(10 * time.Second)
	for has("gone") {
		if time.Now().After(deadline) {
			t.Fatal("a node left for longer than ReapLeftAfter is still registered")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if waited := time.Since(start); waited < 500*time.Millisecond {
		t.Fatalf("deregistered after %v, before ReapLeftAfter", waited)
	}
	if !has("flaky") || !has("back") {
		t.Fatal("a down node or one that came back was deregistered")
	}
	var found string
	for _, data := range commands(t, c) {
		env := &pb.Envelope{}
		if err := proto.Unmarshal(data, env); err == nil && env.GetDeregisterNode() != nil {
			found = fmt.Sprintf("%s by %s", env.GetDeregisterNode().GetNode(), env.GetActor())
		}
	}
	if found != "gone by "+membershipActor {
		t.Fatalf("DeregisterNode in the log: %q", found)
	}
}
