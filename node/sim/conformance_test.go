package sim

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/internal/porttest"
	"github.com/gpuplane/gpuplane/internal/realengine"
	"github.com/gpuplane/gpuplane/internal/tinygguf"
)

// Differential conformance (docs/engines.md, "Sim against the real
// engines"): one table of contract cases per engine, each run against the
// sim engine in that engine's dialect and against the real binary. A case
// passes only if both answer as it says; a case the sim cannot follow
// names why in simDiffers and runs against the real engine alone. The
// strict sim is trusted exactly as far as these tables reach.
//
// To add an engine: append a conformanceEngine to conformanceEngines (an
// init in its own _test.go file), with its cases and how to start each
// side, ready or still loading.

// contract is one case: a request and what the engine answers.
type contract struct {
	name string
	// method, path and body are the request; "{tiny}" in them (and in
	// shape) is the SHA-256 (hex) of tinygguf's default model file.
	method, path, body string
	// loading: asked of an engine still loading its model.
	loading bool
	status  int
	// contentType is a prefix the answer's Content-Type must have ("": any).
	contentType string
	// shape lists what the answer's body holds: "a.b.0.c" a JSON value at
	// that path, "a.b=v" one whose JSON text (strings unquoted) is v,
	// "~text" the body contains text.
	shape []string
	// simDiffers, when set, is why the sim answers otherwise: the case
	// runs against the real engine alone (and docs/engines.md lists it).
	simDiffers string
}

// conformanceEngine is one engine's table and how to start each side.
type conformanceEngine struct {
	name  string // the dialect
	cases []contract
	// sim and real start the engine (ready, or still loading its model
	// for loading cases) and return its base URL; real skips without the
	// binary (realengine).
	sim, real func(t *testing.T, loading bool) string
}

var conformanceEngines = []conformanceEngine{llamaCppConformance}

// llamaError's shape: {"error":{"code","message","type"}}.
func llamaErrorShape(code int, typ string) []string {
	return []string{"error.code=" + strconv.Itoa(code), "error.message", "error.type=" + typ}
}

var llamaCppConformance = conformanceEngine{
	name: DialectLlamaCpp,
	cases: []contract{
		{name: "health while loading", method: "GET", path: "/health", loading: true, status: 503,
			contentType: "application/json", shape: append(llamaErrorShape(503, "unavailable_error"), "error.message=Loading model")},
		{name: "completion while loading", method: "POST", path: "/v1/completions", body: `{"prompt":"hi","max_tokens":1}`, loading: true, status: 503,
			contentType: "application/json", shape: llamaErrorShape(503, "unavailable_error")},
		{name: "health", method: "GET", path: "/health", status: 200, contentType: "application/json", shape: []string{"status=ok"}},
		{name: "unknown route", method: "GET", path: "/nosuch", status: 404,
			contentType: "application/json", shape: append(llamaErrorShape(404, "not_found_error"), "error.message=File Not Found")},
		{name: "props: slots and context", method: "GET", path: "/props", status: 200, contentType: "application/json",
			shape: []string{"total_slots=2", "default_generation_settings.n_ctx=512", "model_alias=tiny"}},
		{name: "slots", method: "GET", path: "/slots", status: 200, contentType: "application/json",
			shape: []string{"0.id=0", "0.n_ctx=512", "0.is_processing=false", "1.id=1"}},
		{name: "metrics ReadLoad reads", method: "GET", path: "/metrics", status: 200, contentType: "text/plain",
			shape: []string{"~\nllamacpp:requests_processing 0\n", "~\nllamacpp:requests_deferred 0\n"}},
		{name: "adapters after --lora-init-without-apply", method: "GET", path: "/lora-adapters", status: 200, contentType: "application/json",
			shape: []string{"0.id=0", "0.scale=1", "0.path"}},
		{name: "models", method: "GET", path: "/v1/models", status: 200, contentType: "application/json",
			shape: []string{"object=list", "data.0.id=tiny"}},
		{name: "completion", method: "POST", path: "/v1/completions", body: `{"prompt":"hello","max_tokens":2,"temperature":0}`, status: 200,
			contentType: "application/json", shape: []string{"object=text_completion", "choices.0.text", "choices.0.finish_reason=length",
				"usage.completion_tokens=2", "usage.prompt_tokens", "usage.prompt_tokens_details.cached_tokens"}},
		{name: "chat", method: "POST", path: "/v1/chat/completions", body: `{"messages":[{"role":"user","content":"hello"}],"max_tokens":2}`, status: 200,
			contentType: "application/json", shape: []string{"object=chat.completion", "choices.0.message.role=assistant", "choices.0.message.content",
				"usage.completion_tokens=2"}},
		{name: "stream with usage", method: "POST", path: "/v1/completions",
			body: `{"prompt":"hello","max_tokens":2,"stream":true,"stream_options":{"include_usage":true}}`, status: 200,
			contentType: "text/event-stream", shape: []string{"~\"completion_tokens\":2", "~data: [DONE]"}},
		{name: "completion without prompt", method: "POST", path: "/v1/completions", body: `{"max_tokens":2}`, status: 400,
			contentType: "application/json", shape: llamaErrorShape(400, "invalid_request_error")},
		{name: "prompt past the slot's context", method: "POST", path: "/v1/completions",
			body: `{"prompt":"` + strings.Repeat("a ", 600) + `","max_tokens":1}`, status: 400, contentType: "application/json",
			shape: append(llamaErrorShape(400, "exceed_context_size_error"), "error.n_ctx=512", "error.n_prompt_tokens")},
		{name: "adapter id past the last", method: "POST", path: "/v1/completions",
			body: `{"prompt":"hello","max_tokens":1,"lora":[{"id":7,"scale":1}]}`, status: 200, shape: []string{"choices.0.text"}},
		{name: "id_slot past the last", method: "POST", path: "/v1/completions",
			body: `{"prompt":"hello","max_tokens":1,"id_slot":5}`, status: 200, shape: []string{"choices.0.text"}},
	},
	sim: func(t *testing.T, loading bool) string {
		cfg := Config{ServedModelName: "tiny", MemoryMiB: 1024, Dialect: DialectLlamaCpp, Parallel: 2, CtxSize: 1024, LlamaMetrics: true,
			LlamaLoRA: []string{"/adapters/ok.gguf"}, LlamaLoRAInitWithoutApply: true}
		if loading {
			cfg.LoadTime = time.Minute
			return startLoadingEngine(t, cfg)
		}
		base, _ := startEngine(t, cfg)
		return base
	},
	real: func(t *testing.T, loading bool) string {
		bin := realengine.LlamaServer(t)
		f := tinygguf.Write(t, "ok")
		port := porttest.Free(t)
		base := "http://127.0.0.1:" + strconv.Itoa(port)
		args := []string{"-m", f.Model, "--host", "127.0.0.1", "--port", strconv.Itoa(port), "--alias", "tiny",
			"--lora", f.Adapters["ok"], "--lora-init-without-apply", "--parallel", "2", "-c", "1024", "--metrics",
			"--cache-ram", "0", "--threads", "1", "--no-webui"}
		if !loading {
			realengine.Run(t, bin, args, nil, base+"/health")
			return base
		}
		// A large context read without mmap keeps the tiny model loading
		// for a few hundred milliseconds: long enough to be asked.
		args = append(args, "--no-mmap", "-c", "65536")
		realengine.Run(t, bin, args, nil, "")
		for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			if resp, err := http.Get(base + "/health"); err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusServiceUnavailable {
					return base
				}
				t.Fatalf("llama-server answered /health %d before it was seen loading", resp.StatusCode)
			}
		}
		t.Fatal("llama-server never answered while loading")
		return ""
	},
}

// startLoadingEngine starts a sim engine that stays loading its model
// (cfg.LoadTime) and returns its URL once the port is open.
func startLoadingEngine(t *testing.T, cfg Config) string {
	t.Helper()
	port := porttest.Free(t)
	cfg.Host, cfg.Port = "127.0.0.1", port
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg) }()
	t.Cleanup(func() { cancel(); <-done })
	base := "http://127.0.0.1:" + strconv.Itoa(port)
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if resp, err := http.Get(base + "/health"); err == nil {
			resp.Body.Close()
			return base
		}
	}
	t.Fatal("the sim engine's port never opened")
	return ""
}

// TestRealConformance runs every engine's table against the sim and the
// real engine.
func TestRealConformance(t *testing.T) {
	for _, e := range conformanceEngines {
		t.Run(e.name, func(t *testing.T) {
			for _, side := range []struct {
				name  string
				start func(*testing.T, bool) string
			}{{"sim", e.sim}, {"real", e.real}} {
				t.Run(side.name, func(t *testing.T) {
					var ready string
					for _, c := range e.cases {
						if side.name == "sim" && c.simDiffers != "" {
							continue
						}
						base := ready
						if c.loading {
							base = side.start(t, true)
						} else if base == "" {
							base = side.start(t, false)
							ready = base
						}
						if err := c.check(base); err != nil {
							t.Errorf("%s: %s %s: %v", c.name, c.method, c.path, err)
						}
					}
				})
			}
		})
	}
}

// check sends c's request to base and compares the answer with c.
func (c contract) check(base string) error {
	vars := strings.NewReplacer("{tiny}", tinyDigest())
	req, err := http.NewRequest(c.method, base+vars.Replace(c.path), strings.NewReader(vars.Replace(c.body)))
	if err != nil {
		return err
	}
	if c.body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	// A connection per case: llama-server (cpp-httplib) may close a
	// kept-alive connection as the next request goes out on it, which a
	// client sees as EOF on a POST it cannot retry.
	client := http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var problems []string
	if resp.StatusCode != c.status {
		problems = append(problems, fmt.Sprintf("status %d, want %d", resp.StatusCode, c.status))
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, c.contentType) {
		problems = append(problems, fmt.Sprintf("Content-Type %q, want %s…", ct, c.contentType))
	}
	var doc any
	jsonErr := json.Unmarshal(body, &doc)
	for _, s := range c.shape {
		s = vars.Replace(s)
		if text, ok := strings.CutPrefix(s, "~"); ok {
			if !strings.Contains(string(body), text) {
				problems = append(problems, fmt.Sprintf("no %q in the body", text))
			}
			continue
		}
		if jsonErr != nil {
			problems = append(problems, fmt.Sprintf("%s: the body is not JSON (%v)", s, jsonErr))
			continue
		}
		path, want, hasWant := strings.Cut(s, "=")
		v, ok := jsonAt(doc, path)
		switch {
		case !ok:
			problems = append(problems, "no "+path)
		case hasWant && jsonText(v) != want:
			problems = append(problems, fmt.Sprintf("%s is %s, want %s", path, jsonText(v), want))
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("%s\n\tbody: %.300s", strings.Join(problems, "; "), body)
	}
	return nil
}

// tinyDigest is the SHA-256 (hex) of tinygguf's default model file.
var tinyDigest = sync.OnceValue(func() string {
	dir, err := os.MkdirTemp("", "tinygguf")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "tiny.gguf")
	if err := tinygguf.WriteModel(path, tinygguf.ModelOptions{}); err != nil {
		panic(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		panic(err)
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
})

// jsonAt is the value at a dotted path (numbers index arrays).
func jsonAt(v any, path string) (any, bool) {
	for _, k := range strings.Split(path, ".") {
		switch x := v.(type) {
		case map[string]any:
			var ok bool
			if v, ok = x[k]; !ok {
				return nil, false
			}
		case []any:
			i, err := strconv.Atoi(k)
			if err != nil || i < 0 || i >= len(x) {
				return nil, false
			}
			v = x[i]
		default:
			return nil, false
		}
	}
	return v, true
}

func jsonText(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	b, _ := json.Marshal(v)
	return string(b)
}

// TestConformanceTableInDocs: docs/engines.md holds each engine's table as
// conformanceTable renders it (GPUPLANE_UPDATE_DOCS=1 rewrites it).
func TestConformanceTableInDocs(t *testing.T) {
	path := filepath.Join("..", "..", "docs", "engines.md")
	doc, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	const begin, end = "<!-- conformance table: begin (node/sim/conformance_test.go) -->\n", "<!-- conformance table: end -->\n"
	i, j := strings.Index(string(doc), begin), strings.Index(string(doc), end)
	if i < 0 || j < i {
		t.Fatalf("%s has no %q … %q section", path, strings.TrimSpace(begin), strings.TrimSpace(end))
	}
	want := conformanceTable()
	if got := string(doc[i+len(begin) : j]); got != want {
		if os.Getenv("GPUPLANE_UPDATE_DOCS") == "1" {
			out := string(doc[:i+len(begin)]) + want + string(doc[j:])
			if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
				t.Fatal(err)
			}
			return
		}
		t.Errorf("%s's conformance table is out of date (GPUPLANE_UPDATE_DOCS=1 go test -run TestConformanceTableInDocs ./node/sim/ rewrites it); want:\n%s", path, want)
	}
}

// conformanceTable renders every engine's cases as a markdown table.
func conformanceTable() string {
	var b strings.Builder
	for _, e := range conformanceEngines {
		fmt.Fprintf(&b, "\n**%s** (%d cases)\n\n| case | request | answer | sim |\n|---|---|---|---|\n", e.name, len(e.cases))
		for _, c := range e.cases {
			req := c.method + " " + c.path
			if body := c.body; body != "" {
				if len(body) > 120 {
					body = body[:60] + "…" + body[len(body)-40:]
				}
				req += " `" + body + "`"
			}
			if c.loading {
				req += " (loading)"
			}
			ans := strconv.Itoa(c.status)
			if c.contentType != "" {
				ans += " " + c.contentType
			}
			if len(c.shape) > 0 {
				ans += ": `" + strings.ReplaceAll(strings.Join(c.shape, "`, `"), "\n", `\n`) + "`"
			}
			sim := "same"
			if c.simDiffers != "" {
				sim = "differs: " + c.simDiffers
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", c.name, strings.ReplaceAll(req, "|", `\|`), strings.ReplaceAll(ans, "|", `\|`), sim)
		}
	}
	b.WriteString("\n")
	return b.String()
}
