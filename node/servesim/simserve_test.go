package servesim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/gpuplane/gpuplane/node/residency"
)

// smallCard is a 16 GiB card (15.2 usable) with five 5 GiB models: three
// fit at once, and static pins three of them.
const smallCard = `
card: {name: test, memoryGiB: 16}
models:
  - {name: a, class: interactive, residency: warm, memoryGiB: 5, loadSeconds: 10, tokensPerSecond: 50, maxInFlight: 8, kvTokens: 20000, sloTTFTSeconds: 2}
  - {name: b, class: interactive, memoryGiB: 5, loadSeconds: 10, tokensPerSecond: 50, maxInFlight: 8, kvTokens: 20000, sloTTFTSeconds: 2, keepAliveSeconds: 60}
  - {name: c, class: interactive, memoryGiB: 5, loadSeconds: 10, tokensPerSecond: 50, maxInFlight: 8, kvTokens: 20000, sloTTFTSeconds: 2}
  - {name: d, class: interactive, memoryGiB: 5, loadSeconds: 10, tokensPerSecond: 50, maxInFlight: 8, kvTokens: 20000, sloTTFTSeconds: 2}
  - {name: e, class: background, memoryGiB: 5, loadSeconds: 10, tokensPerSecond: 50, maxInFlight: 8, kvTokens: 20000}
tenants: [{name: t1}, {name: t2}]
traces:
  - {file: "*.jsonl"}
`

// writeTrace writes a JSONL trace of n requests spread over models and
// tenants from a seed, with bursts that keep several models busy at once.
func writeTrace(t *testing.T, dir string, n int, models []string, seed uint64) string {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 7))
	var b strings.Builder
	tm := 0.0
	for i := range n {
		tm += rng.ExpFloat64() * 2
		m := models[(i/5+rng.IntN(2))%len(models)]
		fmt.Fprintf(&b, `{"time": %.3f, "model": %q, "tenant": "t%d", "prompt_tokens": %d, "output_tokens": %d}`+"\n",
			tm, m, 1+rng.IntN(2), 50+rng.IntN(500), 10+rng.IntN(200))
	}
	p := filepath.Join(dir, "trace.jsonl")
	if err := os.WriteFile(p, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func setup(t *testing.T, yaml string, n int, seed uint64) (*Config, *Workload) {
	t.Helper()
	dir := t.TempDir()
	cfg, err := ParseConfig(filepath.Join(dir, "cfg.yaml"), []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range cfg.Models {
		names = append(names, m.Name)
	}
	trace := writeTrace(t, dir, n, names, seed)
	w, err := NewWorkload(cfg, []string{trace}, seed)
	if err != nil {
		t.Fatal(err)
	}
	return cfg, w
}

func mustRun(t *testing.T, cfg *Config, w *Workload, policy string, observe func(*sim)) Result {
	t.Helper()
	r, err := run(cfg, w, policy, 1, observe, nil)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestSameSeedSameOutput(t *testing.T) {
	for _, p := range Policies {
		cfg, w := setup(t, smallCard+"synthetic: [{model: e, tenants: [t1, t2], concurrency: 2, promptTokens: 100, outputTokens: 300}]\n", 400, 1)
		r1 := mustRun(t, cfg, w, p, nil)
		cfg, w = setup(t, smallCard+"synthetic: [{model: e, tenants: [t1, t2], concurrency: 2, promptTokens: 100, outputTokens: 300}]\n", 400, 1)
		r2 := mustRun(t, cfg, w, p, nil)
		if r1.StaticBestSearch != nil && r2.StaticBestSearch != nil {
			r1.StaticBestSearch.Seconds, r2.StaticBestSearch.Seconds = 0, 0 // wall time
		}
		if !reflect.DeepEqual(r1, r2) {
			t.Errorf("%s: two runs with the same seed differ:\n%+v\n%+v", p, r1, r2)
		}
		if r1.Completed == 0 {
			t.Errorf("%s: nothing completed: %+v", p, r1)
		}
	}
	cfg, w := setup(t, smallCard, 400, 2)
	r3 := mustRun(t, cfg, w, "gpuplane", nil)
	cfg, w = setup(t, smallCard, 400, 1)
	if r1 := mustRun(t, cfg, w, "gpuplane", nil); reflect.DeepEqual(r1, r3) {
		t.Errorf("seeds 1 and 2 gave the same result: the seed is not used")
	}
}

func loaded(s *sim) (n int, names []string) {
	for _, e := range s.engines {
		if e.state != off {
			n++
			names = append(names, e.m.Name+":"+e.state.String())
		}
	}
	return n, names
}

func TestLlamaSwapSwapGroupHoldsOneModelAtATime(t *testing.T) {
	cfg, w := setup(t, smallCard, 300, 3)
	group, groups := groupsFor(cfg, cfg.usableBytes())
	var bad []string
	swaps := 0
	r := mustRun(t, cfg, w, "llamaswap", func(s *sim) {
		per := make([]int, groups)
		for _, e := range s.engines {
			if g := group[e.idx]; g >= 0 && e.state != off {
				per[g]++
				if per[g] > 1 && len(bad) < 3 {
					_, names := loaded(s)
					bad = append(bad, fmt.Sprintf("%.1fs: %v", s.now, names))
				}
			}
		}
		swaps = s.met.coldLoads
	})
	if len(bad) > 0 {
		t.Fatalf("llamaswap held two members of a swap group at once: %v", bad)
	}
	if swaps < 5 || r.Completed == 0 || r.LedgerViolations != 0 {
		t.Fatalf("the trace should make llamaswap swap within the memory: %d loads, %d completed, %d violations", swaps, r.Completed, r.LedgerViolations)
	}
}

func TestLlamaSwapRejectsPastConcurrencyLimit(t *testing.T) {
	dir := t.TempDir()
	cfg, err := ParseConfig("cfg.yaml", []byte(smallCard))
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for range 12 {
		b.WriteString(`{"time": 1, "model": "a", "prompt_tokens": 10, "output_tokens": 100}` + "\n")
	}
	p := filepath.Join(dir, "burst.jsonl")
	os.WriteFile(p, []byte(b.String()), 0o600)
	w, err := NewWorkload(cfg, []string{p}, 1)
	if err != nil {
		t.Fatal(err)
	}
	var by429 int
	r := mustRun(t, cfg, w, "llamaswap", func(s *sim) { by429 = s.met.rejectedByStatus[429] })
	if by429 != 2 || r.Completed != 10 {
		t.Fatalf("12 requests at once for one model: want 10 served and 2 rejected with 429, got %d completed, %d 429s", r.Completed, by429)
	}
}

func TestOllamaAtMostThreeLoaded(t *testing.T) {
	// A 64 GiB card: memory never limits, only OLLAMA_MAX_LOADED_MODELS.
	cfg, w := setup(t, strings.Replace(smallCard, "memoryGiB: 16", "memoryGiB: 64", 1), 300, 4)
	most := 0
	r := mustRun(t, cfg, w, "ollama", func(s *sim) {
		n, _ := loaded(s)
		most = max(most, n)
	})
	if most != 3 {
		t.Fatalf("ollama held at most %d models at once, want exactly 3 (the limit, reached)", most)
	}
	if r.Completed == 0 {
		t.Fatalf("nothing completed")
	}
}

func TestOllamaEvictsShortestKeepAliveFirst(t *testing.T) {
	// a, b, c load in turn and go idle; d's request must evict b (keep_alive
	// 60s, shortest), not a (the least recently used).
	dir := t.TempDir()
	cfg, err := ParseConfig("cfg.yaml", []byte(strings.Replace(smallCard, "memoryGiB: 16", "memoryGiB: 64", 1)))
	if err != nil {
		t.Fatal(err)
	}
	trace := `{"time": 0, "model": "a", "prompt_tokens": 10, "output_tokens": 10}
{"time": 20, "model": "b", "prompt_tokens": 10, "output_tokens": 10}
{"time": 40, "model": "c", "prompt_tokens": 10, "output_tokens": 10}
{"time": 58, "model": "d", "prompt_tokens": 10, "output_tokens": 10}
`
	p := filepath.Join(dir, "t.jsonl")
	os.WriteFile(p, []byte(trace), 0o600)
	w, err := NewWorkload(cfg, []string{p}, 1)
	if err != nil {
		t.Fatal(err)
	}
	var stopped []string
	prev := map[string]engState{}
	mustRun(t, cfg, w, "ollama", func(s *sim) {
		for _, e := range s.engines {
			if e.state == stopping && prev[e.m.Name] != stopping {
				stopped = append(stopped, e.m.Name)
			}
			prev[e.m.Name] = e.state
		}
	})
	if len(stopped) == 0 || stopped[0] != "b" {
		t.Fatalf("first unload: want b (shortest keep_alive), got %v", stopped)
	}
}

func TestStaticRejectsModelsThatDoNotFit(t *testing.T) {
	cfg, w := setup(t, smallCard, 300, 5)
	r := mustRun(t, cfg, w, "static", nil)
	// Order: warm a first, then interactive b, c; d and e do not fit.
	for _, m := range r.Models {
		hosted := m.Model == "a" || m.Model == "b" || m.Model == "c"
		switch {
		case hosted && (m.Completed == 0 || m.Rejected > 0):
			t.Errorf("%s fits and is pinned: want it served, got %+v", m.Model, m)
		case !hosted && (m.Completed > 0 || m.Rejected != m.Requests || m.Requests == 0):
			t.Errorf("%s does not fit: want every request rejected, got %+v", m.Model, m)
		}
	}
	if r.ColdLoads != 3 || r.Evictions != 0 {
		t.Errorf("static: want 3 loads, no eviction; got %d, %d", r.ColdLoads, r.Evictions)
	}
}

func TestGpuplaneKeepsTheLedger(t *testing.T) {
	yaml := smallCard + `synthetic:
  - {model: e, tenants: [t1, t2], concurrency: 3, promptTokens: 200, outputTokens: 400}
  - {model: d, tenants: [t1], ratePerSecond: 0.2, onSeconds: 60, offSeconds: 240, promptTokens: 100, outputTokens: 50}
`
	cfg, w := setup(t, yaml, 1500, 6)
	var over []string
	r := mustRun(t, cfg, w, "gpuplane", func(s *sim) {
		var sum int64
		for _, e := range s.engines {
			sum += e.mem
		}
		if sum > s.usable && len(over) < 3 {
			_, names := loaded(s)
			over = append(over, fmt.Sprintf("%.1fs: %d MiB > %d MiB: %v", s.now, sum>>20, s.usable>>20, names))
		}
	})
	p := s0(r)
	if r.LedgerViolations != 0 || len(over) > 0 {
		t.Fatalf("gpuplane: %d ledger violations, over memory: %v", r.LedgerViolations, over)
	}
	served := 0
	for _, m := range r.Models {
		if m.Completed > 0 {
			served++
		}
	}
	if served != 5 || r.ColdLoads < 4 {
		t.Fatalf("gpuplane should serve all five models by loading and evicting: %s", p)
	}
}

func s0(r Result) string { return fmt.Sprintf("%+v", r) }

func TestBadInput(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	azureMap := smallCard + "  - {file: \"az*.csv\", model: a}\n"
	for _, tc := range []struct {
		name, cfg, file, content string
		want                     []string
	}{
		{"unsorted jsonl", smallCard, "u.jsonl", "{\"time\": 2, \"model\": \"a\", \"prompt_tokens\": 1, \"output_tokens\": 1}\n{\"time\": 1, \"model\": \"a\", \"prompt_tokens\": 1, \"output_tokens\": 1}\n",
			[]string{"u.jsonl", "line 2", "time", "sorted"}},
		{"negative time", smallCard, "n.jsonl", "{\"time\": -1, \"model\": \"a\", \"prompt_tokens\": 1, \"output_tokens\": 1}\n",
			[]string{"n.jsonl", "line 1", "time", "≥ 0"}},
		{"unknown field", smallCard, "f.jsonl", "{\"time\": 1, \"model\": \"a\", \"prompt_tokens\": 1, \"output_tokens\": 1, \"colour\": 3}\n",
			[]string{"f.jsonl", "line 1", "colour"}},
		{"unknown model", smallCard, "m.jsonl", "{\"time\": 1, \"model\": \"a\", \"prompt_tokens\": 1, \"output_tokens\": 1}\n{\"time\": 1, \"model\": \"zeta\", \"prompt_tokens\": 1, \"output_tokens\": 1}\n",
			[]string{"m.jsonl", "line 2", "model", "zeta", "not in config"}},
		{"unknown column", azureMap, "az1.csv", "TIMESTAMP,ContextTokens,Colour\n2023-11-16 18:15:46.6805900,374,44\n",
			[]string{"az1.csv", "line 1", "Colour", "unknown column"}},
		{"unsorted csv", azureMap, "az2.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:45.0000000,374,44\n",
			[]string{"az2.csv", "line 3", "TIMESTAMP", "sorted"}},
		{"bad tokens", azureMap, "az3.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,-4,44\n",
			[]string{"az3.csv", "line 2", "ContextTokens"}},
		{"unmapped csv", smallCard, "other.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n",
			[]string{"other.csv", "no traces entry"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := ParseConfig("cfg.yaml", []byte(tc.cfg))
			if err != nil {
				t.Fatal(err)
			}
			_, err = NewWorkload(cfg, []string{write(tc.file, tc.content)}, 1)
			if err == nil {
				t.Fatalf("want an error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
	for _, tc := range []struct {
		name, cfg string
		want      []string
	}{
		{"pinned exceed card", strings.ReplaceAll(strings.Replace(smallCard, "residency: warm, ", "", 1), "memoryGiB: 5,", "residency: pinned, memoryGiB: 5,"),
			[]string{"cfg.yaml", "line 3:", "reserved shares (pinned and warm) need 25.00 GiB", "usable 15.20 GiB", "a (pinned) 5 + b (pinned) 5"}},
		// Warm shares are reserved too: a warm a and b and pinned c, d
		// need 20 GiB on 15.2.
		{"warm shares exceed card", strings.Replace(strings.Replace(strings.Replace(smallCard, "{name: b, class: interactive,", "{name: b, class: interactive, residency: warm,", 1),
			"{name: c, class: interactive,", "{name: c, class: interactive, residency: pinned,", 1), "{name: d, class: interactive,", "{name: d, class: interactive, residency: pinned,", 1),
			[]string{"reserved shares (pinned and warm) need 20.00 GiB", "usable 15.20 GiB", "a (warm) 5 + b (warm) 5 + c (pinned) 5 + d (pinned) 5"}},
		{"unknown field", smallCard + "colour: red\n", []string{"cfg.yaml", "line 12:", "colour"}},
		{"bad class", strings.Replace(smallCard, "class: background", "class: batchy", 1), []string{"cfg.yaml", "line 8:", "models[4] (e).class", "batchy"}},
		{"model too big", strings.Replace(smallCard, "memoryGiB: 5, loadSeconds", "memoryGiB: 50, loadSeconds", 1), []string{"line 4:", "models[0] (a).peakGiB", "does not fit"}},
		{"synthetic unknown model", smallCard + "synthetic: [{model: zz, ratePerSecond: 1}]\n", []string{"line 12:", "synthetic[0].model", "zz"}},
		{"bad card", strings.Replace(smallCard, "memoryGiB: 16", "memoryGiB: -1", 1), []string{"line 2:", "card.memoryGiB", "must be > 0"}},
	} {
		t.Run("config "+tc.name, func(t *testing.T) {
			_, err := ParseConfig("cfg.yaml", []byte(tc.cfg))
			if err == nil {
				t.Fatalf("want an error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

func TestGpuplaneFairBetweenBackloggedTenants(t *testing.T) {
	// Model a serves about one request a second; t1 asks for five a second
	// and t2 for one: both stay backlogged. VTC gives them equal service;
	// a FIFO (static) gives t1 five times t2's.
	yaml := smallCard + `durationSeconds: 600
synthetic:
  - {model: a, tenants: [t1], ratePerSecond: 5, promptTokens: 100, outputTokens: 100}
  - {model: a, tenants: [t2], ratePerSecond: 1, promptTokens: 100, outputTokens: 100}
`
	yaml = strings.Replace(yaml, "tokensPerSecond: 50, maxInFlight: 8", "tokensPerSecond: 50, maxInFlight: 2", 1)
	cfg, err := ParseConfig("cfg.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	w, err := NewWorkload(cfg, nil, 1)
	if err != nil {
		t.Fatal(err)
	}
	gp := mustRun(t, cfg, w, "gpuplane", nil)
	st := mustRun(t, cfg, w, "static", nil)
	t.Logf("fairness gap: gpuplane %.1f%%, static %.1f%%", gp.FairnessGapPercent, st.FairnessGapPercent)
	if gp.FairnessWindows == 0 || st.FairnessWindows == 0 {
		t.Errorf("windows judged: gpuplane %d, static %d; both tenants stay backlogged, so there must be some", gp.FairnessWindows, st.FairnessWindows)
	}
	if gp.FairnessGapPercent > 10 {
		t.Errorf("gpuplane: fairness gap %.1f%%, want ≤ 10%%", gp.FairnessGapPercent)
	}
	if st.FairnessGapPercent < 30 {
		t.Errorf("static (FIFO): fairness gap %.1f%%, want a large one (the measure must see unfairness)", st.FairnessGapPercent)
	}
}

func TestGenTD26Trace(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "lora_request_trace_x.csv")
	os.WriteFile(p, []byte(`gmt_create,predict_type,predict_status,exec_time_seconds,groupId,prompt_length,negative_prompt_length,num_images_per_prompt,num_inference_steps,checkpoint_model_version_id,num_lora
2024-11-15 16:57:50,TXT_2_IMG,SUCCEED,32.0,G0000,63.0,26.0,1.0,30.0,M0000,0
2024-11-15 16:58:50,TXT_2_IMG,SUCCEED,32.0,G0001,10.0,,2.0,20.0,M0001,1
2024-11-15 16:59:00,TXT_2_IMG,PENDING,0.0,G0002,,,,,,0
2024-11-15 17:00:50,TXT_2_IMG,SUCCEED,32.0,G0001,10.0,,2.0,20.0,M0077,1
`), 0o600)
	cfg, err := ParseConfig("cfg.yaml", []byte(smallCard+"  - {file: \"lora_request_trace_*.csv\", models: {M0000: a, M0001: b}, tenants: [t1, t2], tokensPerImageStep: 2}\n"))
	if err != nil {
		t.Fatal(err)
	}
	arr, err := ReadTraces(cfg, []string{p}, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(arr) != 2 || arr[0].Model != 0 || arr[0].PromptTokens != 89 || arr[0].OutputTokens != 60 ||
		arr[1].Model != 1 || arr[1].Time != 60 || arr[1].OutputTokens != 80 {
		t.Fatalf("arrivals %+v", arr)
	}
	os.WriteFile(p, []byte("gmt_create,predict_type,colour\n"), 0o600)
	if _, err := ReadTraces(cfg, []string{p}, 1); err == nil || !strings.Contains(err.Error(), `line 1: column 3 "colour": unknown column`) {
		t.Fatalf("unknown column: %v", err)
	}
}

// Requests for adapters run on their base model's engine; an adapter not
// loaded costs its load time, and the engine keeps maxAdapters of them.
func TestAdaptersShareTheBaseEngine(t *testing.T) {
	const cfgYAML = `
card: {name: test, memoryGiB: 16}
models:
  - {name: a, residency: pinned, memoryGiB: 5, loadSeconds: 1, tokensPerSecond: 100, adapters: [x, z], adapterLoadSeconds: 2, maxAdapters: 1}
tenants: [{name: t1}]
traces:
  - {file: "*.jsonl"}
`
	for _, tc := range []struct {
		name    string
		models  []string
		slowest float64 // TTFT p99 bound: only a load makes a request slow
		min     float64
	}{
		{"same adapter", []string{"a:x", "a:x", "a:x", "a", "a:x"}, 2.5, 0},
		{"alternating past maxAdapters", []string{"a:x", "a:z", "a:x", "a:z", "a:x"}, 2.5, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			cfg, err := ParseConfig(filepath.Join(dir, "cfg.yaml"), []byte(cfgYAML))
			if err != nil {
				t.Fatal(err)
			}
			var b strings.Builder
			for i, m := range tc.models {
				fmt.Fprintf(&b, `{"time": %d, "model": %q, "prompt_tokens": 10, "output_tokens": 10}`+"\n", 10+10*i, m)
			}
			p := filepath.Join(dir, "t.jsonl")
			if err := os.WriteFile(p, []byte(b.String()), 0o600); err != nil {
				t.Fatal(err)
			}
			w, err := NewWorkload(cfg, []string{p}, 1)
			if err != nil {
				t.Fatal(err)
			}
			r := mustRun(t, cfg, w, "gpuplane", nil)
			m := r.Models[0]
			if m.Completed != len(tc.models) {
				t.Fatalf("completed %d of %d", m.Completed, len(tc.models))
			}
			loads := map[string]float64{"same adapter": 1, "alternating past maxAdapters": 5}[tc.name]
			if got := r.AdapterLoadsPerHour * r.DurationSeconds / 3600; math.Abs(got-loads) > 0.1 {
				t.Errorf("adapter loads %.1f, want %g", got, loads)
			}
			if m.TTFTP50 < tc.min || m.TTFTP99 > tc.slowest {
				t.Errorf("TTFT p50 %g p99 %g, want p50 ≥ %g, p99 ≤ %g", m.TTFTP50, m.TTFTP99, tc.min, tc.slowest)
			}
		})
	}
	dir := t.TempDir()
	cfg, err := ParseConfig(filepath.Join(dir, "cfg.yaml"), []byte(cfgYAML))
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "bad.jsonl")
	if err := os.WriteFile(p, []byte(`{"time": 1, "model": "a:x", "prompt_tokens": 1, "output_tokens": 1}`+"\n"+`{"time": 2, "model": "a:zz", "prompt_tokens": 1, "output_tokens": 1}`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = NewWorkload(cfg, []string{p}, 1)
	for _, want := range []string{"bad.jsonl", "line 2", "model", `adapter "zz"`, "(a).adapters"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not say %q", err, want)
		}
	}
}

// Requests that arrive during the warm-up run but are not measured.
func TestWarmupIsNotMeasured(t *testing.T) {
	cfg, w := setup(t, smallCard+"warmupSeconds: 300\n", 400, 1)
	before := 0
	for _, a := range w.Arrivals {
		if a.Time < 300 {
			before++
		}
	}
	if before == 0 || before == len(w.Arrivals) {
		t.Fatalf("%d of %d arrivals in the warm-up: the trace does not straddle it", before, len(w.Arrivals))
	}
	for _, p := range Policies {
		r := mustRun(t, cfg, w, p, nil)
		if r.Requests != len(w.Arrivals)-before || r.DurationSeconds != w.End-300 {
			t.Errorf("%s: %d requests over %gs measured, want %d over %gs", p, r.Requests, r.DurationSeconds, len(w.Arrivals)-before, w.End-300)
		}
	}
}

// The example configs parse and run (synthetic traffic only, ten minutes)
// without a ledger violation.
func TestExampleConfigsRun(t *testing.T) {
	for _, name := range []string{"home.yaml", "team.yaml"} {
		t.Run(name, func(t *testing.T) {
			cfg, err := LoadConfig(filepath.Join("..", "..", "examples", "serve", name))
			if err != nil {
				t.Fatal(err)
			}
			cfg.DurationSeconds = 900
			w, err := NewWorkload(cfg, nil, 1)
			if err != nil {
				t.Fatal(err)
			}
			r := mustRun(t, cfg, w, "gpuplane", nil)
			if r.LedgerViolations != 0 || r.Completed == 0 {
				t.Fatalf("%d violations, %d completed", r.LedgerViolations, r.Completed)
			}
		})
	}
}

// An interactive assistant that cannot sleep shares a 16 GiB card with a
// background batch job that always has work, and neither fits beside the
// other. The assistant is asked for every 2 minutes: in its quiet spells
// the batch job takes its memory, and each request then pays a cold load.
// After three such returns the controller protects the assistant from the
// batch job (a recorded protect decision): over the hour the assistant
// cold-loads a few times, not once per request.
func TestProtectedInteractiveColdLoadsLess(t *testing.T) {
	cfg, err := ParseConfig("protect.yaml", []byte(`
card: {name: test, memoryGiB: 16}
models:
  - {name: assistant, class: interactive, memoryGiB: 9, loadSeconds: 10, canSleep: false, tokensPerSecond: 50, sloTTFTSeconds: 2}
  - {name: batch, class: background, memoryGiB: 9, loadSeconds: 10, canSleep: false, tokensPerSecond: 50}
synthetic:
  - {model: batch, concurrency: 2, promptTokens: 500, outputTokens: 500}
durationSeconds: 3600
`))
	if err != nil {
		t.Fatal(err)
	}
	// The lend rules, without the protected set (which would protect the
	// assistant outright).
	cfg.NoBestEffort = true
	w := &Workload{End: 3600}
	for at := 60.0; at < 3600; at += 120 {
		w.Arrivals = append(w.Arrivals, Arrival{Time: at, Model: 0, Tenant: "default", PromptTokens: 100, OutputTokens: 20, order: len(w.Arrivals)})
	}
	var protects []string
	var loads int
	_, err = run(cfg, w, "gpuplane", 1, func(s *sim) {
		p := s.pol.(*gpuplane)
		protects = protects[:0]
		loads = 0
		for _, d := range p.c.Decisions() {
			switch {
			case d.Action == residency.ActProtect:
				protects = append(protects, d.Reason)
			case d.Action == residency.ActLoad && d.Model == "assistant":
				loads++
			}
		}
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(protects) == 0 || !strings.Contains(protects[0], "protect assistant from batch") {
		t.Fatalf("protect decisions %q: want assistant protected from batch", protects)
	}
	t.Logf("assistant: %d cold loads for %d requests; %d protect decisions", loads, len(w.Arrivals), len(protects))
	if n := len(w.Arrivals); loads*3 > n {
		t.Fatalf("assistant cold-loaded %d times for %d requests: want at most a third", loads, n)
	}
}
