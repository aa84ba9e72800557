package rpc_test

import (
	"context"
	"io"
	"net/http"
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
// is a read token (a tenant's key) of tenant acme, "auditor" an auditor's. A tenant's token reads the cluster's infrastructure and
// nothing that shows other tenants (audit log, events, dashboard,
// deployments and their adapters' tenants, residency decisions); engine
// logs, which hold every tenant's prompts, need an operator. The matrix
// is docs/operations.md's.
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
		{"ModelService.ListModels", func(o connect.ClientOption) error {
			_, err := gpuplanev1connect.NewModelServiceClient(hc, base, o).ListModels(ctx, connect.NewRequest(&pb.ListModelsRequest{}))
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
