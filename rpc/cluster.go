package rpc

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"connectrpc.com/connect"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// ClusterService: the write path between nodes, Raft status, gossip
// membership, join and leave.

// Apply is the write path between nodes: a follower forwards envelopes here
// and the leader commits them (or checks them, for dry runs) as they are,
// keeping the original actor and request id.
func (h *handlers) Apply(ctx context.Context, req *connect.Request[pb.ApplyRequest]) (*connect.Response[pb.ApplyResponse], error) {
	env := req.Msg.GetEnvelope()
	if env == nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, errEnvelopeRequired)
	}
	var res *pb.Result
	var err error
	if req.Msg.DryRun {
		res, err = h.b.DryRun(ctx, env)
	} else {
		res, err = h.b.Apply(ctx, env)
	}
	if err != nil {
		return nil, backendError("apply", err)
	}
	return connect.NewResponse(&pb.ApplyResponse{Result: res}), nil
}

// MaxApplyBatch caps the envelopes in one ApplyBatch call.
const MaxApplyBatch = 1024

// BatchBackend is a Backend that proposes several entries together
// (*cluster.Cluster); ApplyBatch falls back to concurrent Applies without it.
type BatchBackend interface {
	// ApplyBatch applies each envelope as Apply would; for each, in order,
	// either its result or its error is set.
	ApplyBatch(ctx context.Context, envs []*pb.Envelope) ([]*pb.Result, []error)
}

// ApplyBatch is Apply for the writes a node forwards together: each entry
// gets its own result or error, which the forwarding node hands to the
// caller that wrote it.
func (h *handlers) ApplyBatch(ctx context.Context, req *connect.Request[pb.ApplyBatchRequest]) (*connect.Response[pb.ApplyBatchResponse], error) {
	envs := req.Msg.GetEnvelopes()
	if len(envs) > MaxApplyBatch {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("envelopes: %d in one batch, at most %d", len(envs), MaxApplyBatch))
	}
	out := &pb.ApplyBatchResponse{Results: make([]*pb.ApplyBatchResult, len(envs))}
	var todo []*pb.Envelope
	var at []int
	for i, env := range envs {
		if env == nil {
			out.Results[i] = &pb.ApplyBatchResult{Error: applyError(connect.NewError(connect.CodeInvalidArgument, errEnvelopeRequired))}
			continue
		}
		todo = append(todo, env)
		at = append(at, i)
	}
	results, errs := applyBatch(ctx, h.b, todo)
	for j, i := range at {
		if errs[j] != nil {
			out.Results[i] = &pb.ApplyBatchResult{Error: applyError(backendError("apply", errs[j]))}
		} else {
			out.Results[i] = &pb.ApplyBatchResult{Result: results[j]}
		}
	}
	return connect.NewResponse(out), nil
}

func applyBatch(ctx context.Context, b Backend, envs []*pb.Envelope) ([]*pb.Result, []error) {
	if bb, ok := b.(BatchBackend); ok {
		return bb.ApplyBatch(ctx, envs)
	}
	results := make([]*pb.Result, len(envs))
	errs := make([]error, len(envs))
	var wg sync.WaitGroup
	for i, env := range envs {
		wg.Go(func() { results[i], errs[i] = b.Apply(ctx, env) })
	}
	wg.Wait()
	return results, errs
}

// applyError carries a Connect error (as backendError makes them) in an
// ApplyBatchResult; batchEntryError turns it back into one.
func applyError(err error) *pb.ApplyError {
	if ce := new(connect.Error); errors.As(err, &ce) {
		return &pb.ApplyError{Code: uint32(ce.Code()), Message: ce.Message()}
	}
	return &pb.ApplyError{Code: uint32(connect.CodeUnknown), Message: err.Error()}
}

func (h *handlers) Status(ctx context.Context, req *connect.Request[pb.StatusRequest]) (*connect.Response[pb.StatusResponse], error) {
	st, err := h.b.ClusterStatus(ctx)
	if err != nil {
		return nil, backendError("status", err)
	}
	return connect.NewResponse(st), nil
}

func (h *handlers) ReadIndex(ctx context.Context, req *connect.Request[pb.ReadIndexRequest]) (*connect.Response[pb.ReadIndexResponse], error) {
	idx, err := h.b.ReadIndex(ctx)
	if err != nil {
		return nil, backendError("read index", err)
	}
	return connect.NewResponse(&pb.ReadIndexResponse{Index: idx}), nil
}

func (h *handlers) ReadState(ctx context.Context, req *connect.Request[pb.ReadStateRequest]) (*connect.Response[pb.ReadStateResponse], error) {
	data, idx, err := h.b.ReadState(ctx, req.Msg.Stale)
	if err != nil {
		return nil, backendError("read state", err)
	}
	return connect.NewResponse(&pb.ReadStateResponse{State: data, AppliedIndex: idx}), nil
}

func (h *handlers) Members(ctx context.Context, req *connect.Request[pb.MembersRequest]) (*connect.Response[pb.MembersResponse], error) {
	ms, err := h.b.Members(ctx)
	if err != nil {
		return nil, backendError("members", err)
	}
	return connect.NewResponse(&pb.MembersResponse{Members: ms}), nil
}

func (h *handlers) LocalNode(ctx context.Context, req *connect.Request[pb.LocalNodeRequest]) (*connect.Response[pb.LocalNodeResponse], error) {
	n := h.b.LocalNode()
	if n == nil {
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("this node has not described itself yet"))
	}
	return connect.NewResponse(&pb.LocalNodeResponse{Node: n}), nil
}

func (h *handlers) Join(ctx context.Context, req *connect.Request[pb.JoinRequest]) (*connect.Response[pb.JoinResponse], error) {
	if len(req.Msg.Addresses) == 0 {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("addresses: at least one gossip address is required"))
	}
	n, err := h.b.Join(ctx, req.Msg.Addresses)
	if err != nil {
		return nil, connect.NewError(connect.CodeUnavailable, err)
	}
	return connect.NewResponse(&pb.JoinResponse{Joined: int32(n)}), nil
}

func (h *handlers) Leave(ctx context.Context, req *connect.Request[pb.LeaveRequest]) (*connect.Response[pb.LeaveResponse], error) {
	if err := h.b.Leave(ctx); err != nil {
		return nil, backendError("leave", err)
	}
	return connect.NewResponse(&pb.LeaveResponse{}), nil
}

func (h *handlers) RemovePeer(ctx context.Context, req *connect.Request[pb.RemovePeerRequest]) (*connect.Response[pb.RemovePeerResponse], error) {
	if req.Msg.Name == "" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("name: is required"))
	}
	if err := h.b.RemovePeer(ctx, req.Msg.Name); err != nil {
		return nil, backendError("remove peer", err)
	}
	return connect.NewResponse(&pb.RemovePeerResponse{}), nil
}
