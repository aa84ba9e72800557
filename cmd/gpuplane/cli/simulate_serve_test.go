package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// serveConfig writes a small card config whose only traffic is synthetic,
// so the command needs no trace file.
func serveConfig(t *testing.T, extra string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "card.yaml")
	content := `card: {memoryGiB: 16}
models:
  - {name: chat, residency: warm, memoryGiB: 7, loadSeconds: 10, tokensPerSecond: 80, sloTTFTSeconds: 2}
  - {name: coder, memoryGiB: 7, loadSeconds: 10, tokensPerSecond: 80, sloTTFTSeconds: 2}
  - {name: batch, class: background, memoryGiB: 7, loadSeconds: 10, tokensPerSecond: 80}
tenants: [{name: a}, {name: b}]
durationSeconds: 600
synthetic:
  - {model: chat, tenants: [a, b], ratePerSecond: 0.5, promptTokens: 200, outputTokens: 100}
  - {model: coder, tenants: [a], ratePerSecond: 0.1, promptTokens: 500, outputTokens: 50}
  - {model: batch, tenants: [b], concurrency: 2, promptTokens: 500, outputTokens: 500}
` + extra
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestSimulateServeAllPolicies(t *testing.T) {
	cfg := serveConfig(t, "")
	r := run(t, "", nil, "-o", "json", "simulate", "serve", "--config", cfg, "--policy", "all")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	var results []struct {
		Policy        string             `json:"policy"`
		Requests      int                `json:"requests"`
		ModelsHosted  int                `json:"modelsHosted"`
		SLOAttainment map[string]float64 `json:"sloAttainment"`
		Models        []struct {
			Model   string  `json:"model"`
			TTFTP95 float64 `json:"ttftP95"`
		} `json:"models"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &results); err != nil {
		t.Fatalf("%v: %s", err, r.stdout)
	}
	var got []string
	for _, x := range results {
		got = append(got, x.Policy)
		if x.Requests == 0 || len(x.Models) != 3 {
			t.Errorf("%s: %d requests, %d models", x.Policy, x.Requests, len(x.Models))
		}
	}
	if strings.Join(got, ",") != "gpuplane,ollama,llamaswap,static" {
		t.Fatalf("policies %v", got)
	}
	// static fits two of the three 7 GiB models on 15.2 GiB usable.
	if results[3].ModelsHosted != 2 || results[0].ModelsHosted != 3 {
		t.Errorf("hosted: static %d (want 2), gpuplane %d (want 3)", results[3].ModelsHosted, results[0].ModelsHosted)
	}
	table := run(t, "", nil, "simulate", "serve", "--config", cfg, "--policy", "all")
	for _, want := range []string{"gpuplane", "ollama", "llamaswap", "static", "chat TTFT p50/p95/p99 s", "ledger violations", "fairness gap %"} {
		if !strings.Contains(table.stdout, want) {
			t.Errorf("table lacks %q:\n%s", want, table.stdout)
		}
	}
}

func TestSimulateServeBadInput(t *testing.T) {
	r := run(t, "", nil, "simulate", "serve", "--config", serveConfig(t, ""), "--policy", "lru")
	if r.code == 0 || !strings.Contains(r.stderr, `invalid --policy "lru"`) {
		t.Fatalf("bad policy: exit %d, %s", r.code, r.stderr)
	}
	r = run(t, "", nil, "simulate", "serve")
	if r.code == 0 || !strings.Contains(r.stderr, "--config") {
		t.Fatalf("no config: exit %d, %s", r.code, r.stderr)
	}
	trace := filepath.Join(t.TempDir(), "x.jsonl")
	os.WriteFile(trace, []byte(`{"time": 1, "model": "vision", "prompt_tokens": 1, "output_tokens": 1}`+"\n"), 0o600)
	r = run(t, "", nil, "simulate", "serve", "--config", serveConfig(t, ""), "--trace", trace)
	if r.code == 0 || !strings.Contains(r.stderr, "x.jsonl: line 1: model: \"vision\" is not in config") {
		t.Fatalf("unknown model: exit %d, %s", r.code, r.stderr)
	}
}

func TestSimulateServeHomeExample(t *testing.T) {
	// The example in the repository runs from a fresh clone: without the
	// shared Azure trace it runs its synthetic streams alone.
	r := run(t, "", nil, "-o", "json", "simulate", "serve", "--config", "../../../examples/serve/home.yaml", "--policy", "static", "--seed", "2")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	var res struct {
		ModelsHosted int `json:"modelsHosted"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil || res.ModelsHosted == 0 {
		t.Fatalf("%v: %s", err, r.stdout)
	}
}
