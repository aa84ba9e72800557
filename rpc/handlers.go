package rpc

import (
	"context"

	"connectrpc.com/connect"

	"github.com/gpuplane/gpuplane/fsm"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// Anonymous is the actor recorded for requests when ACLs are off.
const Anonymous = "anonymous"

type actorKey struct{}

// WithActor returns ctx carrying the authenticated actor's name.
func WithActor(ctx context.Context, actor string) context.Context {
	return context.WithValue(ctx, actorKey{}, actor)
}

func actorFrom(ctx context.Context) string {
	if a, ok := ctx.Value(actorKey{}).(string); ok && a != "" {
		return a
	}
	return Anonymous
}

// handlers implements every service over one Backend.
type handlers struct {
	b Backend
	// closing is closed when the server shuts down; streams end then.
	closing <-chan struct{}
}

// propose checks env against the current state and, unless this is a dry run
// or the change would do nothing, commits it. The check first keeps invalid
// requests and no-ops out of the log; the state machine checks again at apply,
// so a race between the two is rejected, never applied.
func (h *handlers) propose(ctx context.Context, env *pb.Envelope, dryRun bool) (*pb.Result, error) {
	if err := checkRequestID(env.GetRequestId()); err != nil {
		return nil, err
	}
	env.Actor = actorFrom(ctx)
	if dryRun {
		res, err := h.b.DryRun(ctx, env)
		if err != nil {
			return nil, backendError("check", err)
		}
		if err := resultError(res); err != nil {
			return nil, err
		}
		res.Index = 0
		return res, nil
	}
	res, err := h.b.Propose(ctx, env)
	if err != nil {
		return nil, backendError("apply", err)
	}
	if err := resultError(res); err != nil {
		return nil, err
	}
	return res, nil
}

func (h *handlers) read(ctx context.Context, stale bool, fn func(*fsm.FSM) error) error {
	return backendError("read", h.b.Read(ctx, stale, fn))
}

func (h *handlers) ListDevices(ctx context.Context, req *connect.Request[pb.ListDevicesRequest]) (*connect.Response[pb.ListDevicesResponse], error) {
	out := &pb.ListDevicesResponse{}
	err := h.read(ctx, req.Msg.Stale, func(f *fsm.FSM) error {
		out.Devices = f.Devices()
		return nil
	})
	return connect.NewResponse(out), err
}

func (h *handlers) GetDevice(ctx context.Context, req *connect.Request[pb.GetDeviceRequest]) (*connect.Response[pb.GetDeviceResponse], error) {
	out := &pb.GetDeviceResponse{}
	err := h.read(ctx, req.Msg.Stale, func(f *fsm.FSM) error {
		d, cards, ok := f.Device(req.Msg.Name)
		if !ok {
			return notFound("device %q not found: no node reports it and the catalog does not know it", req.Msg.Name)
		}
		out.Device, out.Cards = d, cards
		return nil
	})
	return connect.NewResponse(out), err
}

func (h *handlers) ListNodes(ctx context.Context, req *connect.Request[pb.ListNodesRequest]) (*connect.Response[pb.ListNodesResponse], error) {
	out := &pb.ListNodesResponse{}
	err := h.read(ctx, req.Msg.Stale, func(f *fsm.FSM) error {
		out.Nodes = f.Nodes()
		return nil
	})
	return connect.NewResponse(out), err
}

func (h *handlers) GetNode(ctx context.Context, req *connect.Request[pb.GetNodeRequest]) (*connect.Response[pb.GetNodeResponse], error) {
	out := &pb.GetNodeResponse{}
	err := h.read(ctx, req.Msg.Stale, func(f *fsm.FSM) error {
		n, ok := f.Node(req.Msg.Name)
		if !ok {
			return notFound("node %q not found", req.Msg.Name)
		}
		out.Node = n
		return nil
	})
	return connect.NewResponse(out), err
}

func (h *handlers) ListAccelerators(ctx context.Context, req *connect.Request[pb.ListAcceleratorsRequest]) (*connect.Response[pb.ListAcceleratorsResponse], error) {
	out := &pb.ListAcceleratorsResponse{}
	err := h.read(ctx, req.Msg.Stale, func(f *fsm.FSM) error {
		out.Accelerators = f.Accelerators()
		return nil
	})
	return connect.NewResponse(out), err
}

func (h *handlers) GetAccelerator(ctx context.Context, req *connect.Request[pb.GetAcceleratorRequest]) (*connect.Response[pb.GetAcceleratorResponse], error) {
	out := &pb.GetAcceleratorResponse{}
	err := h.read(ctx, req.Msg.Stale, func(f *fsm.FSM) error {
		a, ok := f.Accelerator(req.Msg.Name)
		if !ok {
			return notFound("accelerator %q not found", req.Msg.Name)
		}
		out.Accelerator = a
		return nil
	})
	return connect.NewResponse(out), err
}

func (h *handlers) CreateAccelerator(ctx context.Context, req *connect.Request[pb.CreateAcceleratorRequest]) (*connect.Response[pb.CreateAcceleratorResponse], error) {
	m := req.Msg
	env := &pb.Envelope{RequestId: m.RequestId, Command: &pb.Envelope_CreateAccelerator{
		CreateAccelerator: &pb.CreateAccelerator{Name: m.Name, Spec: m.Spec, Upsert: m.Upsert},
	}}
	res, err := h.propose(ctx, env, m.DryRun)
	if err != nil {
		return nil, err
	}
	out := &pb.CreateAcceleratorResponse{Outcome: res.Outcome, Warnings: res.Warnings, Index: res.Index}
	// Read back what the state now holds; a dry run shows the would-be spec.
	_ = h.b.Read(ctx, true, func(f *fsm.FSM) error {
		out.Accelerator, _ = f.Accelerator(m.Name)
		return nil
	})
	if out.Accelerator == nil && m.DryRun {
		out.Accelerator = &pb.Accelerator{Name: m.Name, Spec: fsm.NormalizeAcceleratorSpec(m.Spec)}
	}
	return connect.NewResponse(out), nil
}

func (h *handlers) DeleteAccelerator(ctx context.Context, req *connect.Request[pb.DeleteAcceleratorRequest]) (*connect.Response[pb.DeleteAcceleratorResponse], error) {
	m := req.Msg
	env := &pb.Envelope{RequestId: m.RequestId, Command: &pb.Envelope_DeleteAccelerator{
		DeleteAccelerator: &pb.DeleteAccelerator{Name: m.Name, Force: m.Force},
	}}
	res, err := h.propose(ctx, env, m.DryRun)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.DeleteAcceleratorResponse{Warnings: res.Warnings, Index: res.Index}), nil
}
