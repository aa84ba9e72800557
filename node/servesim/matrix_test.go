package servesim

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"
)

// The matrix runs every model alone, every pair and the full set under
// every mix, and its report says which pair hurts whom.
func TestMatrixOnTheHomeCard(t *testing.T) {
	cfg, err := LoadConfig(filepath.Join("..", "..", "examples", "serve", "home.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	res, err := Matrix(cfg, 1, 300)
	if err != nil {
		t.Fatal(err)
	}
	n := len(cfg.Models)
	if want := (n + n*(n-1)/2 + 1) * len(Mixes); len(res.Cells) != want {
		t.Fatalf("%d cells, want %d", len(res.Cells), want)
	}
	for _, c := range res.Cells {
		if c.LedgerViolations != 0 {
			t.Fatalf("cell %v %s: %d ledger violations", c.Models, c.Mix, c.LedgerViolations)
		}
	}
	var txt, html bytes.Buffer
	if err := WriteMatrix(&txt, res); err != nil {
		t.Fatal(err)
	}
	if err := WriteMatrixHTML(&html, res); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + txt.String())
	for _, m := range cfg.Models {
		if !strings.Contains(html.String(), "<th>"+m.Name+"</th>") {
			t.Errorf("report lacks a row for %s", m.Name)
		}
	}
}

const variantsConfig = `card: {name: small, memoryGiB: 24}
models:
  - {name: chat, class: interactive, residency: warm, memoryGiB: 8, loadSeconds: 20, wakeSeconds: 2,
     tokensPerSecond: 90, prefillTokensPerSecond: 6000, kvTokens: 16384, sloTTFTSeconds: 2}
  - {name: batch, class: background, residency: onDemand, memoryGiB: 10, loadSeconds: 30,
     tokensPerSecond: 60, prefillTokensPerSecond: 4000, kvTokens: 16384}
tenants: [{name: alice}, {name: bob}]
`

// p95 is model's p95 TTFT in the cell of set under mix.
func p95(t *testing.T, res *MatrixResult, set, mix, model string) float64 {
	t.Helper()
	for _, c := range res.Cells {
		if strings.Join(c.Models, "+") == set && c.Mix == mix {
			for _, m := range c.PerModel {
				if m.Model == model {
					return m.TTFTP95
				}
			}
		}
	}
	t.Fatalf("%s: no cell %s/%s for %s", res.Variant, set, mix, model)
	return 0
}

// The matrix repeats on each variant of the config, and each variant
// changes what it says: the config itself stays as written.
func TestMatrixVariants(t *testing.T) {
	cfg, err := ParseConfig("small.yaml", []byte(variantsConfig))
	if err != nil {
		t.Fatal(err)
	}
	vs, err := ParseVariants("all")
	if err != nil {
		t.Fatal(err)
	}
	all, err := MatrixVariants(cfg, vs, 1, 300)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	byName := map[string]*MatrixResult{}
	for _, r := range all {
		names = append(names, r.Variant)
		byName[r.Variant] = r
		for _, c := range r.Cells {
			if c.LedgerViolations != 0 {
				t.Fatalf("%s: cell %v %s: %d ledger violations", r.Variant, c.Models, c.Mix, c.LedgerViolations)
			}
		}
	}
	if got := strings.Join(names, ","); got != "base,adapters,quantized,batching-off,preemption,preemption-off" {
		t.Fatalf("variants %s", got)
	}
	if m := cfg.Models[0]; m.MemoryGiB != 8 || m.TokensPerSecond != 90 || m.MaxInFlight != 16 || len(m.Adapters) != 0 || cfg.NoPreemption || cfg.EngineBatch || cfg.TenantAdapters {
		t.Fatalf("the variants changed the config: %+v", m)
	}
	base := byName["base"]
	// One request at a time: a burst queues behind itself.
	if b, o := p95(t, base, "chat", "bursty", "chat"), p95(t, byName["batching-off"], "chat", "bursty", "chat"); o <= b {
		t.Errorf("bursty chat p95 %gs with batching off, %gs with it on: want longer", o, b)
	}
	// Twice the decode rate: the first token comes sooner.
	if b, q := p95(t, base, "chat", "short", "chat"), p95(t, byName["quantized"], "chat", "short", "chat"); q >= b {
		t.Errorf("short chat p95 %gs quantized, %gs not: want shorter", q, b)
	}
	// Long prompts wait for the batch's KV room: preempting the
	// background batch beside them makes it.
	if on, off := p95(t, byName["preemption"], "chat", "long", "chat"), p95(t, byName["preemption-off"], "chat", "long", "chat"); on >= off {
		t.Errorf("long chat p95 %gs with the background batch preempted, %gs without: want shorter", on, off)
	}
	for _, v := range []string{"adapters", "preemption"} {
		same := true
		for i, c := range byName[v].Cells {
			for j, m := range c.PerModel {
				if m.TTFTP95 != base.Cells[i].PerModel[j].TTFTP95 {
					same = false
				}
			}
		}
		if same {
			t.Errorf("variant %s: every cell as in base", v)
		}
	}
	var html bytes.Buffer
	if err := WriteMatricesHTML(&html, all); err != nil {
		t.Fatal(err)
	}
	for _, v := range names {
		if !strings.Contains(html.String(), `<h2 id="`+v+`">Variant: `+v+`</h2>`) {
			t.Errorf("report lacks variant %s", v)
		}
	}
}

// Quantize halves the weights' bytes: the weight share of the footprint,
// the loads and wakes; and doubles the decode rate.
func TestQuantize(t *testing.T) {
	m := ModelConfig{MemoryGiB: 16, PeakGiB: 16, ResidualGiB: 0.8, LoadSeconds: 40, WakeSeconds: 4, TokensPerSecond: 75, PrefillTokensPerSecond: 5000}
	Quantize(&m)
	if m.MemoryGiB != 10 || m.PeakGiB != 10 || m.ResidualGiB != 0.5 || m.LoadSeconds != 20 || m.WakeSeconds != 2 || m.TokensPerSecond != 150 ||
		m.PrefillTokensPerSecond != 5000 || m.Quantization != "fp8" {
		t.Fatalf("quantized %+v", m)
	}
}

func TestParseVariantsRejectsUnknown(t *testing.T) {
	if _, err := ParseVariants("base,fast"); err == nil || !strings.Contains(err.Error(), `invalid --variants "fast"`) {
		t.Fatalf("err %v", err)
	}
	vs, err := ParseVariants("quantized, base,quantized")
	if err != nil || len(vs) != 2 || vs[0].Name != "quantized" || vs[1].Name != "base" {
		t.Fatalf("%v %v", vs, err)
	}
}
