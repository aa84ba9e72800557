package rpc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

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
	if err := checkRequestID(env.GetRequestId()); err != nil {
		return nil, err
	}
	var res *pb.Result
	var err error
	switch {
	case req.Msg.DryRun:
		res, err = h.b.DryRun(ctx, env)
	case req.Msg.UnlessUnchanged:
		res, err = h.b.Propose(ctx, env)
	default:
		res, err = h.b.Apply(ctx, env)
	}
	if err != nil {
		return nil, backendError("apply", err)
	}
	return connect.NewResponse(&pb.ApplyResponse{Result: res}), nil
}

// MaxForwardBatch caps the envelopes in one Forward batch.
const MaxForwardBatch = 1024

// BatchBackend is a Backend that proposes several entries together
// (*cluster.Cluster); Forward falls back to concurrent Applies without it.
type BatchBackend interface {
	// ApplyBatch applies each envelope as Apply would; for each, in order,
	// either its result or its error is set.
	ApplyBatch(ctx context.Context, envs []*pb.Envelope) ([]*pb.Result, []error)
}

// Forward serves the stream of writes another node forwards here. Each batch
// is applied as it arrives, concurrently with the next ones, and answered
// once all its entries have a result or an error: the forwarding node hands
// each to the caller that wrote it. The stream ends when the other node
// closes it, or with Unavailable when this server shuts down (the other
// node then retries the writes still unanswered, as after any leadership
// error).
func (h *handlers) Forward(ctx context.Context, stream *connect.BidiStream[pb.ForwardRequest, pb.ForwardResponse]) error {
	type received struct {
		req *pb.ForwardRequest
		err error
	}
	in := make(chan received)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		for {
			req, err := stream.Receive()
			select {
			case in <- received{req, err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	var sendMu sync.Mutex // Send is not safe for concurrent use
	var wg sync.WaitGroup
	// No Send may follow the return: wait for every batch's answer first.
	defer wg.Wait()
	for {
		var r received
		select {
		case r = <-in:
		case <-h.closing:
			return connect.NewError(connect.CodeUnavailable, errors.New("server shutting down: forward to the leader again"))
		}
		if errors.Is(r.err, io.EOF) {
			return nil
		}
		if r.err != nil {
			return r.err
		}
		if n := len(r.req.GetEnvelopes()); n > MaxForwardBatch {
			return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("envelopes: %d in one batch, at most %d", n, MaxForwardBatch))
		}
		wg.Go(func() {
			timeout := time.Duration(r.req.GetTimeoutMs()) * time.Millisecond
			if timeout <= 0 || timeout > MaxUnaryDuration {
				timeout = MaxUnaryDuration
			}
			bctx, bcancel := context.WithTimeout(ctx, timeout)
			resp := &pb.ForwardResponse{Batch: r.req.GetBatch(), Results: h.forwardBatch(bctx, r.req.GetEnvelopes())}
			bcancel()
			sendMu.Lock()
			defer sendMu.Unlock()
			if err := stream.Send(resp); err != nil {
				cancel() // the other node is gone; so is the stream
			}
		})
	}
}

// forwardBatch applies one forwarded batch: a result or an error for each.
func (h *handlers) forwardBatch(ctx context.Context, envs []*pb.Envelope) []*pb.ForwardResult {
	out := make([]*pb.ForwardResult, len(envs))
	var todo []*pb.Envelope
	var at []int
	for i, env := range envs {
		if env == nil {
			out[i] = &pb.ForwardResult{Error: applyError(connect.NewError(connect.CodeInvalidArgument, errEnvelopeRequired))}
			continue
		}
		if err := checkRequestID(env.GetRequestId()); err != nil {
			out[i] = &pb.ForwardResult{Error: applyError(err)}
			continue
		}
		todo = append(todo, env)
		at = append(at, i)
	}
	results, errs := applyBatch(ctx, h.b, todo)
	for j, i := range at {
		if errs[j] != nil {
			out[i] = &pb.ForwardResult{Error: applyError(backendError("apply", errs[j]))}
		} else {
			out[i] = &pb.ForwardResult{Result: results[j]}
		}
	}
	return out
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

// applyError carries a Connect error (as backendError makes them) in a
// ForwardResult; the forwarding node turns it back into one.
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

func (h *handlers) ReadNode(ctx context.Context, req *connect.Request[pb.ReadNodeRequest]) (*connect.Response[pb.ReadNodeResponse], error) {
	if req.Msg.GetNode() == "" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("node: is required"))
	}
	resp, err := h.b.ReadNode(ctx, req.Msg.GetNode(), req.Msg.GetStale(), req.Msg.GetMinIndex())
	if err != nil {
		return nil, backendError("read node", err)
	}
	return connect.NewResponse(resp), nil
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
