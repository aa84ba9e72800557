package gateway

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpuplane/gpuplane/node/gateway/queue"
	"github.com/gpuplane/gpuplane/node/sim"
)

// fixedView is a cluster of fixed models, all on this node.
type fixedView struct{ models []Model }

func (f fixedView) Models(context.Context) ([]Model, error) { return f.models, nil }
func (f fixedView) Gateway(string) (string, bool)           { return "", false }

// simEngine serves a real sim engine in this process until the test ends.
func simEngine(t *testing.T, name string, tps float64) string {
	t.Helper()
	return simEngineWith(t, sim.Config{ServedModelName: name, TokensPerSecond: tps})
}

// simEngineWith serves a sim engine of cfg (host and memory set here).
func simEngineWith(t *testing.T, cfg sim.Config) string {
	t.Helper()
	name := cfg.ServedModelName
	ctx, cancel := context.WithCancel(context.Background())
	addr := make(chan net.Addr, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		cfg.Host, cfg.MemoryMiB, cfg.Ready = "127.0.0.1", 1024, func(a net.Addr) { addr <- a }
		if err := sim.Run(ctx, cfg); err != nil && ctx.Err() == nil {
			t.Errorf("sim engine %s: %v", name, err)
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	var u string
	select {
	case a := <-addr:
		u = "http://" + a.String()
	case <-time.After(20 * time.Second):
		t.Fatalf("sim engine %s did not start", name)
	}
	// Ready once its model is loaded (Ollama has no /health: it is up
	// once it answers /api/version, and loads on the first request).
	health := "/health"
	if cfg.Dialect == sim.DialectOllama {
		health = "/api/version"
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if resp, err := http.Get(u + health); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return u
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("sim engine %s never loaded its model", name)
		}
	}
}

// gaugeOf is a gateway gauge's value for a replica.
func gaugeOf(t *testing.T, reg *prometheus.Registry, name, replica string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "replica" && l.GetValue() == replica {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	return -1
}

// TestGatewayKVBudgetCapsInFlight: a replica whose engine has a small KV
// budget holds fewer requests in flight (the rest wait in the gateway's
// queue) than one without, under the same flat MaxInFlight; a request
// larger than the whole budget still runs, alone.
func TestGatewayKVBudgetCapsInFlight(t *testing.T) {
	small, big := simEngine(t, "small", 0.2), simEngine(t, "big", 0.2)
	reg := prometheus.NewRegistry()
	rep := func(name, url string, kv int) Model {
		return Model{Served: name, Deployment: name, Class: queue.Standard, Replicas: []Replica{{Deployment: name, Node: "n1",
			Endpoint: url, Kind: "sim", Running: true, Resident: true, KVTokens: kv}}}
	}
	_, srv, ctx := startGateway(t, Options{Node: "n1", MaxInFlight: 16, Registerer: reg,
		Cluster: fixedView{[]Model{rep("small", small, 25), rep("big", big, 0)}}})
	clients, cancelClients := context.WithCancel(ctx)
	defer cancelClients()
	post := func(model string, maxTokens int) {
		body := fmt.Sprintf(`{"model":%q,"prompt":"x","max_tokens":%d,"stream":true}`, model, maxTokens)
		req, _ := http.NewRequestWithContext(clients, http.MethodPost, srv.URL+"/v1/completions", strings.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}
	// The first refresh has placed both replicas.
	deadline := time.Now().Add(20 * time.Second)
	for gaugeOf(t, reg, "gpuplane_gateway_in_flight", "big/0") < 0 || gaugeOf(t, reg, "gpuplane_gateway_in_flight", "small/0") < 0 {
		if time.Now().After(deadline) {
			t.Fatal("the gateway never listed its replicas")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Each request reserves 10 tokens (max_tokens; a one-byte prompt
	// counts 0): a budget of 25 holds two.
	for range 6 {
		go post("small", 10)
		go post("big", 10)
	}
	held := func(replica string) (inFlight, queued float64) {
		return gaugeOf(t, reg, "gpuplane_gateway_in_flight", replica), gaugeOf(t, reg, "gpuplane_gateway_queue_depth", replica)
	}
	for {
		sf, sq := held("small/0")
		bf, bq := held("big/0")
		if sf+sq == 6 && bf+bq == 6 {
			if sf != 2 || sq != 4 {
				t.Errorf("small KV budget (25 tokens): %v in flight, %v queued; want 2 and 4", sf, sq)
			}
			if bf != 6 {
				t.Errorf("no KV budget: %v in flight, %v queued; want all 6 in flight", bf, bq)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("requests never all arrived: small %v+%v, big %v+%v", sf, sq, bf, bq)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancelClients()
	// A request over the whole budget runs alone rather than waiting for
	// ever.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel2()
	for gaugeOf(t, reg, "gpuplane_gateway_in_flight", "small/0") != 0 {
		if ctx2.Err() != nil {
			t.Fatalf("the cancelled requests never left: %v in flight, %v queued", gaugeOf(t, reg, "gpuplane_gateway_in_flight", "small/0"), gaugeOf(t, reg, "gpuplane_gateway_queue_depth", "small/0"))
		}
		time.Sleep(20 * time.Millisecond)
	}
	body := `{"model":"small","prompt":"x","max_tokens":1000}`
	req, _ := http.NewRequestWithContext(ctx2, http.MethodPost, srv.URL+"/v1/completions", strings.NewReader(body))
	go func() {
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	for gaugeOf(t, reg, "gpuplane_gateway_in_flight", "small/0") != 1 {
		if ctx2.Err() != nil {
			t.Fatalf("a request over the KV budget never ran: %v queued", gaugeOf(t, reg, "gpuplane_gateway_queue_depth", "small/0"))
		}
		time.Sleep(20 * time.Millisecond)
	}
}
