package rpc_test

import (
	"context"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/gpuplane/gpuplane/fsm"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
	"github.com/gpuplane/gpuplane/proto/gpuplane/v1/gpuplanev1connect"
	"github.com/gpuplane/gpuplane/rpc"
)

// TestACLMatrixTenantScope is the ACL matrix of the reads, with its
// tenant-scope column: for each read, which tokens may call it. "tenant"
// is a read token (a tenant's key) of tenant acme, "auditor" an
// auditor's. A tenant's token reads the cluster's infrastructure, its own
// of deployments, residency decisions and /metrics (filtered: own only),
// and none of the reads that show other tenants and have no own part
// (audit log, events, dashboard, residency plan); engine logs, which hold
// every tenant's prompts, need an operator. The matrix is
// docs/operations.md's.
func TestACLMatrixTenantScope(t *testing.T) {
	b := simulatedState(t, 1, 1, func(i int) string { return "node-000" })
	for _, tok := range []*pb.CreateToken{
		{Name: "tenant", Role: pb.Role_ROLE_READ, SecretHash: fsm.SecretHash("s-tenant"), Tenant: "acme"},
		{Name: "auditor", Role: pb.Role_ROLE_AUDITOR, SecretHash: fsm.SecretHash("s-auditor")},
		// A read token without --tenant is its own name's tenant's key.
		{Name: "beta", Role: pb.Role_ROLE_READ, SecretHash: fsm.SecretHash("s-beta")},
		{Name: "operator", Role: pb.Role_ROLE_OPERATOR, SecretHash: fsm.SecretHash("s-operator")},
	} {
		b.apply(t, &pb.Envelope{Command: &pb.Envelope_CreateToken{CreateToken: tok}})
	}
	reg := prometheus.NewRegistry()
	tokens := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gpuplane_gateway_tokens_total", Help: "x"}, []string{"model", "tenant"})
	reg.MustRegister(tokens)
	tokens.WithLabelValues("chat", "acme").Add(3)
	tokens.WithLabelValues("chat", "beta").Add(85)
	tokens.WithLabelValues("chat", `we"ird`).Add(1)
	srv, err := rpc.Listen("127.0.0.1:0", rpc.Config{Backend: b, NodeName: "node-000", ACL: true, Gatherer: reg,
		Metrics: promhttp.HandlerFor(reg, promhttp.HandlerOpts{})})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve() }()
	t.Cleanup(func() { shutdown(srv) })
	base := "http://" + srv.Addr().String()
	hc := rpc.HTTPClient()
	with := func(secret string) connect.ClientOption {
		return connect.WithInterceptors(connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
			return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
				req.Header().Set("Authorization", "Bearer "+secret)
				return next(ctx, req)
			}
		}), streamAuth(secret))
	}
	ctx := context.Background()
	// Each read, called as each token; nil error: allowed.
	reads := []struct {
		name string
		call func(o connect.ClientOption) error
		// who may: the tenant's token, the auditor's, the operator's.
		tenant, auditor, operator bool
	}{
		{"NodeService.ListNodes", func(o connect.ClientOption) error {
			_, err := gpuplanev1connect.NewNodeServiceClient(hc, base, o).ListNodes(ctx, connect.NewRequest(&pb.ListNodesRequest{}))
			return err
		}, true, true, true},
		{"DeviceService.ListDevices", func(o connect.ClientOption) error {
			_, err := gpuplanev1connect.NewDeviceServiceClient(hc, base, o).ListDevices(ctx, connect.NewRequest(&pb.ListDevicesRequest{}))
			return err
		}, true, true, true},
		{"AcceleratorService.ListAccelerators", func(o connect.ClientOption) error {
			_, err := gpuplanev1connect.NewAcceleratorServiceClient(hc, base, o).ListAccelerators(ctx, connect.NewRequest(&pb.ListAcceleratorsRequest{}))
			return err
		}, true, true, true},
		// Own only: filtered to what the tenant may use (TestTenantSeesOwnAdapters).
		{"ModelService.ListModels", func(o connect.ClientOption) error {
			_, err := gpuplanev1connect.NewModelServiceClient(hc, base, o).ListModels(ctx, connect.NewRequest(&pb.ListModelsRequest{}))
			return err
		}, true, true, true},
		// Own only: decisions about deployments (TestLiveResidencyACL).
		{"ResidencyService.ListDecisions", func(o connect.ClientOption) error {
			s, err := gpuplanev1connect.NewResidencyServiceClient(hc, base, o).ListDecisions(ctx, connect.NewRequest(&pb.ListDecisionsRequest{}))
			if err != nil {
				return err
			}
			defer s.Close()
			for s.Receive() {
			}
			return s.Err()
		}, true, true, true},
		{"ResidencyService.GetPlan", func(o connect.ClientOption) error {
			_, err := gpuplanev1connect.NewResidencyServiceClient(hc, base, o).GetPlan(ctx, connect.NewRequest(&pb.GetPlanRequest{}))
			return err
		}, false, true, true},
		{"DashboardService.Summary", func(o connect.ClientOption) error {
			_, err := gpuplanev1connect.NewDashboardServiceClient(hc, base, o).Summary(ctx, connect.NewRequest(&pb.SummaryRequest{}))
			return err
		}, false, true, true},
		{"AuditService.Log", func(o connect.ClientOption) error {
			s, err := gpuplanev1connect.NewAuditServiceClient(hc, base, o).Log(ctx, connect.NewRequest(&pb.LogRequest{}))
			if err != nil {
				return err
			}
			defer s.Close()
			for s.Receive() {
			}
			return s.Err()
		}, false, true, true},
		{"LogService.ReplicaLogs", func(o connect.ClientOption) error {
			s, err := gpuplanev1connect.NewLogServiceClient(hc, base, o).ReplicaLogs(ctx, connect.NewRequest(&pb.ReplicaLogsRequest{Model: "vchat"}))
			if err != nil {
				return err
			}
			defer s.Close()
			for s.Receive() {
			}
			return s.Err()
		}, false, false, true},
	}
	for _, r := range reads {
		for _, c := range []struct {
			who, secret string
			may         bool
		}{{"tenant", "s-tenant", r.tenant}, {"auditor", "s-auditor", r.auditor}, {"operator", "s-operator", r.operator}} {
			err := r.call(with(c.secret))
			denied := connect.CodeOf(err) == connect.CodePermissionDenied
			if c.may && denied || !c.may && !denied {
				t.Errorf("%s as the %s's token: %v; want allowed %v", r.name, c.who, err, c.may)
			}
			if !c.may && c.who == "tenant" && r.name != "LogService.ReplicaLogs" && (err == nil || !strings.Contains(err.Error(), `a key of tenant "acme"`)) {
				t.Errorf("%s as the tenant's token: %v; want the refusal to say why", r.name, err)
			}
		}
	}

	// /metrics: the tenant's token sees its own tenant's series and no
	// other's; the auditor's sees them all.
	scrape := func(secret string) string {
		req, _ := http.NewRequest(http.MethodGet, base+"/metrics", nil)
		req.Header.Set("Authorization", "Bearer "+secret)
		if secret != "s-auditor" {
			// Asked compressed: the filter reads the plain text.
			req.Header.Set("Accept-Encoding", "gzip")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("/metrics: %d %s", resp.StatusCode, data)
		}
		return string(data)
	}
	own := scrape("s-tenant")
	if !strings.Contains(own, `gpuplane_gateway_tokens_total{model="chat",tenant="acme"} 3`) || strings.Contains(own, `tenant="beta"`) || strings.Contains(own, `we\"ird`) {
		t.Errorf("/metrics as acme's token:\n%s\nwant acme's series and no other tenant's", own)
	}
	if beta := scrape("s-beta"); !strings.Contains(beta, `tenant="beta"} 85`) || strings.Contains(beta, `tenant="acme"`) {
		t.Errorf("/metrics as beta's token (read, no --tenant: tenant beta):\n%s\nwant beta's series alone", beta)
	}
	all := scrape("s-auditor")
	if !strings.Contains(all, `tenant="beta"} 85`) || !strings.Contains(all, `tenant="acme"} 3`) {
		t.Errorf("/metrics as the auditor's token:\n%s\nwant every tenant's series", all)
	}
}

// streamAuth adds the token to streaming calls.
func streamAuth(secret string) connect.Interceptor { return streamAuthInterceptor(secret) }

type streamAuthInterceptor string

func (s streamAuthInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc { return next }
func (s streamAuthInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		c := next(ctx, spec)
		c.RequestHeader().Set("Authorization", "Bearer "+string(s))
		return c
	}
}
func (s streamAuthInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// TestTenantSeesOwnAdapters: a tenant's read token reads every deployment
// (any tenant may use any), with the adapters it may use and none of
// another tenant's private ones, in the deployment's spec and in its
// replicas' adapter tiers, through models list, models get and replicas
// list; an adapter it shares with another tenant names only itself. The
// auditor's token reads them all as they are.
func TestTenantSeesOwnAdapters(t *testing.T) {
	b := simulatedState(t, 1, 1, func(i int) string { return "node-000" })
	for _, tok := range []*pb.CreateToken{
		{Name: "acme-app", Role: pb.Role_ROLE_READ, SecretHash: fsm.SecretHash("s-acme"), Tenant: "acme"},
		{Name: "beta", Role: pb.Role_ROLE_READ, SecretHash: fsm.SecretHash("s-beta")},
		{Name: "auditor", Role: pb.Role_ROLE_AUDITOR, SecretHash: fsm.SecretHash("s-auditor")},
	} {
		b.apply(t, &pb.Envelope{Command: &pb.Envelope_CreateToken{CreateToken: tok}})
	}
	b.apply(t, &pb.Envelope{Command: &pb.Envelope_ApplyModel{ApplyModel: &pb.ApplyModel{Name: "chat", Spec: &pb.ModelSpec{
		Model: "/models/chat", Replicas: 1, Placement: &pb.PlacementSpec{Accelerator: "shared"},
		Engine: &pb.EngineSpec{Kind: "sim", MemoryPercent: 20},
		Adapters: []*pb.Adapter{
			{Name: "open", Source: "/adapters/open", Rank: 8},
			{Name: "acme-only", Source: "/adapters/acme", Rank: 8, Tenants: []string{"acme"}},
			{Name: "beta-only", Source: "/adapters/beta", Rank: 8, Tenants: []string{"beta"}},
			{Name: "shared", Source: "/adapters/shared", Rank: 8, Tenants: []string{"acme", "beta"}},
		}}}}})
	b.apply(t, &pb.Envelope{Command: &pb.Envelope_PlaceReplicas{PlaceReplicas: &pb.PlaceReplicas{Policy: "binpack",
		Placements: []*pb.Placement{{Model: "chat", Replica: 0, Generation: 1, Node: "node-000", Cards: []uint32{0}}}}}})
	var tiers []*pb.AdapterStatus
	for _, n := range []string{"acme-only", "beta-only", "open", "shared"} {
		tiers = append(tiers, &pb.AdapterStatus{Name: n, Tier: pb.AdapterTier_ADAPTER_TIER_CARD})
	}
	b.apply(t, &pb.Envelope{Command: &pb.Envelope_ReplicaStatus{ReplicaStatus: &pb.ReplicaStatus{Model: "chat", Replica: 0, Generation: 1,
		Node: "node-000", State: pb.ReplicaState_REPLICA_STATE_RUNNING, Adapters: &pb.ReplicaAdapters{Adapters: tiers}}}})

	srv, err := rpc.Listen("127.0.0.1:0", rpc.Config{Backend: b, NodeName: "node-000", ACL: true})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve() }()
	t.Cleanup(func() { shutdown(srv) })
	base := "http://" + srv.Addr().String()
	ctx := context.Background()
	// What each token reads of chat: its adapters (name=tenants) in the
	// spec, in models list and get, and the adapter tiers of its replica
	// in models get and replicas list.
	read := func(secret string) (list, get, getTiers, replicaTiers []string) {
		t.Helper()
		c := gpuplanev1connect.NewModelServiceClient(rpc.HTTPClient(), base, connect.WithInterceptors(bearer(secret)))
		named := func(ads []*pb.Adapter) (out []string) {
			for _, a := range ads {
				out = append(out, a.GetName()+"="+strings.Join(a.GetTenants(), ","))
			}
			return out
		}
		ls, err := c.ListModels(ctx, connect.NewRequest(&pb.ListModelsRequest{}))
		if err != nil || len(ls.Msg.GetModels()) != 1 {
			t.Fatalf("models list as %s: %v, %v", secret, ls, err)
		}
		g, err := c.GetModel(ctx, connect.NewRequest(&pb.GetModelRequest{Name: "chat"}))
		if err != nil || len(g.Msg.GetReplicas()) != 1 {
			t.Fatalf("models get chat as %s: %v, %v", secret, g, err)
		}
		rs, err := c.ListReplicas(ctx, connect.NewRequest(&pb.ListReplicasRequest{}))
		if err != nil || len(rs.Msg.GetReplicas()) != 1 {
			t.Fatalf("replicas list as %s: %v, %v", secret, rs, err)
		}
		for _, a := range g.Msg.GetReplicas()[0].GetAdapters() {
			getTiers = append(getTiers, a.GetName())
		}
		for _, a := range rs.Msg.GetReplicas()[0].GetAdapters() {
			replicaTiers = append(replicaTiers, a.GetName())
		}
		return named(ls.Msg.GetModels()[0].GetSpec().GetAdapters()), named(g.Msg.GetModel().GetSpec().GetAdapters()), getTiers, replicaTiers
	}
	for _, c := range []struct {
		who, secret string
		spec, tiers []string
	}{
		{"acme's", "s-acme", []string{"open=", "acme-only=acme", "shared=acme"}, []string{"acme-only", "open", "shared"}},
		{"beta's", "s-beta", []string{"open=", "beta-only=beta", "shared=beta"}, []string{"beta-only", "open", "shared"}},
		{"the auditor's", "s-auditor", []string{"open=", "acme-only=acme", "beta-only=beta", "shared=acme,beta"},
			[]string{"acme-only", "beta-only", "open", "shared"}},
	} {
		list, get, getTiers, replicaTiers := read(c.secret)
		if !slices.Equal(list, c.spec) || !slices.Equal(get, c.spec) {
			t.Errorf("as %s token: models list shows adapters %v, models get %v; want %v", c.who, list, get, c.spec)
		}
		if !slices.Equal(getTiers, c.tiers) || !slices.Equal(replicaTiers, c.tiers) {
			t.Errorf("as %s token: replica adapter tiers %v in models get, %v in replicas list; want %v", c.who, getTiers, replicaTiers, c.tiers)
		}
	}
}

// bearer adds the token to unary calls.
func bearer(secret string) connect.Interceptor {
	return connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			req.Header().Set("Authorization", "Bearer "+secret)
			return next(ctx, req)
		}
	})
}
