package gateway

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/node/gateway/queue"
	"github.com/gpuplane/gpuplane/node/sim"
)

// TestGatewayWeightsHoldWithinEngineConcurrency: two tenants of equal
// priority and weights 3:1, both flooding one engine that runs 4 requests
// at once (--max-num-seqs 4), are served 3:1 (within 10%), and the engine
// is never sent more than it runs: its own queue stays empty, so the
// weights, not the engine's arrival order, decide who runs next. The
// gateway's default cap (64) would let the whole flood into the engine.
func TestGatewayWeightsHoldWithinEngineConcurrency(t *testing.T) {
	const seqs = 4
	engine := simEngineWith(t, sim.Config{ServedModelName: "chat", TokensPerSecond: 400, MaxNumSeqs: seqs})
	_, srv, ctx := startGateway(t, Options{Node: "n1", Weights: map[string]float64{"heavy": 3, "light": 1},
		Cluster: fixedView{[]Model{{Served: "chat", Deployment: "chat", Class: queue.Standard,
			Replicas: []Replica{{Deployment: "chat", Node: "n1", Endpoint: engine, Kind: "sim", Running: true, Resident: true, MaxInFlight: seqs}}}}}})
	send := func(ctx context.Context, tenant string) int {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/completions", strings.NewReader(`{"model":"chat","prompt":"hi","max_tokens":8}`))
		req.Header.Set(TenantHeader, tenant)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	for deadline := time.Now().Add(20 * time.Second); send(ctx, "heavy") != http.StatusOK; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the gateway never served its replica")
		}
	}

	// The engine's own count of requests running and waiting, read as
	// often as the machine lets.
	var maxRunning, maxWaiting atomic.Int64
	watch, stopWatch := context.WithCancel(ctx)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for watch.Err() == nil {
			resp, err := http.Get(engine + "/sim/status")
			if err != nil {
				continue
			}
			var st sim.Status
			_ = json.NewDecoder(resp.Body).Decode(&st)
			resp.Body.Close()
			if int64(st.InFlight) > maxRunning.Load() {
				maxRunning.Store(int64(st.InFlight))
			}
			if int64(st.Waiting) > maxWaiting.Load() {
				maxWaiting.Store(int64(st.Waiting))
			}
		}
	}()

	// Each tenant keeps 12 requests open; the first 40 answers are the
	// warm-up (the queues filling), the next 200 are counted.
	const warmup, counted = 40, 200
	flood, stopFlood := context.WithCancel(ctx)
	defer stopFlood()
	var mu sync.Mutex
	answered, served := 0, map[string]int{}
	var wg sync.WaitGroup
	for _, tenant := range []string{"heavy", "light"} {
		for range 12 {
			wg.Go(func() {
				for flood.Err() == nil {
					if send(flood, tenant) != http.StatusOK {
						continue
					}
					mu.Lock()
					answered++
					if answered > warmup && answered <= warmup+counted {
						served[tenant]++
					}
					if answered >= warmup+counted {
						stopFlood()
					}
					mu.Unlock()
				}
			})
		}
	}
	select {
	case <-flood.Done():
	case <-time.After(3 * time.Minute):
		t.Fatalf("the flood was not served in 3 minutes: %d answers", answered)
	}
	wg.Wait()
	stopWatch()
	<-watched
	ratio := float64(served["heavy"]) / float64(max(served["light"], 1))
	if ratio < 2.7 || ratio > 3.3 {
		t.Errorf("weights 3:1, both flooding: served %v, ratio %.2f; want within 10%% of 3", served, ratio)
	}
	if r, w := maxRunning.Load(), maxWaiting.Load(); r > seqs || w > 0 {
		t.Errorf("engine running at most %d: it ran up to %d and queued up to %d; want at most %d and none queued", seqs, r, w, seqs)
	}
	if maxRunning.Load() < seqs {
		t.Errorf("the engine never ran %d at once (at most %d): the flood did not fill it", seqs, maxRunning.Load())
	}
}

// TestFailedReplicasRefuseAtOnce: while every replica of a model failed
// (a pinned one its node will only restart, e.g. an Ollama model missing
// from the store), a request is refused at once with the replica's reason
// instead of waiting in a queue for an engine that is not coming; a model
// with a replica still running is served.
func TestFailedReplicasRefuseAtOnce(t *testing.T) {
	engine := simEngine(t, "ok", 0)
	_, srv, _ := startGateway(t, Options{Node: "n1", Cluster: fixedView{[]Model{
		{Served: "gone", Deployment: "gone", Class: queue.Standard,
			Replicas: []Replica{{Deployment: "gone", Node: "n1", Kind: "ollama", Failed: `model "tiny:1b" is not in Ollama's store`}}},
		{Served: "ok", Deployment: "ok", Class: queue.Standard,
			Replicas: []Replica{{Deployment: "ok", Node: "n1", Endpoint: engine, Kind: "sim", Running: true, Resident: true},
				{Deployment: "ok", Index: 1, Node: "n1", Kind: "sim", Failed: "engine exited 1"}}},
	}}})
	start := time.Now()
	resp, err := http.Post(srv.URL+"/v1/completions", "application/json", strings.NewReader(`{"model":"gone","prompt":"x","max_tokens":1}`))
	if err != nil {
		t.Fatal(err)
	}
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(data), `"code":"model_failed"`) ||
		!strings.Contains(string(data), `not in Ollama's store`) || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("a request for a model whose replicas failed: %d %s", resp.StatusCode, data)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("refused after %s; want at once", took)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		resp, err := http.Post(srv.URL+"/v1/completions", "application/json", strings.NewReader(`{"model":"ok","prompt":"x","max_tokens":1}`))
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			break
		}
		if strings.Contains(string(data), "model_failed") || time.Now().After(deadline) {
			t.Fatalf("a model with a running replica: %d %s", resp.StatusCode, data)
		}
	}
}
