package rpc_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/gpuplane/gpuplane/fsm"
	"github.com/gpuplane/gpuplane/node/residency"
	"github.com/gpuplane/gpuplane/node/residency/residencypb"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
	"github.com/gpuplane/gpuplane/proto/gpuplane/v1/gpuplanev1connect"
	"github.com/gpuplane/gpuplane/rpc"
)

// stateBackend answers the API from a state machine built in memory: the
// real handlers over a real fsm.FSM, without Raft.
type stateBackend struct {
	rpc.Backend // the writes and cluster operations: not called
	mu          sync.RWMutex
	f           *fsm.FSM
	index       uint64
	members     []*pb.Member
}

func (b *stateBackend) Read(_ context.Context, _ bool, fn func(*fsm.FSM) error) error {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return fn(b.f)
}

func (b *stateBackend) ClusterStatus(context.Context) (*pb.StatusResponse, error) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return &pb.StatusResponse{Node: "node-000", Leader: "node-000", Term: 3, CommitIndex: b.index, AppliedIndex: b.index, RaftState: "leader"}, nil
}

func (b *stateBackend) Members(context.Context) ([]*pb.Member, error) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return b.members, nil
}

func (b *stateBackend) LocalNode() *pb.Node { return &pb.Node{Name: "node-000"} }

func (b *stateBackend) apply(tb testing.TB, env *pb.Envelope) {
	tb.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	b.index++
	env.RequestId = fmt.Sprintf("%032x", b.index)
	env.Actor = "system"
	env.ProposedAt = timestamppb.Now()
	if res := b.f.Apply(b.index, env); res.GetCode() != pb.Code_CODE_OK {
		tb.Fatalf("apply %v: %v %s", env.GetCommand(), res.GetCode(), res.GetMessage())
	}
}

// simulatedState is a state of n alive client nodes (named by name, each
// a gossip member) of cards L4 cards each and a shared accelerator over
// them, "shared", to deploy on (deploy).
func simulatedState(tb testing.TB, n, cards int, name func(int) string) *stateBackend {
	b := &stateBackend{f: fsm.New()}
	for i := range n {
		node := &pb.Node{Name: name(i), Role: pb.NodeRole_NODE_ROLE_CLIENT, Status: pb.NodeStatus_NODE_STATUS_ALIVE, Simulated: true}
		for c := range cards {
			node.Cards = append(node.Cards, &pb.Card{Index: uint32(c), Uuid: fmt.Sprintf("GPU-%s-%d", strings.TrimPrefix(node.Name, "node-"), c), Device: "l4",
				Product: "NVIDIA L4", MemoryMib: 23034, Architecture: "ada", Fp8: true, Healthy: true})
		}
		b.apply(tb, &pb.Envelope{Command: &pb.Envelope_RegisterNode{RegisterNode: &pb.RegisterNode{Node: node}}})
		b.members = append(b.members, &pb.Member{Name: node.Name, Role: "client", Status: "alive", Raft: "none"})
	}
	b.apply(tb, &pb.Envelope{Command: &pb.Envelope_CreateAccelerator{CreateAccelerator: &pb.CreateAccelerator{Name: "shared",
		Spec: &pb.AcceleratorSpec{Device: "l4", Tenancy: pb.Tenancy_TENANCY_SHARED, MaxModels: 4}}}})
	return b
}

// deploy deploys name on the shared accelerator with replicas replicas of
// 20% of a card, places replica r on place(r) (node and card), and
// reports each running with the residency residency(r), for reason.
func (b *stateBackend) deploy(tb testing.TB, name string, res pb.Residency, ttftMs uint32, replicas int,
	place func(r int) (string, uint32), residency func(r int) pb.ReplicaResidency, reason string) {
	tb.Helper()
	b.apply(tb, &pb.Envelope{Command: &pb.Envelope_ApplyModel{ApplyModel: &pb.ApplyModel{Name: name, Spec: &pb.ModelSpec{
		Model: "/models/" + name, Replicas: uint32(replicas), Residency: res, Slo: &pb.SLO{TtftMs: ttftMs},
		Placement: &pb.PlacementSpec{Accelerator: "shared"}, Engine: &pb.EngineSpec{Kind: "sim", MemoryPercent: 20}}}}})
	var ps []*pb.Placement
	for r := range replicas {
		node, card := place(r)
		ps = append(ps, &pb.Placement{Model: name, Replica: uint32(r), Generation: 1, Node: node, Cards: []uint32{card}})
	}
	b.apply(tb, &pb.Envelope{Command: &pb.Envelope_PlaceReplicas{PlaceReplicas: &pb.PlaceReplicas{Policy: "binpack", Placements: ps}}})
	for r := range replicas {
		node, _ := place(r)
		b.replicaStatus(tb, name, uint32(r), node, residency(r), reason)
	}
}

// replicaStatus reports replica of model running on node with the
// residency r, for reason; asleep, it keeps 300 MiB on the card.
func (b *stateBackend) replicaStatus(tb testing.TB, model string, replica uint32, node string, r pb.ReplicaResidency, reason string) {
	tb.Helper()
	b.apply(tb, &pb.Envelope{Command: &pb.Envelope_ReplicaStatus{ReplicaStatus: &pb.ReplicaStatus{Model: model, Replica: replica, Generation: 1,
		Node: node, State: pb.ReplicaState_REPLICA_STATE_RUNNING, Endpoint: "http://127.0.0.1:1", Residency: r, ResidencyReason: reason,
		ResidualMib: 300}}})
}

// dashboardClient serves the API of node over b, with its residency
// journal and gateway series, until the test ends, and returns a
// DashboardService client of it.
func dashboardClient(tb testing.TB, b *stateBackend, node string, journal *residency.Journal, reg *prometheus.Registry) gpuplanev1connect.DashboardServiceClient {
	tb.Helper()
	var j rpc.ResidencyJournal
	if journal != nil {
		j = residencypb.Journal{J: journal}
	}
	srv, err := rpc.Listen("127.0.0.1:0", rpc.Config{Backend: b, NodeName: node, Residency: j, Gatherer: reg})
	if err != nil {
		tb.Fatal(err)
	}
	go func() { _ = srv.Serve() }()
	tb.Cleanup(func() { shutdown(srv) })
	return gpuplanev1connect.NewDashboardServiceClient(rpc.HTTPClient(), "http://"+srv.Addr().String())
}
