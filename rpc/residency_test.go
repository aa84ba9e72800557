package rpc_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/gpuplane/gpuplane/fsm"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
	"github.com/gpuplane/gpuplane/proto/gpuplane/v1/gpuplanev1connect"
	"github.com/gpuplane/gpuplane/rpc"
)

// emptyState reads an empty state: a cluster that knows no nodes yet.
type emptyState struct{ rpc.Backend }

func (emptyState) Read(_ context.Context, _ bool, fn func(*fsm.FSM) error) error {
	return fn(fsm.New())
}

// TestResidencyWithoutJournal: a node where residency does not run answers
// with nothing rather than an error, and a relayed request for another node
// is refused instead of relayed again.
func TestResidencyWithoutJournal(t *testing.T) {
	srv, err := rpc.Listen("127.0.0.1:0", rpc.Config{Backend: emptyState{}, NodeName: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve()
	defer shutdown(srv)
	c := gpuplanev1connect.NewResidencyServiceClient(rpc.HTTPClient(), "http://"+srv.Addr().String())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	for _, node := range []string{"", "n1"} {
		plan, err := c.GetPlan(ctx, connect.NewRequest(&pb.GetPlanRequest{Node: node}))
		if err != nil || len(plan.Msg.GetCards()) != 0 {
			t.Errorf("GetPlan(%q) = %v, %v; want nothing", node, plan, err)
		}
		profiles, err := c.ListProfiles(ctx, connect.NewRequest(&pb.ListProfilesRequest{Node: node}))
		if err != nil || len(profiles.Msg.GetProfiles()) != 0 {
			t.Errorf("ListProfiles(%q) = %v, %v; want nothing", node, profiles, err)
		}
		stream, err := c.ListDecisions(ctx, connect.NewRequest(&pb.ListDecisionsRequest{Node: node}))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for stream.Receive() {
			n += len(stream.Msg().GetDecisions())
		}
		if err := stream.Err(); err != nil || n != 0 {
			t.Errorf("ListDecisions(%q): %d decisions, %v; want none", node, n, err)
		}
	}
	if _, err := c.GetPlan(ctx, connect.NewRequest(&pb.GetPlanRequest{Node: "n2"})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("GetPlan(n2) on a cluster without n2: %v, want not found", err)
	}
	req := connect.NewRequest(&pb.GetPlanRequest{Node: "n2"})
	req.Header().Set("Gpuplane-Residency-Relayed", "1")
	if _, err := c.GetPlan(ctx, req); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("a relayed GetPlan(n2) on n1: %v, want refused", err)
	}
}
