package agent_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
)

// replayLoad is how long TestReplayFromTheCardsOwnTraffic offers its mixed
// load: 20 s here, GPUPLANE_REPLAY_SECONDS for the long check (600 for the
// issue's 10 minutes; bench/RESULTS.md).
func replayLoad(t *testing.T) time.Duration {
	if s := os.Getenv("GPUPLANE_REPLAY_SECONDS"); s != "" {
		var n int
		if _, err := fmt.Sscan(s, &n); err != nil || n <= 0 {
			t.Fatalf("GPUPLANE_REPLAY_SECONDS=%q: want seconds > 0", s)
		}
		return time.Duration(n) * time.Second
	}
	return 20 * time.Second
}

// TestReplayFromTheCardsOwnTraffic: a --dev agent with sim engines serves a
// mixed load — an interactive pinned chat, a standard onDemand coder and a
// background onDemand batch model that do not fit beside each other — and
// records it; `simulate serve --from-node` replays the record through the
// controller and reproduces each model's SLO attainment within 5 points of
// what the gateway measured (every model with GPUPLANE_REPLAY_SECONDS=600,
// the chat on the short default load); the same traffic on a card twice as
// large (--card-memory) keeps both onDemand models resident: no evictions.
func TestReplayFromTheCardsOwnTraffic(t *testing.T) {
	n := newNode(t, "replay", true, "l4=1")
	n.cfg.Dev, n.cfg.BootstrapExpect = true, 0
	n.start(t)
	gpuplane(t, n, "accelerators", "create", "shared", "--device", "l4", "--tenancy", "shared", "--max-models", "4")
	for _, m := range []struct{ name, residency, priority, percent, slo, tps, load string }{
		{"chat", "pinned", "interactive", "40", "400", "100", "0.5"},
		{"coder", "onDemand", "standard", "45", "1500", "100", "1"},
		{"batch", "onDemand", "background", "45", "0", "100", "1"},
	} {
		slo := ""
		if m.slo != "0" {
			slo = fmt.Sprintf("\n  slo: {ttftMs: %s}", m.slo)
		}
		applySpec(t, n, m.name, fmt.Sprintf(`resource: ModelDeployment
resourceVersion: v1
metadata: {name: %s}
spec:
  model: /models/%s
  residency: %s
  priority: %s%s
  placement: {accelerator: shared}
  engine: {kind: sim, memoryPercent: %s, args: ["--tokens-per-second", %q, "--load-seconds", %q]}
`, m.name, m.name, m.residency, m.priority, slo, m.percent, m.tps, m.load))
	}
	waitServed(t, n.a.GatewayURL(), "chat")
	c := openaiClient(n)
	// The warm-up requests above are part of the record too: the replay
	// starts from what the card saw first.
	// Poisson arrivals per model, each stream from its own seed.
	var wg sync.WaitGroup
	end := time.Now().Add(replayLoad(t))
	for i, s := range []struct {
		model  string
		perSec float64
		tokens int64
	}{{"chat", 2, 8}, {"coder", 0.5, 30}, {"batch", 1, 60}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(7, uint64(i)))
			var inner sync.WaitGroup
			for {
				time.Sleep(time.Duration(rng.ExpFloat64() / s.perSec * float64(time.Second)))
				if !time.Now().Before(end) {
					break
				}
				inner.Add(1)
				go func() {
					defer inner.Done()
					// Patient clients: the replay compares the card, not
					// their timeouts (an abandoned request is recorded,
					// and the simulator has no clients that leave).
					ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
					defer cancel()
					_, _ = c.Completions.New(ctx, openai.CompletionNewParams{Model: openai.CompletionNewParamsModel(s.model),
						Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("hello replay")}, MaxTokens: openai.Int(s.tokens)})
				}()
			}
			inner.Wait()
		}()
	}
	wg.Wait()

	// The batch requests waited for their model's turn on the card (a
	// load at least); the speed the node learned for it is its engine's
	// (100 tokens/s, at worst a third of it beside a busy chat and coder),
	// not its tokens over those waits, which the replay would take for a
	// model a hundred times slower.
	// The profiles follow the requests' ends as the node hears of them:
	// poll a while for batch's first figure.
	var tps float64
	var prof map[string]any
	for deadline := time.Now().Add(30 * time.Second); tps == 0 && time.Now().Before(deadline); time.Sleep(time.Second) {
		profs, err := jsonList(n, "residency", "profiles")
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range profs {
			if p["model"] == "/models/batch" {
				prof = p
				tps, _ = p["tokensPerSecond"].(float64)
			}
		}
	}
	if tps < 25 {
		t.Errorf("batch profile: %.1f tokens/s learned, want the engine's speed (≥ 25 of its 100): %v", tps, prof)
	}

	type row struct {
		Model                   string
		Offered                 int
		ServedSLO, SimulatedSLO float64
		WhatIfSLO               *float64
	}
	var base, bigger struct {
		Requests                         int
		Models                           []row
		BestEffort                       []string
		ColdLoads, Evictions             int
		WhatIfColdLoads, WhatIfEvictions *int
	}
	// GPUPLANE_REPLAY_RECORD keeps the record in a file, to replay again
	// offline with `simulate serve --record FILE`.
	saved := os.Getenv("GPUPLANE_REPLAY_RECORD")
	if saved == "" {
		saved = filepath.Join(t.TempDir(), "record.json")
	}
	out := gpuplane(t, n, "simulate", "serve", "--from-node", "replay", "--save-record", saved, "-o", "json")
	if err := json.Unmarshal([]byte(out), &base); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	// The saved record replays offline to the same answer.
	if again := gpuplane(t, n, "simulate", "serve", "--record", saved, "-o", "json"); again != out {
		t.Errorf("--record %s replays to\n%s\nwhere --from-node gave\n%s", saved, again, out)
	}
	t.Logf("replay:\n%s", gpuplane(t, n, "simulate", "serve", "--from-node", "replay"))
	if base.Requests < 20 || len(base.Models) != 3 {
		t.Fatalf("replay of %d requests over %d models, want the load's three models: %s", base.Requests, len(base.Models), out)
	}
	// Every model within 5 points on the long load; on the short one
	// (20 s: a dozen coder requests, each worth 8 points, swaps at the
	// start) only the interactive chat, whose hundred requests make the
	// figure steady.
	long := os.Getenv("GPUPLANE_REPLAY_SECONDS") != ""
	for _, m := range base.Models {
		if !long && m.Model != "chat" {
			continue
		}
		if d := math.Abs(m.SimulatedSLO - m.ServedSLO); d > 0.05 {
			t.Errorf("%s: %.1f%% within SLO as served, %.1f%% as simulated: %.1f points apart, want ≤ 5", m.Model, 100*m.ServedSLO, 100*m.SimulatedSLO, 100*d)
		}
	}
	out = gpuplane(t, n, "simulate", "serve", "--from-node", "replay", "--card-memory", "48GiB", "-o", "json")
	if err := json.Unmarshal([]byte(out), &bigger); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	t.Logf("what if 48GiB:\n%s", gpuplane(t, n, "simulate", "serve", "--from-node", "replay", "--card-memory", "48GiB"))
	for _, m := range bigger.Models {
		if m.WhatIfSLO == nil {
			t.Fatalf("%s: no what-if figure: %s", m.Model, out)
		}
	}
	// On a card that holds all three, the onDemand models stop evicting
	// each other.
	if bigger.Evictions == 0 || bigger.WhatIfEvictions == nil || *bigger.WhatIfEvictions != 0 {
		t.Errorf("evictions %d on the card, %v on 48 GiB: want the evictions gone", bigger.Evictions, bigger.WhatIfEvictions)
	}
	if _, err := tryCLI(n, "simulate", "serve", "--from-node", "replay", "--remove", "nosuch"); err == nil {
		t.Error("--remove of a model not on the card was accepted")
	}
}
