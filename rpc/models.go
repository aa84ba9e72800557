package rpc

import (
	"context"

	"connectrpc.com/connect"

	"github.com/gpuplane/gpuplane/fsm"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

func (h *handlers) ListModels(ctx context.Context, req *connect.Request[pb.ListModelsRequest]) (*connect.Response[pb.ListModelsResponse], error) {
	out := &pb.ListModelsResponse{}
	err := h.read(ctx, req.Msg.Stale, func(f *fsm.FSM) error {
		out.Models = f.Models()
		return nil
	})
	if tenant, ok := tenantScope(ctx); ok {
		for _, m := range out.Models {
			scopeModel(m, tenant)
		}
	}
	return connect.NewResponse(out), err
}

func (h *handlers) GetModel(ctx context.Context, req *connect.Request[pb.GetModelRequest]) (*connect.Response[pb.GetModelResponse], error) {
	out := &pb.GetModelResponse{}
	err := h.read(ctx, req.Msg.Stale, func(f *fsm.FSM) error {
		m, replicas, ok := f.Model(req.Msg.Name)
		if !ok {
			return notFound("deployment %q not found", req.Msg.Name)
		}
		out.Model, out.Replicas = m, replicas
		return nil
	})
	if tenant, ok := tenantScope(ctx); ok && out.Model != nil {
		scopeReplicas(out.Replicas, map[string]map[string]bool{out.Model.GetName(): usableAdapters(out.Model, tenant)})
		scopeModel(out.Model, tenant)
	}
	hideEndpoints(ctx, out.Replicas)
	return connect.NewResponse(out), err
}

func (h *handlers) ApplyModel(ctx context.Context, req *connect.Request[pb.ApplyModelRequest]) (*connect.Response[pb.ApplyModelResponse], error) {
	m := req.Msg
	env := &pb.Envelope{RequestId: m.RequestId, Command: &pb.Envelope_ApplyModel{
		ApplyModel: &pb.ApplyModel{Name: m.Name, Spec: m.Spec},
	}}
	res, err := h.propose(ctx, env, m.DryRun)
	if err != nil {
		return nil, err
	}
	out := &pb.ApplyModelResponse{Outcome: res.Outcome, Warnings: res.Warnings, Index: res.Index}
	_ = h.b.Read(ctx, true, func(f *fsm.FSM) error {
		out.Model, _, _ = f.Model(m.Name)
		return nil
	})
	if out.Model == nil && m.DryRun {
		out.Model = &pb.ModelDeployment{Name: m.Name, Spec: fsm.NormalizeModelSpec(m.Name, m.Spec)}
	}
	return connect.NewResponse(out), nil
}

func (h *handlers) DeleteModel(ctx context.Context, req *connect.Request[pb.DeleteModelRequest]) (*connect.Response[pb.DeleteModelResponse], error) {
	m := req.Msg
	env := &pb.Envelope{RequestId: m.RequestId, Command: &pb.Envelope_DeleteModel{DeleteModel: &pb.DeleteModel{Name: m.Name}}}
	res, err := h.propose(ctx, env, m.DryRun)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.DeleteModelResponse{Warnings: res.Warnings, Index: res.Index}), nil
}

func (h *handlers) ListReplicas(ctx context.Context, req *connect.Request[pb.ListReplicasRequest]) (*connect.Response[pb.ListReplicasResponse], error) {
	out := &pb.ListReplicasResponse{}
	err := h.read(ctx, req.Msg.Stale, func(f *fsm.FSM) error {
		out.Replicas = f.Replicas(req.Msg.Model, req.Msg.Node)
		if tenant, ok := tenantScope(ctx); ok {
			usable := map[string]map[string]bool{}
			for _, m := range f.Models() {
				usable[m.GetName()] = usableAdapters(m, tenant)
			}
			scopeReplicas(out.Replicas, usable)
		}
		return nil
	})
	hideEndpoints(ctx, out.Replicas)
	return connect.NewResponse(out), err
}

// hideEndpoints clears the replicas' endpoints for a caller below the
// operator role when ACLs are on: a read token is a tenant's, and a
// replica's endpoint (its engine's or its residency front's, on the
// node's loopback) is the gateway's business; clients send requests to
// the gateway. The replicas are the read's copies.
func hideEndpoints(ctx context.Context, rs []*pb.Replica) {
	p, ok := principalFrom(ctx)
	if !ok || p.access >= AccessOperator {
		return
	}
	for _, r := range rs {
		r.Endpoint = ""
	}
}
