package rpc

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/gpuplane/gpuplane/fsm"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
	"github.com/gpuplane/gpuplane/proto/gpuplane/v1/gpuplanev1connect"
)

// ResidencyJournal is what ResidencyService needs of a node's residency
// decision journal, already in the wire's shapes; the node's controller
// package stays out of rpc's imports (node/residency/residencypb adapts its
// Journal).
type ResidencyJournal interface {
	// Node names the node the journal belongs to.
	Node() string
	// Decisions returns the decisions after seq, oldest first, and a channel
	// closed when a later one is recorded.
	Decisions(after uint64) ([]*pb.ResidencyDecision, <-chan struct{})
	// Plan is each card's current plan.
	Plan() []*pb.ResidencyCardPlan
	// Profiles are the measured load/wake/footprint profiles.
	Profiles() []*pb.ResidencyProfile
	// Operate loads (load) or unloads the replicas of model that this
	// node's controllers hold, as the operator asked; no result and no
	// error where none is held here or no controller runs. An error is the
	// controller's refusal, with its reason. by is who asked (the API
	// caller), named in the decisions' reasons.
	Operate(ctx context.Context, model string, load bool, by string) ([]*pb.OperateResult, error)
	// Protect puts the operator's choice of the protected set in force
	// on this node's cards that hold one of models (none: gives the
	// choice back to the controllers); the same answers as Operate.
	Protect(ctx context.Context, models []string, by string) ([]*pb.OperateResult, error)
}

// TrafficSource is a node's request record (node/traffic), in the wire's
// shapes: card nil means every card. Tenant names do not leave it: each
// answer names them t1, t2, ... in the order first seen.
type TrafficSource interface {
	Requests(card *uint32, since time.Time) []*pb.RequestRecord
}

// residencyHandlers serve what each node's residency manager published in
// its journal. The journal lives on its node, so a request for every node
// (or for another node) asks the others over the peer client, as engine logs
// are relayed; a request naming this node is answered from its journal.
type residencyHandlers struct {
	b       Backend
	node    string
	journal ResidencyJournal // nil: residency does not run on this node
	traffic TrafficSource    // nil: the node keeps no request record
	peers   *http.Client
	closing <-chan struct{}
}

// decisionBatch bounds the decisions sent in one stream message.
const decisionBatch = 512

// residencyPeerTimeout bounds a unary question to another node, so that one
// node that hangs does not hold a listing of every node until the client
// gives up.
const residencyPeerTimeout = 15 * time.Second

// residencyRelayHeader marks a request one node relays to another for its
// own answer; the receiver answers for itself or refuses, never relays again
// (a node whose registered name is not its own would otherwise ask itself
// forever).
const residencyRelayHeader = "Gpuplane-Residency-Relayed"

// relayed makes req a relayed request.
func relayed[T any](req *connect.Request[T]) *connect.Request[T] {
	req.Header().Set(residencyRelayHeader, "1")
	return req
}

// residencyTarget is a node a request is answered for.
type residencyTarget struct {
	name, addr string
	self       bool
}

// targets are the nodes a request for node (empty: all) is answered for.
// Nodes the cluster knows to be down or gone are left out of "all": they
// cannot answer, and their controllers are not running.
func (h *residencyHandlers) targets(ctx context.Context, node string, header http.Header) ([]residencyTarget, error) {
	if node != "" && node == h.node {
		return []residencyTarget{{name: h.node, self: true}}, nil
	}
	if header.Get(residencyRelayHeader) != "" {
		return nil, connect.NewError(connect.CodeFailedPrecondition,
			fmt.Errorf("node %s was asked for node %q's residency: the cluster's record of node addresses does not match", h.node, node))
	}
	var nodes []*pb.Node
	err := h.b.Read(ctx, true, func(f *fsm.FSM) error {
		nodes = f.Nodes()
		return nil
	})
	if err != nil {
		return nil, backendError("residency", err)
	}
	if node != "" {
		for _, n := range nodes {
			if n.GetName() != node {
				continue
			}
			if n.GetAddress() == "" {
				return nil, connect.NewError(connect.CodeUnavailable, fmt.Errorf("node %s has not registered its API address: it cannot be asked", node))
			}
			return []residencyTarget{{name: node, addr: n.GetAddress()}}, nil
		}
		return nil, notFound("node %q not found", node)
	}
	out := []residencyTarget{{name: h.node, self: true}}
	for _, n := range nodes {
		if n.GetName() == h.node || n.GetAddress() == "" ||
			n.GetStatus() == pb.NodeStatus_NODE_STATUS_DOWN || n.GetStatus() == pb.NodeStatus_NODE_STATUS_LEFT {
			continue
		}
		out = append(out, residencyTarget{name: n.GetName(), addr: n.GetAddress()})
	}
	slices.SortFunc(out, func(a, b residencyTarget) int { return cmp.Compare(a.name, b.name) })
	return out, nil
}

func (h *residencyHandlers) client(t residencyTarget) gpuplanev1connect.ResidencyServiceClient {
	return gpuplanev1connect.NewResidencyServiceClient(h.peers, BaseURL(t.addr), connect.WithReadMaxBytes(MaxMessageBytes))
}

// peerError names the node that could not answer. A node that does not
// know ResidencyService (an older version, during a rolling upgrade) runs no
// residency controller: it has nothing to show, which is not an error.
func peerError(t residencyTarget, err error) error {
	if connect.CodeOf(err) == connect.CodeUnimplemented {
		return nil
	}
	code := connect.CodeUnavailable
	if ce := new(connect.Error); errors.As(err, &ce) {
		code = ce.Code()
	}
	return connect.NewError(code, fmt.Errorf("node %s at %s: %w", t.name, t.addr, err))
}

// eachTarget calls ask for every target at once and returns the first
// error; a target's answer goes to index i of the caller's slice.
func eachTarget(ctx context.Context, ts []residencyTarget, ask func(ctx context.Context, i int, t residencyTarget) error) error {
	errs := make([]error, len(ts))
	var wg sync.WaitGroup
	for i, t := range ts {
		wg.Go(func() {
			c, cancel := context.WithTimeout(ctx, residencyPeerTimeout)
			defer cancel()
			errs[i] = ask(c, i, t)
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (h *residencyHandlers) GetPlan(ctx context.Context, req *connect.Request[pb.GetPlanRequest]) (*connect.Response[pb.GetPlanResponse], error) {
	ts, err := h.targets(ctx, req.Msg.GetNode(), req.Header())
	if err != nil {
		return nil, err
	}
	answers := make([][]*pb.ResidencyCardPlan, len(ts))
	err = eachTarget(ctx, ts, func(ctx context.Context, i int, t residencyTarget) error {
		if t.self {
			answers[i] = h.localPlan()
			return nil
		}
		resp, err := h.client(t).GetPlan(ctx, relayed(connect.NewRequest(&pb.GetPlanRequest{Node: t.name})))
		if err != nil {
			return peerError(t, err)
		}
		answers[i] = resp.Msg.GetCards()
		return nil
	})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.GetPlanResponse{Cards: slices.Concat(answers...)}), nil
}

func (h *residencyHandlers) ListProfiles(ctx context.Context, req *connect.Request[pb.ListProfilesRequest]) (*connect.Response[pb.ListProfilesResponse], error) {
	ts, err := h.targets(ctx, req.Msg.GetNode(), req.Header())
	if err != nil {
		return nil, err
	}
	answers := make([][]*pb.ResidencyProfile, len(ts))
	err = eachTarget(ctx, ts, func(ctx context.Context, i int, t residencyTarget) error {
		if t.self {
			answers[i] = h.localProfiles()
			return nil
		}
		resp, err := h.client(t).ListProfiles(ctx, relayed(connect.NewRequest(&pb.ListProfilesRequest{Node: t.name})))
		if err != nil {
			return peerError(t, err)
		}
		answers[i] = resp.Msg.GetProfiles()
		return nil
	})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.ListProfilesResponse{Profiles: slices.Concat(answers...)}), nil
}

// ListDecisions sends the decisions of the nodes asked. Without follow they
// are merged in time order; with follow each node's decisions are sent as
// they arrive (in order per node) until the client goes away.
func (h *residencyHandlers) ListDecisions(ctx context.Context, req *connect.Request[pb.ListDecisionsRequest], stream *connect.ServerStream[pb.ListDecisionsResponse]) error {
	m := req.Msg
	ts, err := h.targets(ctx, m.GetNode(), req.Header())
	if err != nil {
		return err
	}
	// A tenant's key reads the decisions about deployments, filtered here
	// on the node it asked, whatever node recorded them (tenantscope.go).
	scope := func(ds []*pb.ResidencyDecision) []*pb.ResidencyDecision { return ds }
	if _, ok := tenantScope(ctx); ok {
		scope = scopeDecisions
	}
	if !m.GetFollow() {
		answers := make([][]*pb.ResidencyDecision, len(ts))
		err := eachTarget(ctx, ts, func(ctx context.Context, i int, t residencyTarget) error {
			return h.decisionsOf(ctx, t, m, func(ds []*pb.ResidencyDecision) error {
				answers[i] = append(answers[i], ds...)
				return nil
			})
		})
		if err != nil {
			return err
		}
		all := scope(slices.Concat(answers...))
		slices.SortStableFunc(all, func(a, b *pb.ResidencyDecision) int {
			return cmp.Or(a.GetTime().AsTime().Compare(b.GetTime().AsTime()), cmp.Compare(a.GetNode(), b.GetNode()), cmp.Compare(a.GetSeq(), b.GetSeq()))
		})
		for chunk := range slices.Chunk(all, decisionBatch) {
			if err := stream.Send(&pb.ListDecisionsResponse{Decisions: chunk}); err != nil {
				return err
			}
		}
		return nil
	}
	// Following: answer the call now (the client waits for the headers,
	// and quiet nodes may send nothing for long), then one goroutine per
	// node; this one alone sends on the stream.
	if err := stream.Send(nil); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	batches := make(chan []*pb.ResidencyDecision)
	errs := make(chan error, len(ts))
	for _, t := range ts {
		go func() {
			errs <- h.decisionsOf(ctx, t, m, func(ds []*pb.ResidencyDecision) error {
				select {
				case batches <- ds:
					return nil
				case <-ctx.Done():
					return ctx.Err()
				}
			})
		}()
	}
	for running := len(ts); ; {
		select {
		case ds := <-batches:
			if ds = scope(ds); len(ds) == 0 {
				continue
			}
			if err := stream.Send(&pb.ListDecisionsResponse{Decisions: ds}); err != nil {
				return err
			}
		case err := <-errs:
			if err != nil && ctx.Err() == nil {
				return err
			}
			if running--; running == 0 {
				return nil
			}
		case <-h.closing:
			return nil
		case <-ctx.Done():
			return nil
		}
	}
}

// decisionsOf passes t's decisions matching m to send, in batches; with
// follow it keeps passing new ones until ctx ends.
func (h *residencyHandlers) decisionsOf(ctx context.Context, t residencyTarget, m *pb.ListDecisionsRequest, send func([]*pb.ResidencyDecision) error) error {
	if !t.self {
		up, err := h.client(t).ListDecisions(ctx, relayed(connect.NewRequest(&pb.ListDecisionsRequest{
			Node: t.name, Model: m.GetModel(), Follow: m.GetFollow(), After: m.GetAfter(),
		})))
		if err != nil {
			return peerError(t, err)
		}
		defer up.Close()
		for up.Receive() {
			if err := send(up.Msg().GetDecisions()); err != nil {
				return err
			}
		}
		if err := up.Err(); err != nil && ctx.Err() == nil {
			return peerError(t, err)
		}
		return nil
	}
	if h.journal == nil {
		if m.GetFollow() {
			// Nothing will ever be recorded here; keep the stream as the
			// client asked, like a node whose controllers are quiet.
			select {
			case <-ctx.Done():
			case <-h.closing:
			}
		}
		return nil
	}
	after := m.GetAfter()
	for {
		ds, changed := h.journal.Decisions(after)
		var out []*pb.ResidencyDecision
		for _, d := range ds {
			after = d.GetSeq()
			if want := m.GetModel(); want == "" || aboutModel(d.GetModel(), want) || aboutModel(d.GetForModel(), want) {
				out = append(out, d)
			}
		}
		for chunk := range slices.Chunk(out, decisionBatch) {
			if err := send(chunk); err != nil {
				return err
			}
		}
		if !m.GetFollow() {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil
		case <-h.closing:
			return nil
		}
	}
}

// ListRequests answers one node's request record: this node's own, or
// another's, relayed.
func (h *residencyHandlers) ListRequests(ctx context.Context, req *connect.Request[pb.ListRequestsRequest]) (*connect.Response[pb.ListRequestsResponse], error) {
	m := req.Msg
	if m.GetNode() == "" {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("node: must name the node whose request record is read"))
	}
	ts, err := h.targets(ctx, m.GetNode(), req.Header())
	if err != nil {
		return nil, err
	}
	t := ts[0]
	if !t.self {
		resp, err := h.client(t).ListRequests(ctx, relayed(connect.NewRequest(m)))
		if err != nil {
			return nil, peerError(t, err)
		}
		return resp, nil
	}
	if h.traffic == nil {
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("node %s keeps no request record (its gateway does not run)", h.node))
	}
	var since time.Time
	if m.GetSince() != nil {
		since = m.GetSince().AsTime()
	}
	var card *uint32
	if m.Card != nil {
		c := m.GetCard()
		card = &c
	}
	return connect.NewResponse(&pb.ListRequestsResponse{Requests: h.traffic.Requests(card, since)}), nil
}

func (h *residencyHandlers) localPlan() []*pb.ResidencyCardPlan {
	if h.journal == nil {
		return nil
	}
	return h.journal.Plan()
}

func (h *residencyHandlers) localProfiles() []*pb.ResidencyProfile {
	if h.journal == nil {
		return nil
	}
	return h.journal.Profiles()
}

// aboutModel reports whether the controller's model id (a replica,
// "chat/0") is want: the replica itself or any replica of the deployment
// want names.
func aboutModel(id, want string) bool {
	name, _, _ := strings.Cut(id, "/")
	return id == want || name == want
}

// Operate passes an operator's load or unload to the nodes that hold the
// model's replicas. Every node asked answers for the replicas it holds; a
// refusal on any node is returned with the reason its controller gave.
func (h *residencyHandlers) Operate(ctx context.Context, req *connect.Request[pb.OperateRequest]) (*connect.Response[pb.OperateResponse], error) {
	m := req.Msg
	model := m.GetModel()
	var load, protect bool
	switch m.GetAction() {
	case pb.OperateAction_OPERATE_ACTION_LOAD:
		load = true
	case pb.OperateAction_OPERATE_ACTION_UNLOAD:
	case pb.OperateAction_OPERATE_ACTION_PROTECT:
		protect = true
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("action: must be load, unload or protect, got %s", m.GetAction()))
	}
	names := []string{model}
	switch {
	case protect && model != "":
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("model: must be empty for protect (name the deployments in models)"))
	case protect:
		names = m.GetModels()
		for _, n := range names {
			if n == "" || strings.Contains(n, "/") {
				return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("models: %q is not a deployment name (protect takes deployments, not replicas)", n))
			}
		}
	case model == "":
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("model: must not be empty"))
	case len(m.GetModels()) > 0:
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("models: only for protect"))
	}
	if req.Header().Get(residencyRelayHeader) == "" {
		// Only the node first asked checks the names: a relayed request
		// was checked there.
		for _, n := range names {
			name, _, _ := strings.Cut(n, "/")
			var found bool
			err := h.b.Read(ctx, true, func(f *fsm.FSM) error {
				_, _, found = f.Model(name)
				return nil
			})
			if err != nil {
				return nil, backendError("residency", err)
			}
			if !found {
				return nil, notFound("model %q not found", name)
			}
		}
	}
	ts, err := h.targets(ctx, m.GetNode(), req.Header())
	if err != nil {
		return nil, err
	}
	// The decision names who asked: the caller, or for a request a node
	// relays, the caller it was relayed for.
	by := actorFrom(ctx)
	if p, ok := principalFrom(ctx); m.GetAskedBy() != "" && req.Header().Get(residencyRelayHeader) != "" && (!ok || p.access == AccessNode) {
		by = m.GetAskedBy()
	}
	answers := make([][]*pb.OperateResult, len(ts))
	err = eachTarget(ctx, ts, func(ctx context.Context, i int, t residencyTarget) error {
		if !t.self {
			resp, err := h.client(t).Operate(ctx, relayed(connect.NewRequest(&pb.OperateRequest{Node: t.name, Model: model, Models: m.GetModels(), Action: m.GetAction(), AskedBy: by})))
			if err != nil {
				if ce := new(connect.Error); errors.As(err, &ce) && ce.Code() == connect.CodeFailedPrecondition {
					return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("node %s: %s", t.name, ce.Message()))
				}
				return peerError(t, err)
			}
			answers[i] = resp.Msg.GetResults()
			return nil
		}
		if h.journal == nil {
			return nil
		}
		var rs []*pb.OperateResult
		var err error
		if protect {
			rs, err = h.journal.Protect(ctx, names, by)
		} else {
			rs, err = h.journal.Operate(ctx, model, load, by)
		}
		if err != nil {
			return connect.NewError(connect.CodeFailedPrecondition, err)
		}
		answers[i] = rs
		return nil
	})
	if err != nil {
		return nil, err
	}
	out := slices.Concat(answers...)
	if protect && len(out) == 0 && req.Header().Get(residencyRelayHeader) == "" {
		what := "no card's residency controller runs on a node"
		if len(names) > 0 {
			what = fmt.Sprintf("%s %s no replica on a node whose residency controller runs", strings.Join(names, ", "), map[bool]string{true: "has", false: "have"}[len(names) == 1])
		}
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("protect: %s (not placed yet, or its nodes run residency in advise mode or not at all)", what))
	}
	if len(out) == 0 && req.Header().Get(residencyRelayHeader) == "" {
		return nil, connect.NewError(connect.CodeFailedPrecondition,
			fmt.Errorf("model %q has no replica on a node whose residency controller runs (not placed yet, or its nodes run residency in advise mode or not at all)", model))
	}
	return connect.NewResponse(&pb.OperateResponse{Results: out}), nil
}
