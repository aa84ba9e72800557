package engine

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// awaitLoad polls the engine's /metrics (ReadLoad) until it says want.
func awaitLoad(t *testing.T, kind, base string, want Load) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		l, err := ReadLoad(context.Background(), http.DefaultClient, kind, base, "")
		if err == nil && l == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s /metrics: %+v, %v; want %+v", kind, l, err, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestReadLoadFromTheEnginesMetrics: the engines' own request gauges,
// read as the agent reads them, from engines started by their drivers'
// commands against the strict dialects. vLLM counts a streaming request
// running; llama-server (the driver passes --metrics) runs four requests
// in its four auto slots and defers a fifth. Without --metrics llama-server
// answers 501, and Ollama has no /metrics to read.
func TestReadLoadFromTheEnginesMetrics(t *testing.T) {
	c := newCard(t)
	vspec := &pb.ModelSpec{Model: "sim://chat", ServedModelName: "chat",
		Engine: &pb.EngineSpec{Kind: KindSim, Args: []string{"--dialect", "vllm", "--load-seconds", "0", "--tokens-per-second", "20"}}}
	v, _ := startBuilt(t, c, vspec, false)
	awaitLoad(t, KindVLLM, v.base, Load{})
	s := startStream(t, v, "chat")
	s.waitTokens(t, 1)
	awaitLoad(t, KindVLLM, v.base, Load{Running: 1})
	s.stop()
	awaitLoad(t, KindVLLM, v.base, Load{})

	lspec := &pb.ModelSpec{Model: "/m.gguf", ServedModelName: "chat",
		Engine: &pb.EngineSpec{Kind: KindSim, Args: []string{"--dialect", "llamacpp", "--load-seconds", "0", "--tokens-per-second", "20"}}}
	l, _ := startBuilt(t, c, lspec, false)
	for range 4 {
		startStream(t, l, "chat").waitTokens(t, 1)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fifth := make(chan struct{})
	go func() {
		defer close(fifth)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, l.base+"/v1/completions",
			strings.NewReader(`{"prompt":"go","max_tokens":1,"stream":true}`))
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	awaitLoad(t, KindLlamaCpp, l.base, Load{Running: 4, Waiting: 1})
	cancel()
	<-fifth

	bare := launchProc(t, c, "bare", []string{"engine", "sim", "--port", "0", "--served-model-name", "chat",
		"--dialect", "llamacpp", "--load-seconds", "0"}, nil)()
	bare.waitHealthy(t)
	if _, err := ReadLoad(context.Background(), http.DefaultClient, KindLlamaCpp, bare.base, ""); err == nil || !strings.Contains(err.Error(), "501") {
		t.Fatalf("llama-server without --metrics: %v; want its 501", err)
	}
	if HasMetrics(KindOllama) || HasMetrics(KindCommand) {
		t.Fatal("HasMetrics says Ollama or a command engine has request gauges")
	}
}

// TestMetricsSampleLines: the lines of Prometheus' text format ReadLoad
// reads: comments skipped, labels (quoted values may hold '}' and escaped
// quotes) skipped, the value read.
func TestMetricsSampleLines(t *testing.T) {
	for line, want := range map[string]struct {
		name string
		v    float64
		ok   bool
	}{
		`vllm:num_requests_running{engine="0",model_name="chat"} 3.0`:    {"vllm:num_requests_running", 3, true},
		`vllm:num_requests_waiting{model_name="a}b\"c"} 2 1700000000000`: {"vllm:num_requests_waiting", 2, true},
		`llamacpp:requests_deferred 1`:                                   {"llamacpp:requests_deferred", 1, true},
		`# TYPE vllm:num_requests_running gauge`:                         {"", 0, false},
		`broken{model="x" 1`:                                             {"", 0, false},
		``:                                                               {"", 0, false},
	} {
		name, v, ok := sample(line)
		if name != want.name || v != want.v || ok != want.ok {
			t.Errorf("sample(%q) = %q, %v, %t; want %q, %v, %t", line, name, v, ok, want.name, want.v, want.ok)
		}
	}
}
