package gateway

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpuplane/gpuplane/node/gateway/queue"
	"github.com/gpuplane/gpuplane/node/sim"
)

// tokens resolves one token to one tenant: the gateway's view of the ACL
// store (the agent's tests exercise the real one).
type tokens map[string]string

func (t tokens) TenantFor(secret string) (string, float64, bool) {
	tenant, ok := t[secret]
	return tenant, 1, ok
}

// servedByClass is how many answered requests each class label holds in
// the gateway's TTFT histogram.
func servedByClass(t *testing.T, reg *prometheus.Registry) map[string]uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]uint64{}
	for _, mf := range mfs {
		if mf.GetName() != "gpuplane_gateway_ttft_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "class" {
					out[l.GetValue()] += m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	return out
}

// TestGatewayPriorityHeaderTrust: with ACLs on, X-Gpuplane-Priority may
// lower a request's class but asking for one above the deployment's
// priority is refused (403, nothing served); without ACLs it is believed.
func TestGatewayPriorityHeaderTrust(t *testing.T) {
	engine := simEngine(t, "chat", 0)
	for _, acls := range []bool{true, false} {
		reg := prometheus.NewRegistry()
		opts := Options{Node: "n1", Registerer: reg, Cluster: fixedView{[]Model{{Served: "chat", Deployment: "chat", Class: queue.Standard,
			Replicas: []Replica{{Deployment: "chat", Node: "n1", Endpoint: engine, Kind: "sim", Running: true, Resident: true}}}}}}
		if acls {
			opts.Tenants = tokens{"secret-a": "acme"}
		}
		_, srv, _ := startGateway(t, opts)
		send := func(class string) (int, string) {
			req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/completions", strings.NewReader(`{"model":"chat","prompt":"hi","max_tokens":2}`))
			req.Header.Set("Authorization", "Bearer secret-a")
			req.Header.Set(ClassHeader, class)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(b)
		}
		// The first refresh has placed the replica.
		deadline := time.Now().Add(20 * time.Second)
		for {
			if code, _ := send("standard"); code == http.StatusOK {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the gateway never served its replica")
			}
			time.Sleep(20 * time.Millisecond)
		}
		code, body := send("interactive")
		if acls {
			if code != http.StatusForbidden || !strings.Contains(body, `"priority_not_allowed"`) || !strings.Contains(body, ClassHeader) {
				t.Errorf("ACLs on, a raise to interactive: %d %s; want 403 priority_not_allowed naming the header", code, body)
			}
		} else if code != http.StatusOK {
			t.Errorf("ACLs off, interactive: %d %s; want 200", code, body)
		}
		if code, body := send("background"); code != http.StatusOK {
			t.Errorf("ACLs %v, a lowered class: %d %s; want 200", acls, code, body)
		}
		got := servedByClass(t, reg)
		want := map[string]uint64{"standard": 1, "background": 1}
		if !acls {
			want["interactive"] = 1
		}
		for c, n := range want {
			if got[c] != n {
				t.Errorf("ACLs %v: served %v by class; want %v", acls, got, want)
				break
			}
		}
		if acls && got["interactive"] != 0 {
			t.Errorf("ACLs on: a refused raise was served as interactive: %v", got)
		}
	}
}

// TestGatewayPassesPriorityToEngines: to an engine that schedules by
// priority (a sim started as vLLM with --scheduling-policy priority) the
// gateway sends each request's class as `priority`; to one that does not,
// none (vLLM, and the sim, refuse a non-zero priority then: the last case
// shows that the field really goes out).
func TestGatewayPassesPriorityToEngines(t *testing.T) {
	for _, c := range []struct {
		policy      string
		replicaSays bool
		want        int
	}{
		{"priority", true, http.StatusOK},
		{"fcfs", false, http.StatusOK},
		{"fcfs", true, http.StatusBadRequest},
	} {
		engine := simEngineWith(t, sim.Config{ServedModelName: "chat", SchedulingPolicy: c.policy})
		_, srv, _ := startGateway(t, Options{Node: "n1", Cluster: fixedView{[]Model{{Served: "chat", Deployment: "chat", Class: queue.Standard,
			Replicas: []Replica{{Deployment: "chat", Node: "n1", Endpoint: engine, Kind: "sim", Running: true, Resident: true,
				PriorityScheduling: c.replicaSays}}}}}})
		code, body := 0, ""
		for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/completions", strings.NewReader(`{"model":"chat","prompt":"hi","max_tokens":2}`))
			req.Header.Set(ClassHeader, "background")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			code, body = resp.StatusCode, string(b)
			if code != http.StatusServiceUnavailable { // placed
				break
			}
		}
		if code != c.want {
			t.Errorf("engine --scheduling-policy %s, replica PriorityScheduling %v: a background request got %d %s; want %d",
				c.policy, c.replicaSays, code, body, c.want)
		}
		if c.want == http.StatusBadRequest && !strings.Contains(body, "Priority scheduling is not enabled") {
			t.Errorf("the engine's refusal does not say why: %s", body)
		}
	}
}
