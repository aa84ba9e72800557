package engine

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/internal/tinygguf"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// The drivers against the sim's strict dialects (issue 33): each engine is
// started from the command its driver builds, as the executor starts it,
// and every call the driver makes (docs/engines.md's tables) is made to
// an engine that refuses what the real one refuses.

// startBuilt runs the command Build makes for spec on card c (on a port
// the kernel picks) and waits until its health path answers 200.
func startBuilt(t *testing.T, c *card, spec *pb.ModelSpec, maySleep bool) (*simProc, Command) {
	t.Helper()
	return startBuiltOn(t, c, spec, maySleep, &pb.Replica{Model: "chat", Cards: []uint32{0}, MemoryMib: 2000}, Enforcement{Mode: ModeNone})
}

// startBuiltOn is startBuilt of a replica placed as r, under enf.
func startBuiltOn(t *testing.T, c *card, spec *pb.ModelSpec, maySleep bool, r *pb.Replica, enf Enforcement) (*simProc, Command) {
	t.Helper()
	p := Params{Model: "chat", Spec: spec, Host: "127.0.0.1", Port: 8100, Self: gpuplaneBin(t), MaySleep: maySleep,
		Replica: r, Cards: []*pb.Card{{Index: 0, Uuid: c.uuid, MemoryMib: 23034}}}
	cmd, err := Build(p, enf)
	if err != nil {
		t.Fatal(err)
	}
	proc := launchProc(t, c, "chat", append(cmd.Args, "--port", "0"), cmd.Env)()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if code, _ := call(t, proc, "GET", cmd.HealthPath, ""); code == http.StatusOK {
			return proc, cmd
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s never answered 200", cmd.HealthPath)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// call sends method path with a JSON body ("" for none) and returns the
// status and body.
func call(t *testing.T, p *simProc, method, path, body string) (int, string) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, p.base+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(data)
}

// usageOf is the usage object of a completion answer.
func usageOf(t *testing.T, body string) map[string]any {
	t.Helper()
	var v struct {
		Usage map[string]any `json:"usage"`
	}
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		t.Fatalf("answer %q: %v", body, err)
	}
	return v.Usage
}

// TestDriverAgainstStrictVLLM: the sim speaking vLLM strictly, started
// from the sim driver's command (the vllm driver's flags and environment):
// sleep, wake, is_sleeping, the level-2 wake's calls, and the runtime LoRA
// calls work; after sleep → wake the adapter is still registered (vLLM's
// 400 "has already been loaded" to a raw reload), the driver's load of it
// succeeds and a request for it is answered; more adapters than
// --max-loras stay registered and take turns in the batch; usage has no
// cached_tokens without --enable-prompt-tokens-details.
func TestDriverAgainstStrictVLLM(t *testing.T) {
	c := newCard(t)
	spec := &pb.ModelSpec{Model: "sim://chat", ServedModelName: "chat",
		Adapters: []*pb.Adapter{{Name: "sql", Source: "/a/sql", Rank: 8}, {Name: "law", Source: "/a/law", Rank: 8}},
		Engine: &pb.EngineSpec{Kind: KindSim, MaxAdapters: 1, Args: []string{"--dialect", "vllm", "--load-seconds", "0.2",
			"--wake-seconds", "0.1", "--tokens-per-second", "40", "--lora-load-time", "50ms"}}}
	p, _ := startBuilt(t, c, spec, true)
	kind := ControlKind(spec.GetEngine())
	if kind != KindVLLM {
		t.Fatalf("ControlKind = %q, want vllm", kind)
	}
	ctl, err := ControlsFor(kind, Target{BaseURL: p.base})
	if err != nil {
		t.Fatal(err)
	}
	ad, err := AdaptersFor(kind, Target{BaseURL: p.base})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, name := range []string{"sql", "law"} {
		if err := ad.LoadAdapter(ctx, name, "/a/"+name); err != nil {
			t.Fatalf("load %s (two adapters, --max-loras 1: vLLM registers both): %v", name, err)
		}
	}
	if got, err := ad.Adapters(ctx); err != nil || !slices.Equal(got, []string{"law", "sql"}) {
		t.Fatalf("Adapters = %v, %v; want law and sql", got, err)
	}
	for _, level := range []int{SleepOffload, SleepDiscard} {
		if err := ctl.Sleep(ctx, level); err != nil {
			t.Fatal(err)
		}
		if asleep, err := ctl.IsSleeping(ctx); err != nil || !asleep {
			t.Fatalf("IsSleeping after a level-%d sleep = %t, %v", level, asleep, err)
		}
		if got, err := ad.Adapters(ctx); err != nil || len(got) != 2 {
			t.Fatalf("asleep at level %d the engine lists %v, %v; vLLM keeps its adapters", level, got, err)
		}
		if err := ctl.Wake(ctx); err != nil {
			t.Fatalf("wake from level %d: %v", level, err)
		}
		// What the residency controller does after a wake: load the
		// adapter a request wants.
		if code, body := call(t, p, "POST", "/v1/load_lora_adapter", `{"lora_name":"sql","lora_path":"/a/sql"}`); code != http.StatusBadRequest ||
			!strings.Contains(body, "The lora adapter 'sql' has already been loaded.") {
			t.Fatalf("raw reload after a wake: %d %s; want vLLM's 400", code, body)
		}
		if err := ad.LoadAdapter(ctx, "sql", "/a/sql"); err != nil {
			t.Fatalf("the driver's load after a level-%d wake: %v", level, err)
		}
		code, body := p.chat(t, "sql")
		if code != http.StatusOK {
			t.Fatalf("request for sql after a level-%d wake: %d %s", level, code, body)
		}
		if u := usageOf(t, body); u["prompt_tokens_details"] != nil {
			t.Fatalf("usage %v: vLLM reports cached_tokens only with --enable-prompt-tokens-details", u)
		}
	}
	// --max-loras 1: a request for law waits until sql's leaves the batch.
	sql := startStreamBody(t, p, `{"model":"sql","prompt":"go","max_tokens":20,"stream":true}`)
	sql.waitTokens(t, 1)
	law := startStreamBody(t, p, `{"model":"law","prompt":"go","max_tokens":5,"stream":true}`)
	<-law.done
	<-sql.done
	if law.count() != 6 || sql.count() != 21 { // tokens and the final chunk
		t.Fatalf("streams got %d and %d chunks, want 21 and 6", sql.count(), law.count())
	}
	if first, last := law.times[0], sql.times[len(sql.times)-1]; first.Before(last) {
		t.Fatalf("law's first token came before sql's stream ended: two adapters in a batch of --max-loras 1")
	}
	if err := ad.UnloadAdapter(ctx, "law"); err != nil {
		t.Fatal(err)
	}
	if err := ad.UnloadAdapter(ctx, "law"); err != nil {
		t.Fatalf("unloading an adapter the engine no longer has (404): %v", err)
	}
}

// startStreamBody is startStream with a body of the test's.
func startStreamBody(t *testing.T, p *simProc, body string) *stream {
	t.Helper()
	s := &stream{cancel: func() {}, done: make(chan struct{})}
	resp, err := http.Post(p.base+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("stream: %s", resp.Status)
	}
	go func() {
		defer close(s.done)
		defer resp.Body.Close()
		buf := make([]byte, 1<<16)
		var pending string
		for {
			n, err := resp.Body.Read(buf)
			pending += string(buf[:n])
			for {
				i := strings.Index(pending, "\n\n")
				if i < 0 {
					break
				}
				if strings.HasPrefix(pending[:i], "data: {") {
					s.mu.Lock()
					s.times = append(s.times, time.Now())
					s.mu.Unlock()
				}
				pending = pending[i+2:]
			}
			if err != nil {
				return
			}
		}
	}()
	return s
}

// TestStrictVLLMRefusesWithoutItsFlags: without VLLM_SERVER_DEV_MODE the
// sleep routes do not exist (404), without
// VLLM_ALLOW_RUNTIME_LORA_UPDATING neither do the LoRA routes; with the
// development mode but no --enable-sleep-mode a sleep fails (500); with
// --enable-prompt-tokens-details usage reports cached_tokens.
func TestStrictVLLMRefusesWithoutItsFlags(t *testing.T) {
	c := newCard(t)
	spec := &pb.ModelSpec{Model: "sim://chat", ServedModelName: "chat",
		Engine: &pb.EngineSpec{Kind: KindSim, Args: []string{"--dialect", "vllm", "--load-seconds", "0", "--tokens-per-second", "0",
			"--enable-prompt-tokens-details"}}}
	p, _ := startBuilt(t, c, spec, false)
	for _, path := range []string{"/sleep?level=1", "/wake_up", "/v1/load_lora_adapter", "/models/load", "/api/generate"} {
		// FastAPI's answer for a route it does not have.
		if code, body := call(t, p, "POST", path, `{}`); code != http.StatusNotFound || strings.TrimSpace(body) != `{"detail":"Not Found"}` {
			t.Errorf("POST %s on vLLM without its flags: %d %s, want 404 {\"detail\":\"Not Found\"}", path, code, body)
		}
	}
	if _, err := NewVLLMControls(Target{BaseURL: p.base}).IsSleeping(context.Background()); err == nil {
		t.Error("IsSleeping on vLLM without VLLM_SERVER_DEV_MODE succeeded")
	}
	code, body := p.chat(t, "chat")
	if u := usageOf(t, body); code != http.StatusOK || u["prompt_tokens_details"] == nil {
		t.Fatalf("with --enable-prompt-tokens-details: %d, usage %v; want cached_tokens", code, u)
	}
	dev := launchProc(t, c, "dev", []string{"engine", "sim", "--port", "0", "--served-model-name", "chat",
		"--dialect", "vllm", "--load-seconds", "0"}, []string{"VLLM_SERVER_DEV_MODE=1"})()
	dev.waitHealthy(t)
	if code, body := call(t, dev, "POST", "/sleep?level=1", ""); code != http.StatusInternalServerError || !strings.Contains(body, "Sleep mode is not enabled") {
		t.Fatalf("sleep without --enable-sleep-mode: %d %s", code, body)
	}
}

// TestDriverAgainstStrictLlamaCpp: the sim speaking llama.cpp, started
// from the driver's command. Without --parallel it runs llama-server's
// auto 4 slots over one unified cache (each up to all of -c); with
// --parallel 2 and maxModelLen 64 the driver's -c 128 gives each slot 64.
// A prompt past the slot's context is refused with llama-server's
// exceed_context_size_error, a request for a slot it does not have runs in
// that id modulo the slot count (the gateway must never send one), the model name is
// not checked, and vLLM's and Ollama's routes do not exist.
func TestDriverAgainstStrictLlamaCpp(t *testing.T) {
	c := newCard(t)
	for _, tc := range []struct {
		args  []string
		slots int
	}{{nil, 4}, {[]string{"--parallel", "2"}, 2}} {
		spec := &pb.ModelSpec{Model: "/m.gguf", ServedModelName: "chat", Engine: &pb.EngineSpec{Kind: KindSim, MaxModelLen: 64,
			Args: append([]string{"--dialect", "llamacpp", "--load-seconds", "0", "--tokens-per-second", "0"}, tc.args...)}}
		if got := LlamaSlots(spec.GetEngine()); got != tc.slots {
			t.Fatalf("LlamaSlots(%v) = %d, want %d", tc.args, got, tc.slots)
		}
		p, _ := startBuilt(t, c, spec, false)
		code, body := call(t, p, "GET", "/slots", "")
		var slots []struct {
			ID   int `json:"id"`
			NCtx int `json:"n_ctx"`
		}
		if err := json.Unmarshal([]byte(body), &slots); err != nil || code != http.StatusOK || len(slots) != tc.slots {
			t.Fatalf("%v: GET /slots: %d %s", tc.args, code, body)
		}
		for _, s := range slots {
			if s.NCtx != 64 {
				t.Fatalf("%v: slot %d holds %d tokens of context, want maxModelLen 64", tc.args, s.ID, s.NCtx)
			}
		}
		if code, body := call(t, p, "POST", "/v1/completions", `{"model":"whatever","prompt":"`+strings.Repeat("w ", 70)+`","max_tokens":1}`); code != http.StatusBadRequest ||
			!strings.Contains(body, "exceed_context_size_error") {
			t.Fatalf("%v: a 70-token prompt in a 64-token slot: %d %s", tc.args, code, body)
		}
		if code, body := call(t, p, "POST", "/v1/completions", `{"model":"whatever","prompt":"hi","max_tokens":2,"id_slot":1}`); code != http.StatusOK {
			t.Fatalf("%v: a request in slot 1: %d %s", tc.args, code, body)
		}
		for _, path := range []string{"/sleep?level=1", "/api/generate", "/models/load"} {
			if code, body := call(t, p, "POST", path, `{}`); code != http.StatusNotFound ||
				strings.TrimSpace(body) != `{"error":{"code":404,"message":"File Not Found","type":"not_found_error"}}` {
				t.Errorf("%v: POST %s on llama-server started with -m: %d %s, want llama-server's 404", tc.args, path, code, body)
			}
		}
		// llama-server takes a slot id past the last modulo the slot
		// count (TestRealConformance): the gateway's slot count must be
		// the engine's, or two tenants would share a slot.
		if code, body := call(t, p, "POST", "/v1/completions", `{"prompt":"hi","max_tokens":1,"id_slot":`+u32(uint32(tc.slots))+`}`); code != http.StatusOK {
			t.Fatalf("%v: a request for slot %d (past the last): %d %s; llama-server runs it in slot 0", tc.args, tc.slots, code, body)
		}
	}
}

// TestDriverAgainstStrictOllama: the sim speaking Ollama, started from
// the driver's command: it answers /api/version (its readiness) before
// any model is loaded, lists nothing in /api/ps until the driver's
// preload; knows the model only by its tag (the served name is Ollama's
// 404); keep_alive unloads and loads it (done_reason unload, load); it has
// no /health, and reports no cached_tokens.
func TestDriverAgainstStrictOllama(t *testing.T) {
	c := newCard(t)
	spec := &pb.ModelSpec{Model: "llama3.2:1b", ServedModelName: "chat",
		Engine: &pb.EngineSpec{Kind: KindSim, Args: []string{"--dialect", "ollama", "--load-seconds", "0.3", "--tokens-per-second", "0"}}}
	// Ollama runs on a share of a card only under hard limits: a whole
	// card here.
	p, cmd := startBuiltOn(t, c, spec, false, &pb.Replica{Model: "chat", Cards: []uint32{0}, MemoryMib: 23034}, Enforcement{Mode: ModeNone})
	if code, body := call(t, p, "GET", "/health", ""); code != http.StatusNotFound || body != "404 page not found" {
		t.Errorf("GET /health on Ollama: %d %q, want gin's 404", code, body)
	}
	if code, body := call(t, p, "GET", "/api/ps", ""); code != http.StatusOK || strings.Contains(body, "llama3.2") {
		t.Fatalf("before the preload /api/ps: %d %s; want no model loaded", code, body)
	}
	c.waitUsed(t, p.pid, 0, "ollama serve before any load")
	if cmd.Preload == nil {
		t.Fatal("the driver's command has no preload")
	}
	if err := cmd.Preload.Run(context.Background(), p.base, func(string) {}); err != nil {
		t.Fatalf("preload: %v", err)
	}
	// It takes the card's free memory, all of it here.
	c.waitUsed(t, p.pid, 23034, "preloaded")
	if code, body := call(t, p, "GET", "/api/ps", ""); code != http.StatusOK || !strings.Contains(body, `"name":"llama3.2:1b"`) {
		t.Fatalf("after the preload /api/ps: %d %s", code, body)
	}
	ctl, err := ControlsFor(ControlKind(spec.GetEngine()), Target{BaseURL: p.base, Model: Params{Model: "chat", Spec: spec}.ControlModel()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := ctl.Sleep(ctx, SleepDiscard); err != nil {
		t.Fatal(err)
	}
	if asleep, err := ctl.IsSleeping(ctx); err != nil || !asleep {
		t.Fatalf("IsSleeping after keep_alive 0 = %t, %v", asleep, err)
	}
	if err := ctl.Wake(ctx); err != nil {
		t.Fatal(err)
	}
	if asleep, err := ctl.IsSleeping(ctx); err != nil || asleep {
		t.Fatalf("IsSleeping after a load = %t, %v", asleep, err)
	}
	for model, want := range map[string]int{"chat": http.StatusNotFound, "llama3.2": http.StatusNotFound, "llama3.2:1b": http.StatusOK} {
		code, body := p.chat(t, model)
		if code != want {
			t.Fatalf("request for %q: %d %s; want %d", model, code, body, want)
		}
		if code == http.StatusOK && usageOf(t, body)["prompt_tokens_details"] != nil {
			t.Fatalf("Ollama reported cached_tokens: %s", body)
		}
	}
	if _, err := AdaptersFor(ControlKind(spec.GetEngine()), Target{BaseURL: p.base}); err == nil {
		t.Fatal("a sim speaking Ollama has vLLM's adapter controls")
	}
}

// TestDriverAgainstStrictOllamaGGUFPath: a sim speaking Ollama deployed
// from a GGUF file, started from the driver's command, becomes ready: the
// preload copies the file into the engine's store as a blob
// (/api/blobs), creates the driver's name from it (/api/create) and loads
// it, and requests by that name are answered. A second preload finds the
// blob and skips the copy. A ".gguf" file that is not GGUF fails the
// preload at once with Ollama's reason, not at the start deadline.
func TestDriverAgainstStrictOllamaGGUFPath(t *testing.T) {
	c := newCard(t)
	path := tinygguf.Write(t).Model
	spec := &pb.ModelSpec{Model: path, ServedModelName: "chat",
		Engine: &pb.EngineSpec{Kind: KindSim, Args: []string{"--dialect", "ollama", "--load-seconds", "0.1", "--tokens-per-second", "0"}}}
	// Ollama runs on a share of a card only under hard limits: a whole
	// card here.
	r := &pb.Replica{Model: "chat", Cards: []uint32{0}, MemoryMib: 23034}
	p, cmd := startBuiltOn(t, c, spec, false, r, Enforcement{Mode: ModeNone})
	name := EngineModel(spec)
	var steps []string
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := cmd.Preload.Run(ctx, p.base, func(s string) { steps = append(steps, s) }); err != nil {
		t.Fatalf("preload of %s: %v (steps %q)", path, err, steps)
	}
	if !hasSteps(steps, "copying", "creating", "loading") {
		t.Fatalf("preload steps %q; want a copy into the store, a create and a load", steps)
	}
	if code, body := call(t, p, "GET", "/api/ps", ""); code != http.StatusOK || !strings.Contains(body, `"name":"`+name+`"`) {
		t.Fatalf("after the preload /api/ps: %d %s; want %s loaded", code, body, name)
	}
	if code, body := p.chat(t, name); code != http.StatusOK {
		t.Fatalf("chat by the driver's name %s: %d %s", name, code, body)
	}
	steps = nil
	if err := cmd.Preload.Run(ctx, p.base, func(s string) { steps = append(steps, s) }); err != nil || hasSteps(steps, "copying") {
		t.Fatalf("second preload: %v, steps %q; want a create and a load without a copy", err, steps)
	}

	bad := filepath.Join(t.TempDir(), "notgguf.gguf")
	if err := os.WriteFile(bad, []byte("not a model"), 0o644); err != nil {
		t.Fatal(err)
	}
	spec.Model = bad
	p, cmd = startBuiltOn(t, c, spec, false, r, Enforcement{Mode: ModeNone})
	err := cmd.Preload.Run(ctx, p.base, func(string) {})
	var se *StartError
	if !errors.As(err, &se) || !strings.Contains(se.Reason, bad) || !strings.Contains(se.Reason, "supplied file was not in GGUF format") {
		t.Fatalf("preload of %s, not a GGUF file: %v; want a StartError naming the file and Ollama's reason", bad, err)
	}
}

// TestDriverAgainstStrictLlamaCppAdapters: llama-server takes adapters
// only at start. Both the llamacpp driver and the sim driver speaking
// llama.cpp pass each adapter as --lora in spec order, with
// --lora-init-without-apply; the engine lists them in GET /lora-adapters
// under the ids LlamaAdapterIDs gives (at scale 1, as llama-server does
// whatever that flag), and a request naming one by id in "lora" runs with
// it alone (an id it does not have is ignored).
func TestDriverAgainstStrictLlamaCppAdapters(t *testing.T) {
	c := newCard(t)
	ads := []*pb.Adapter{{Name: "sql", Source: "/a/sql.gguf", Rank: 8}, {Name: "law", Source: "/a/law.gguf", Rank: 8}}
	want := []string{"--lora", "/a/sql.gguf", "--lora", "/a/law.gguf", "--lora-init-without-apply"}
	llama := &pb.ModelSpec{Model: "/m.gguf", ServedModelName: "chat", Adapters: ads, Engine: &pb.EngineSpec{Kind: KindLlamaCpp}}
	cmd, err := Build(Params{Model: "chat", Spec: llama, Port: 8100, Replica: &pb.Replica{Model: "chat", Cards: []uint32{0}},
		Cards: []*pb.Card{{Index: 0, Uuid: c.uuid, MemoryMib: 23034}}}, Enforcement{Mode: ModeNone})
	if err != nil {
		t.Fatal(err)
	}
	if i := slices.Index(cmd.Args, "--lora"); i < 0 || !slices.Equal(cmd.Args[i:i+len(want)], want) {
		t.Fatalf("llama-server args %v, want %v", cmd.Args, want)
	}
	spec := &pb.ModelSpec{Model: "/m.gguf", ServedModelName: "chat", Adapters: ads, Engine: &pb.EngineSpec{Kind: KindSim,
		Args: []string{"--dialect", "llamacpp", "--load-seconds", "0", "--tokens-per-second", "0"}}}
	ids := LlamaAdapterIDs(spec)
	if ids["sql"] != 0 || ids["law"] != 1 || len(ids) != 2 {
		t.Fatalf("LlamaAdapterIDs = %v", ids)
	}
	p, _ := startBuilt(t, c, spec, false)
	code, body := call(t, p, "GET", "/lora-adapters", "")
	if code != http.StatusOK || !strings.Contains(body, `{"id":1,"path":"/a/law.gguf","scale":1}`) {
		t.Fatalf("GET /lora-adapters: %d %s", code, body)
	}
	if code, body := call(t, p, "POST", "/v1/chat/completions",
		`{"model":"chat","messages":[{"role":"user","content":"hi"}],"max_tokens":2,"lora":[{"id":1,"scale":1}]}`); code != http.StatusOK {
		t.Fatalf("request for law by id: %d %s", code, body)
	}
	code, body = call(t, p, "GET", "/sim/status", "")
	if code != http.StatusOK || !strings.Contains(body, `"lora_applied":{"/a/law.gguf":1}`) {
		t.Fatalf("after one request for law: %d %s", code, body)
	}
	if code, body := call(t, p, "POST", "/v1/completions", `{"prompt":"hi","max_tokens":1,"lora":[{"id":2,"scale":1}]}`); code != http.StatusOK {
		t.Fatalf("request for adapter id 2 of 2: %d %s; llama-server ignores the id", code, body)
	}
	code, body = call(t, p, "GET", "/sim/status", "")
	if code != http.StatusOK || !strings.Contains(body, `"lora_applied":{"/a/law.gguf":1}`) {
		t.Fatalf("after a request naming only id 2: %d %s; it runs on the base", code, body)
	}
}

// TestDriverLlamaCppHoldsNoHostCache: the driver starts llama.cpp (and the
// sim in its dialect) with --cache-ram 0, so the engine holds no host RAM
// of its own, as the ledger counts it (internal/engines: "host: nothing"), and
// no request gets another's prompt back from host RAM. The control: a
// --cache-ram in spec.engine.args turns llama-server's cache back on, and
// the same requests leave host memory held and reuse the first prompt.
func TestDriverLlamaCppHoldsNoHostCache(t *testing.T) {
	llama := &pb.ModelSpec{Model: "/m.gguf", ServedModelName: "chat", Engine: &pb.EngineSpec{Kind: KindLlamaCpp}}
	cmd, err := Build(Params{Model: "chat", Spec: llama, Port: 8100, Replica: &pb.Replica{Model: "chat", Cards: []uint32{0}},
		Cards: []*pb.Card{{Index: 0, Uuid: "GPU-x", MemoryMib: 23034}}}, Enforcement{Mode: ModeNone})
	if err != nil {
		t.Fatal(err)
	}
	if i := slices.Index(cmd.Args, "--cache-ram"); i < 0 || cmd.Args[i+1] != "0" {
		t.Fatalf("llama-server args %v: no --cache-ram 0", cmd.Args)
	}
	promptA := "the private prompt of one tenant " + strings.Repeat("alpha beta gamma ", 10)
	promptB := "another tenant's prompt of other words entirely"
	for _, c := range []struct {
		name  string
		args  []string
		cache bool
	}{{"the driver's flags", nil, false}, {"control: --cache-ram 8192 in the spec's args", []string{"--cache-ram", "8192"}, true}} {
		t.Run(c.name, func(t *testing.T) {
			card := newCard(t)
			spec := &pb.ModelSpec{Model: "/m.gguf", ServedModelName: "chat", Engine: &pb.EngineSpec{Kind: KindSim, Args: append([]string{
				"--dialect", "llamacpp", "--parallel", "1", "--load-seconds", "0", "--tokens-per-second", "0",
				"--kv-pool-mib", "512", "--kv-kib-per-token", "1024"}, c.args...)}}
			p, _ := startBuilt(t, card, spec, false)
			cached := func(prompt string) int {
				code, body := call(t, p, "POST", "/v1/completions", `{"prompt":"`+prompt+`","max_tokens":1}`)
				var v struct {
					Usage struct {
						Details struct {
							Cached int `json:"cached_tokens"`
						} `json:"prompt_tokens_details"`
					}
				}
				if err := json.Unmarshal([]byte(body), &v); err != nil || code != http.StatusOK {
					t.Fatalf("POST /v1/completions: %d %s", code, body)
				}
				return v.Usage.Details.Cached
			}
			cached(promptA) // tenant a
			cached(promptB) // tenant b
			engines, err := card.usage.Engines(card.uuid)
			if err != nil || len(engines) != 1 {
				t.Fatalf("the card's engine records: %v %v", engines, err)
			}
			if held := engines[0].HostMiB; (held > 0) != c.cache {
				t.Errorf("the engine holds %d MiB of host memory; want some: %v", held, c.cache)
			}
			if n := cached(promptA); (n > 0) != c.cache {
				t.Errorf("tenant b sending a's prompt got %d cached tokens from host RAM; want some: %v", n, c.cache)
			}
		})
	}
}
