package gateway

import (
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/node/gateway/queue"
)

// countingEngine is an engine that answers every request with a short
// completion and counts them.
func countingEngine(t *testing.T) (string, *atomic.Int32) {
	t.Helper()
	var seen atomic.Int32
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"x","object":"text_completion","choices":[{"index":0,"text":"ok","finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
	}))
	t.Cleanup(engine.Close)
	return engine.URL, &seen
}

// TestGatewayHugeMaxTokens: max_tokens (or max_completion_tokens) near
// 2^63 on a model of 100 tokens' context is refused with 400
// context_length_exceeded before it reaches the engine: the prompt's
// words plus it must not wrap to a small number that passes the check.
func TestGatewayHugeMaxTokens(t *testing.T) {
	engine, seen := countingEngine(t)
	_, srv, _ := startGateway(t, Options{Node: "n1", Cluster: fixedView{[]Model{{Served: "chat", Deployment: "chat", Class: queue.Standard, MaxModelLen: 100,
		Replicas: []Replica{{Deployment: "chat", Node: "n1", Endpoint: engine, Kind: "vllm", Running: true, Resident: true}}}}}})
	if code, data := send(t, srv.URL, "/v1/completions", `{"model":"chat","prompt":"hi","max_tokens":10}`, nil); code != http.StatusOK {
		t.Fatalf("a request within the context: %d %s", code, data)
	}
	before := seen.Load()
	big := strconv.Itoa(math.MaxInt64)
	for _, c := range []struct{ path, body, param string }{
		{"/v1/completions", `{"model":"chat","prompt":"hi there","max_tokens":` + big + `}`, "prompt"},
		{"/v1/completions", `{"model":"chat","prompt":"hi","max_tokens":` + strconv.Itoa(math.MaxInt64-1) + `}`, "prompt"},
		{"/v1/chat/completions", `{"model":"chat","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":` + big + `}`, "messages"},
		{"/v1/completions", `{"model":"chat","prompt":[1,2,3],"max_tokens":` + strconv.Itoa(math.MaxInt64-2) + `}`, "prompt"},
	} {
		code, data := send(t, srv.URL, c.path, c.body, nil)
		if code != http.StatusBadRequest || !strings.Contains(string(data), "context_length_exceeded") || !strings.Contains(string(data), `"param":"`+c.param+`"`) {
			t.Errorf("%s %s: %d %s; want 400 context_length_exceeded naming %s", c.path, c.body, code, data, c.param)
		}
	}
	if n := seen.Load() - before; n != 0 {
		t.Fatalf("%d refused requests reached the engine", n)
	}
}

// TestGatewayHugeMaxTokensUnknownContext: without a known context length
// a max_tokens near 2^63 (times n on vLLM) is not refused by the gateway's
// own sums: the request is queued with the queue's bound and the engine
// judges it.
func TestGatewayHugeMaxTokensUnknownContext(t *testing.T) {
	engine, seen := countingEngine(t)
	_, srv, _ := startGateway(t, Options{Node: "n1", Cluster: fixedView{[]Model{{Served: "chat", Deployment: "chat", Class: queue.Standard,
		Replicas: []Replica{{Deployment: "chat", Node: "n1", Endpoint: engine, Kind: "vllm", KVTokens: 1000, Running: true, Resident: true}}}}}})
	for _, body := range []string{
		`{"model":"chat","prompt":"hi","max_tokens":` + strconv.Itoa(math.MaxInt64) + `}`,
		`{"model":"chat","prompt":"hi","n":2,"max_tokens":` + strconv.Itoa(1<<62) + `}`,
	} {
		if code, data := send(t, srv.URL, "/v1/completions", body, nil); code != http.StatusOK {
			t.Errorf("%s: %d %s; want the engine's answer", body, code, data)
		}
	}
	if seen.Load() != 2 {
		t.Fatalf("the engine saw %d requests, want 2", seen.Load())
	}
}

// TestGatewayForgetsIdleTenants: 300 requests under made-up tenant names
// leave the card's fair queue no record of them once they have been idle
// past the queue's IdleTenant, with no further request to prompt it.
func TestGatewayForgetsIdleTenants(t *testing.T) {
	engine, _ := countingEngine(t)
	g, srv, _ := startGateway(t, Options{Node: "n1", Queue: queue.Config{IdleTenant: 200 * time.Millisecond},
		Cluster: fixedView{[]Model{{Served: "chat", Deployment: "chat", Class: queue.Standard,
			Replicas: []Replica{{Deployment: "chat", Node: "n1", Endpoint: engine, Kind: "vllm", Running: true, Resident: true}}}}}})
	for i := range 300 {
		if code, data := send(t, srv.URL, "/v1/completions", `{"model":"chat","prompt":"hi there"}`, map[string]string{TenantHeader: fmt.Sprint("made-up-", i)}); code != http.StatusOK {
			t.Fatalf("%d %s", code, data)
		}
	}
	tenants := func() int {
		g.mu.Lock()
		c := g.cards[0]
		g.mu.Unlock()
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.s.Tenants()
	}
	for deadline := time.Now().Add(5 * time.Second); tenants() > 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the card's queue still knows %d tenants 5 s after 300 made-up ones went idle (IdleTenant 200ms)", tenants())
		}
	}
}
