package servesim

import (
	"os"
	"path/filepath"
	"testing"
)

// TestASleepCountsWhatItKept: a background batch model the coder takes
// the card from is put to sleep. The sleep reports what the engine keeps
// asleep as it completes (as the agent's card manager reads it from NVML),
// so the controller counts the residual in that very step: the coder
// loads beside the sleeping batch and batch's next turn is a wake.
// Counted at its whole footprint until the next sample, as the simulator
// did before, batch was evicted too and came back by a cold load.
func TestASleepCountsWhatItKept(t *testing.T) {
	const card = `
card: {name: l4, memoryGiB: 22.5}
models:
  - {name: chat, class: interactive, residency: pinned, memoryGiB: 9, loadSeconds: 1, sleepSeconds: 0.05, stopSeconds: 0.2, tokensPerSecond: 100, sloTTFTSeconds: 0.4}
  - {name: coder, class: standard, memoryGiB: 10.1, loadSeconds: 2, wakeSeconds: 0.5, sleepSeconds: 0.05, stopSeconds: 0.2, tokensPerSecond: 100, sloTTFTSeconds: 1.5}
  - {name: batch, class: background, memoryGiB: 10.1, loadSeconds: 2, wakeSeconds: 0.5, sleepSeconds: 0.05, stopSeconds: 0.2, tokensPerSecond: 10}
tenants: [{name: t1}]
traces:
  - {file: "*.jsonl"}
`
	// batch asks first and is loaded; the coder asks while batch runs and
	// takes the card; a minute later, the coder quiet, batch asks again.
	const trace = `{"time": 0, "model": "chat", "tenant": "t1", "prompt_tokens": 10, "output_tokens": 8}
{"time": 1, "model": "batch", "tenant": "t1", "prompt_tokens": 10, "output_tokens": 200}
{"time": 6, "model": "coder", "tenant": "t1", "prompt_tokens": 10, "output_tokens": 30}
{"time": 90, "model": "batch", "tenant": "t1", "prompt_tokens": 10, "output_tokens": 20}
`
	dir := t.TempDir()
	path := filepath.Join(dir, "trace.jsonl")
	if err := os.WriteFile(path, []byte(trace), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := ParseConfig(filepath.Join(dir, "cfg.yaml"), []byte(card))
	if err != nil {
		t.Fatal(err)
	}
	cfg.NoBestEffort = true
	w, err := NewWorkload(cfg, []string{path}, 1)
	if err != nil {
		t.Fatal(err)
	}
	r := mustRun(t, cfg, w, "gpuplane", nil)
	if r.Completed != 4 || r.LedgerViolations != 0 {
		t.Fatalf("want the 4 requests served without a ledger violation: %s", s0(r))
	}
	// chat, batch and coder loaded once each; batch woken for its second
	// turn.
	if r.ColdLoads != 3 || r.Wakes != 1 {
		t.Errorf("%d cold loads and %d wakes, want 3 and 1 (batch slept beside the coder): %s", r.ColdLoads, r.Wakes, s0(r))
	}
}
