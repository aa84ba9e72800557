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
		Requests      int                `json:"offered"`
		ModelsAtSLO   int                `json:"modelsAtSLO"`
		Starved       []string           `json:"starvedModels"`
		SLOAttainment map[string]float64 `json:"sloAttainment"`
		Models        []struct {
			Model     string   `json:"model"`
			Requests  int      `json:"offered"`
			Completed int      `json:"completed"`
			TTFTP95   *float64 `json:"ttftP95"`
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
	if strings.Join(got, ",") != "gpuplane,ollama,ollama-np4,llamaswap,static,static-best,ideal" {
		t.Fatalf("policies %v", got)
	}
	// static fits two of the three 7 GiB models on 15.2 GiB usable: the
	// third's requests are all rejected, its p95 is never answered (null)
	// and it is starved, since ideal serves it.
	st := results[4]
	if m := st.Models[2]; m.Completed != 0 || m.TTFTP95 != nil || len(st.Starved) != 1 || st.Starved[0] != "batch" {
		t.Errorf("static: batch %+v, starved %v: want nothing served, p95 null, batch starved", m, st.Starved)
	}
	if id := results[6]; id.ModelsAtSLO < st.ModelsAtSLO || len(id.Starved) != 0 {
		t.Errorf("ideal: %d at SLO (static %d), starved %v", id.ModelsAtSLO, st.ModelsAtSLO, id.Starved)
	}
	table := run(t, "", nil, "simulate", "serve", "--config", cfg, "--policy", "all")
	for _, want := range []string{"gpuplane", "ollama-np4", "llamaswap", "static-best", "ideal", "models at SLO", "starved models",
		"goodput req/s", "static, per model", "ledger violations", "fairness gap %"} {
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
		ModelsWithDemand int `json:"modelsWithDemand"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil || res.ModelsWithDemand == 0 {
		t.Fatalf("%v: %s", err, r.stdout)
	}
}

func TestSimulateServeRefusesHomeAt16GiB(t *testing.T) {
	// home.yaml's warm chat and coder and pinned embedder reserve 19 GiB:
	// on a 16 GiB card (15.2 usable) the promises cannot be kept.
	b, err := os.ReadFile("../../../examples/serve/home.yaml")
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "home16.yaml")
	if err := os.WriteFile(p, []byte(strings.Replace(string(b), "memoryGiB: 24", "memoryGiB: 16", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	r := run(t, "", nil, "simulate", "serve", "--config", p)
	for _, want := range []string{"reserved shares (pinned and warm) need 19.00 GiB", "usable 15.20 GiB", "chat (warm) 9 + coder (warm) 8.5 + embedder (pinned) 1.5"} {
		if r.code == 0 || !strings.Contains(r.stderr, want) {
			t.Errorf("exit %d, stderr %q: want it to say %q", r.code, r.stderr, want)
		}
	}
	if r.stdout != "" {
		t.Errorf("a refused config printed results: %s", r.stdout)
	}
}
