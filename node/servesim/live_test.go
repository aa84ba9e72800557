package servesim

import (
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// The live matrix reports through Summarize; on the simulated matrix's own
// cells it must reach the same ratios, worst mixes and flags as Matrix, so
// that both reports mean the same thing.
func TestSummarizeAgreesWithMatrix(t *testing.T) {
	cfg, err := LoadConfig(filepath.Join("..", "..", "examples", "serve", "home.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	res, err := Matrix(cfg, 1, 300)
	if err != nil {
		t.Fatal(err)
	}
	again := &MatrixResult{Card: res.Card, Models: res.Models, Cells: res.Cells}
	Summarize(cfg, again)
	if !reflect.DeepEqual(again.Relative, res.Relative) || !reflect.DeepEqual(again.WorstMix, res.WorstMix) {
		t.Fatalf("Summarize: relative %v / %v, Matrix: %v / %v", again.Relative, again.WorstMix, res.Relative, res.WorstMix)
	}
	if !reflect.DeepEqual(again.Flags, res.Flags) {
		t.Fatalf("Summarize flags %v, Matrix flags %v", again.Flags, res.Flags)
	}
	if len(res.Flags) == 0 {
		t.Fatal("the home matrix flags no pair: the comparison of flags proves nothing")
	}
	if got, want := len(Sets(len(cfg.Models))), len(res.Cells)/len(Mixes); got != want {
		t.Fatalf("Sets: %d sets, Matrix ran %d", got, want)
	}
}

// A replay runs a live set's timeline: only the set's models, the warm-up
// unmeasured, each phase's requests measured in their phase, the closed
// loop only within its window, and the measured overhead added to every
// request's TTFT from its send.
func TestReplaySetRunsTheLiveTimeline(t *testing.T) {
	cfg, err := LoadConfig(filepath.Join("..", "..", "examples", "serve", "home.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	models := []string{"chat", "batch"}
	warm := []LiveRequest{{Time: 0, Model: "chat", PromptTokens: 16, OutputTokens: 4}, {Time: 0, Model: "batch", PromptTokens: 16, OutputTokens: 4}}
	var open []LiveRequest
	for k := range 10 {
		open = append(open, LiveRequest{Time: 100 + 3*float64(k), Model: "chat", PromptTokens: 256, OutputTokens: 128})
	}
	phases := []LivePhase{
		{Mix: "short", Start: 100, End: 130, Open: open},
		{Mix: "background", Start: 200, End: 230, Closed: []LiveClosed{{Model: "batch", Concurrency: 4, PromptTokens: 2000, OutputTokens: 200}}},
	}
	bare, err := ReplaySet(cfg, models, warm, phases, ReplayOptions{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	const ov = 0.25
	with, err := ReplaySet(cfg, models, warm, phases, ReplayOptions{Seed: 1, Overhead: map[string][]float64{"chat": {ov}, "batch": {ov}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(bare) != 2 || len(bare[0]) != 2 || bare[0][0].Model != "chat" || bare[0][1].Model != "batch" {
		t.Fatalf("stats %+v: want two phases of chat and batch", bare)
	}
	if c := bare[0][0]; c.Requests != 10 || c.Completed != 10 || bare[0][1].Requests != 0 {
		t.Fatalf("short phase: chat %+v, batch %+v: want chat's 10 requests answered and none of batch", c, bare[0][1])
	}
	if b := bare[1][1]; b.Requests < 4 || b.Completed != b.Requests || bare[1][0].Requests != 0 {
		t.Fatalf("background phase: batch %+v, chat %+v: want batch's closed loop answered and nothing of chat", b, bare[1][0])
	}
	// Alone on a warm card, chat's requests do not queue: each TTFT is the
	// bare one plus the overhead.
	if d := with[0][0].TTFTP95 - bare[0][0].TTFTP95; d < ov-0.002 || d > ov+0.002 {
		t.Fatalf("chat p95 %g with a %gs overhead, %g without: want the overhead added", with[0][0].TTFTP95, ov, bare[0][0].TTFTP95)
	}
	if _, err := ReplaySet(cfg, []string{"chat", "nosuch"}, warm, phases, ReplayOptions{}); err == nil || !strings.Contains(err.Error(), `"nosuch"`) {
		t.Fatalf("unknown model: %v", err)
	}
}

// A live request the sim engine timed carries its own path to and from
// the engine: the replay delivers it to the node its In after its send and
// adds its Out to its TTFT, instead of a draw from the model's overheads,
// so that replay and live run differ only by the engine's part. Bare
// replays without either.
func TestReplaySetTimedRequestsCarryTheirOwnPaths(t *testing.T) {
	cfg, err := LoadConfig(filepath.Join("..", "..", "examples", "serve", "home.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	models := []string{"chat"}
	warm := []LiveRequest{{Time: 0, Model: "chat", PromptTokens: 16, OutputTokens: 4}}
	var open []LiveRequest
	for k := range 10 {
		r := LiveRequest{Time: 100 + 5*float64(k), Model: "chat", PromptTokens: 256, OutputTokens: 128, Timed: true, In: 0.1, Out: 0.05}
		if k == 4 {
			r.In = 2
		}
		open = append(open, r)
	}
	phases := []LivePhase{{Mix: "short", Start: 100, End: 150, Open: open}}
	bare, err := ReplaySet(cfg, models, warm, phases, ReplayOptions{Seed: 1, Bare: true})
	if err != nil {
		t.Fatal(err)
	}
	// Draws of 5 s would dominate every TTFT if they were used.
	pool := map[string][]float64{"chat": {5}}
	timed, err := ReplaySet(cfg, models, warm, phases, ReplayOptions{Seed: 1, Overhead: pool})
	if err != nil {
		t.Fatal(err)
	}
	b, w := bare[0][0], timed[0][0]
	if b.Completed != 10 || w.Completed != 10 {
		t.Fatalf("bare %+v, timed %+v: want 10 answered each", b, w)
	}
	near := func(x, want float64) bool { return x > want-0.003 && x < want+0.003 }
	if !near(w.TTFTP50-b.TTFTP50, 0.15) {
		t.Fatalf("p50 %g timed, %g bare: want each request's own 0.1 s in and 0.05 s out added, not the 5 s draw", w.TTFTP50, b.TTFTP50)
	}
	if !near(w.TTFTP99-b.TTFTP99, 2.05) {
		t.Fatalf("p99 %g timed, %g bare: want the slow request's 2 s in and 0.05 s out added", w.TTFTP99, b.TTFTP99)
	}
	// Untimed, the same requests get the draws.
	for k := range open {
		open[k].Timed = false
	}
	drawn, err := ReplaySet(cfg, models, warm, phases, ReplayOptions{Seed: 1, Overhead: pool})
	if err != nil {
		t.Fatal(err)
	}
	if d := drawn[0][0]; !near(d.TTFTP50-b.TTFTP50, 5) {
		t.Fatalf("untimed p50 %g, bare %g: want the 5 s draw added", d.TTFTP50, b.TTFTP50)
	}
}

// A live closed loop is replayed with its own requests in the order sent:
// their lengths (not draws around the means) and, timed, their paths to
// and from the engine.
func TestReplaySetClosedLoopSendsTheLiveRequests(t *testing.T) {
	cfg, err := LoadConfig(filepath.Join("..", "..", "examples", "serve", "home.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	models := []string{"batch"}
	warm := []LiveRequest{{Time: 0, Model: "batch", PromptTokens: 16, OutputTokens: 4}}
	var sent []LiveRequest
	for range 400 {
		sent = append(sent, LiveRequest{Model: "batch", PromptTokens: 100, OutputTokens: 10, Timed: true, In: 0.5, Out: 0.25})
	}
	// The means say 2k in and out: 4 loops would send a handful in 30 s.
	phases := []LivePhase{{Mix: "background", Start: 100, End: 130,
		Closed: []LiveClosed{{Model: "batch", Concurrency: 4, PromptTokens: 2000, OutputTokens: 2000, Sent: sent}}}}
	bare, err := ReplaySet(cfg, models, warm, phases, ReplayOptions{Seed: 1, Bare: true})
	if err != nil {
		t.Fatal(err)
	}
	timed, err := ReplaySet(cfg, models, warm, phases, ReplayOptions{Seed: 1, Overhead: map[string][]float64{"batch": {5}}})
	if err != nil {
		t.Fatal(err)
	}
	b, w := bare[0][0], timed[0][0]
	if b.Requests < 100 || b.Completed != b.Requests {
		t.Fatalf("bare %+v: want the live requests' 10-token answers, a hundred and more in 30 s", b)
	}
	// The four loops send together and finish together, with or without
	// the paths: each TTFT differs by its 0.5 s in and 0.25 s out.
	if d := w.TTFTP50 - b.TTFTP50; d < 0.747 || d > 0.753 {
		t.Fatalf("p50 %g with the paths, %g without: want the 0.75 s of each request's paths added, not the 5 s draw", w.TTFTP50, b.TTFTP50)
	}
}

// The live bench sends to the replicas' fronts, which queue nothing before
// the engine: the replay's engines start every request whose prompt fits
// their KV pool, where the gateway's queue would reserve prompt + output
// tokens and hold a request back.
func TestReplaySetSendsAsTheFrontsDo(t *testing.T) {
	cfg, err := LoadConfig(filepath.Join("..", "..", "examples", "serve", "home.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	// speech has a 16k-token pool: four 3k prompts fit (12k), four 3k+3k
	// reservations (24k) do not.
	var sent []LiveRequest
	for range 40 {
		sent = append(sent, LiveRequest{Model: "speech", PromptTokens: 3000, OutputTokens: 3000})
	}
	phases := []LivePhase{{Mix: "background", Start: 100, End: 130,
		Closed: []LiveClosed{{Model: "speech", Concurrency: 4, PromptTokens: 3000, OutputTokens: 3000, Sent: sent}}}}
	warm := []LiveRequest{{Time: 0, Model: "speech", PromptTokens: 16, OutputTokens: 4}}
	out, err := ReplaySet(cfg, []string{"speech"}, warm, phases, ReplayOptions{Seed: 1, Bare: true})
	if err != nil {
		t.Fatal(err)
	}
	// Alone, a prompt's prefill is 0.3 s; a request held back for a
	// reservation would wait 15 s for another's 3k tokens at 200/s.
	if ms := out[0][0]; ms.Completed < 4 || ms.TTFTP95 > 1 {
		t.Fatalf("speech %+v: want every request started as it arrives (p95 TTFT about 0.3 s)", ms)
	}
}
