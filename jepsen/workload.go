//go:build linux

package jepsen

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"connectrpc.com/connect"

	"github.com/gpuplane/gpuplane/internal/engines"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// The workload's resources. Register accelerators are dedicated and no
// deployment uses them, so create and delete depend on existence alone.
// Deployments all share the pool accelerator, whose 10 cards (5 nodes × 2
// simulated l4, and 2 more per hollow node) hold at most 20 replicas by
// maxModels and fewer by memory, so the deployments compete for the same
// cards and some replicas stay pending.
const (
	poolAccelerator = "pool"
	registerKeys    = 5
	deploymentKeys  = 4
	maxReplicas     = 10
	opTimeout       = 3 * time.Second
)

// deploymentMemory is each deployment's fixed memory share (percent of a
// card): only the replica count changes, so placed replicas keep their share.
var deploymentMemory = []uint32{30, 45, 60, 40}

func registerKey(i int) string   { return fmt.Sprintf("reg-%d", i) }
func deploymentKey(i int) string { return fmt.Sprintf("dep-%d", i) }

func requestID() string {
	var b [16]byte
	crand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Workload runs concurrent clients against the cluster's nodes.
type Workload struct {
	C       *Cluster
	H       *History
	Workers int
	// Seed drives the choice of operations (the timing still varies).
	Seed uint64

	processes atomic.Int64
	// Stale-planner counters, and the reasons of its first rejections.
	PlansProposed, PlansApplied, PlansRejected, PlansUnknown atomic.Int64
	rejectMu                                                 sync.Mutex
	Rejections                                               []string
}

// Setup creates the pool accelerator.
func (w *Workload) Setup(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		_, err := w.C.Client("s1").Accelerators.CreateAccelerator(ctx, connect.NewRequest(&pb.CreateAcceleratorRequest{
			Name: poolAccelerator, Upsert: true, RequestId: requestID(),
			Spec: &pb.AcceleratorSpec{Device: "l4", Tenancy: pb.Tenancy_TENANCY_SHARED, MaxModels: 2},
		}))
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("create accelerator %s: %w", poolAccelerator, err)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// Run runs the workers until ctx ends.
func (w *Workload) Run(ctx context.Context) {
	var wg sync.WaitGroup
	w.processes.Store(int64(w.Workers))
	for i := range w.Workers {
		wg.Go(func() { w.worker(ctx, i) })
	}
	wg.Wait()
}

func (w *Workload) worker(ctx context.Context, id int) {
	rng := rand.New(rand.NewPCG(w.Seed, uint64(id)))
	node := w.C.Agents[id%len(w.C.Agents)].Name
	process := id
	for ctx.Err() == nil {
		op := w.pick(rng)
		op.Worker, op.Process, op.Node = id, process, node
		w.do(ctx, op)
		if ctx.Err() != nil && op.Outcome == Unknown {
			// Cut short by the end of the run, not by a fault: the
			// outcome is still resolved from the log, but nothing more
			// is learned from it.
			op.Err = "run ended: " + op.Err
		}
		w.H.Add(op)
		if op.Outcome == Unknown {
			process = int(w.processes.Add(1)) - 1
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(20+rng.IntN(80)) * time.Millisecond):
		}
	}
}

func (w *Workload) pick(rng *rand.Rand) *Op {
	if rng.IntN(2) == 0 {
		op := &Op{Key: registerKey(rng.IntN(registerKeys))}
		switch r := rng.IntN(10); {
		case r < 4:
			op.Kind = OpCreate
		case r < 7:
			op.Kind = OpDelete
		default:
			op.Kind = OpRead
		}
		return op
	}
	op := &Op{Key: deploymentKey(rng.IntN(deploymentKeys))}
	switch r := rng.IntN(10); {
	case r < 5:
		op.Kind, op.Value = OpPut, uint32(1+rng.IntN(maxReplicas))
	case r < 7:
		op.Kind = OpModelDelete
	default:
		op.Kind = OpModelRead
	}
	return op
}

func deploymentSpec(key string, replicas uint32) *pb.ModelSpec {
	var i int
	fmt.Sscanf(key, "dep-%d", &i)
	return &pb.ModelSpec{
		Model: "/models/" + key, Replicas: replicas,
		Placement: &pb.PlacementSpec{Accelerator: poolAccelerator},
		Engine:    &pb.EngineSpec{Kind: engines.Sim, MemoryPercent: deploymentMemory[i%len(deploymentMemory)], TensorParallel: 1, PipelineParallel: 1},
	}
}

// do performs op through op.Node and fills in its outcome.
func (w *Workload) do(ctx context.Context, op *Op) {
	cl := w.C.Client(op.Node)
	if op.IsWrite() {
		op.RequestID = requestID()
	}
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	op.Call = w.H.Now()
	var err error
	switch op.Kind {
	case OpCreate:
		var res *connect.Response[pb.CreateAcceleratorResponse]
		res, err = cl.Accelerators.CreateAccelerator(ctx, connect.NewRequest(&pb.CreateAcceleratorRequest{
			Name: op.Key, RequestId: op.RequestID,
			Spec: &pb.AcceleratorSpec{Device: "l4", Tenancy: pb.Tenancy_TENANCY_DEDICATED, DevicesPerReplica: 1},
		}))
		if err == nil {
			op.Index = res.Msg.GetIndex()
		}
	case OpDelete:
		var res *connect.Response[pb.DeleteAcceleratorResponse]
		res, err = cl.Accelerators.DeleteAccelerator(ctx, connect.NewRequest(&pb.DeleteAcceleratorRequest{Name: op.Key, RequestId: op.RequestID}))
		if err == nil {
			op.Index = res.Msg.GetIndex()
		}
	case OpRead:
		_, err = cl.Accelerators.GetAccelerator(ctx, connect.NewRequest(&pb.GetAcceleratorRequest{Name: op.Key}))
		op.Found = err == nil
		if connect.CodeOf(err) == connect.CodeNotFound {
			err = nil
		}
	case OpPut:
		var res *connect.Response[pb.ApplyModelResponse]
		res, err = cl.Models.ApplyModel(ctx, connect.NewRequest(&pb.ApplyModelRequest{Name: op.Key, Spec: deploymentSpec(op.Key, op.Value), RequestId: op.RequestID}))
		if err == nil {
			op.Index = res.Msg.GetIndex()
		}
	case OpModelDelete:
		var res *connect.Response[pb.DeleteModelResponse]
		res, err = cl.Models.DeleteModel(ctx, connect.NewRequest(&pb.DeleteModelRequest{Name: op.Key, RequestId: op.RequestID}))
		if err == nil {
			op.Index = res.Msg.GetIndex()
		}
	case OpModelRead:
		var res *connect.Response[pb.GetModelResponse]
		res, err = cl.Models.GetModel(ctx, connect.NewRequest(&pb.GetModelRequest{Name: op.Key}))
		if err == nil {
			op.Found, op.Value = true, res.Msg.GetModel().GetSpec().GetReplicas()
		}
		if connect.CodeOf(err) == connect.CodeNotFound {
			err = nil
		}
	}
	op.Return = w.H.Now()
	classify(op, err)
}

// classify sets op's outcome from the error: the state machine's rejections
// are definite failures; everything else (unavailable, deadline, transport)
// leaves the outcome unknown.
func classify(op *Op, err error) {
	if err == nil {
		op.Outcome = Ok
		return
	}
	op.Err = err.Error()
	code := connect.CodeOf(err)
	op.Code = code.String()
	var ce *connect.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		// Nothing listened: the request never reached a server.
		op.Outcome, op.Code = Fail, "connection_refused"
	case errors.As(err, &ce) && (code == connect.CodeNotFound || code == connect.CodeAlreadyExists ||
		code == connect.CodeFailedPrecondition || code == connect.CodeInvalidArgument || code == connect.CodeAborted):
		op.Outcome = Fail
	default:
		op.Outcome = Unknown
		op.Return = never
	}
}

// FinalReads reads every key once through node after the faults have been
// healed, so that the linearizability check also covers the final state.
func (w *Workload) FinalReads(ctx context.Context, node string) {
	for i := range registerKeys {
		op := &Op{Kind: OpRead, Key: registerKey(i), Node: node, Worker: -1, Process: int(w.processes.Add(1)) - 1}
		w.do(ctx, op)
		w.H.Add(op)
	}
	for i := range deploymentKeys {
		op := &Op{Kind: OpModelRead, Key: deploymentKey(i), Node: node, Worker: -1, Process: int(w.processes.Add(1)) - 1}
		w.do(ctx, op)
		w.H.Add(op)
	}
}

// StalePlanner plays a scheduler working from stale state (a deposed leader,
// a slow follower): every interval it reads replicas and nodes with a stale
// read from a random node and proposes a PlaceReplicas plan that puts one
// pending replica on a random card of the right device, whether or not the
// card has room. The state machine must re-check the plan against the state
// at apply and reject it whenever it would over-commit (rule 11).
func (w *Workload) StalePlanner(ctx context.Context, interval time.Duration) {
	rng := rand.New(rand.NewPCG(w.Seed, 0x57a1e))
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
			return
		case <-time.After(interval):
		}
		node := w.C.Agents[rng.IntN(len(w.C.Agents))].Name
		plan, err := w.stalePlan(ctx, node, rng)
		if err != nil || plan == nil {
			continue
		}
		w.PlansProposed.Add(1)
		cctx, cancel := context.WithTimeout(ctx, opTimeout)
		res, err := w.C.Client(node).Cluster.Apply(cctx, connect.NewRequest(&pb.ApplyRequest{Envelope: &pb.Envelope{
			RequestId: requestID(), Actor: "jepsen/stale-planner",
			Command: &pb.Envelope_PlaceReplicas{PlaceReplicas: plan},
		}}))
		cancel()
		switch {
		case err != nil:
			w.PlansUnknown.Add(1)
		case res.Msg.GetResult().GetCode() == pb.Code_CODE_OK:
			w.PlansApplied.Add(1)
		default:
			w.PlansRejected.Add(1)
			w.rejectMu.Lock()
			if len(w.Rejections) < 5 {
				w.Rejections = append(w.Rejections, res.Msg.GetResult().GetMessage())
			}
			w.rejectMu.Unlock()
		}
	}
}

func (w *Workload) stalePlan(ctx context.Context, node string, rng *rand.Rand) (*pb.PlaceReplicas, error) {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	cl := w.C.Client(node)
	reps, err := cl.Models.ListReplicas(ctx, connect.NewRequest(&pb.ListReplicasRequest{Stale: true}))
	if err != nil {
		return nil, err
	}
	nodes, err := cl.Nodes.ListNodes(ctx, connect.NewRequest(&pb.ListNodesRequest{Stale: true}))
	if err != nil {
		return nil, err
	}
	var pending []*pb.Replica
	for _, r := range reps.Msg.GetReplicas() {
		if r.GetNode() == "" && r.GetAccelerator() == poolAccelerator {
			pending = append(pending, r)
		}
	}
	var alive []*pb.Node
	for _, n := range nodes.Msg.GetNodes() {
		if n.GetStatus() == pb.NodeStatus_NODE_STATUS_ALIVE && len(n.GetCards()) > 0 {
			alive = append(alive, n)
		}
	}
	if len(pending) == 0 || len(alive) == 0 {
		return nil, nil
	}
	r := pending[rng.IntN(len(pending))]
	n := alive[rng.IntN(len(alive))]
	card := n.GetCards()[rng.IntN(len(n.GetCards()))]
	return &pb.PlaceReplicas{Policy: "jepsen-stale", Placements: []*pb.Placement{{
		Model: r.GetModel(), Replica: r.GetIndex(), Generation: r.GetGeneration(),
		Node: n.GetName(), Cards: []uint32{card.GetIndex()},
	}}}, nil
}
