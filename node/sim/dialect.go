package sim

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/gpuplane/gpuplane/internal/engines"
	"github.com/gpuplane/gpuplane/internal/ollamaname"
)

// Dialects: the engine a sim engine stands for (docs/engines.md, "Strict
// sim dialects"). DialectAny, the default, answers every engine's routes
// without their preconditions (benchmarks and the residency tests of old
// use it); the others answer only what that engine serves, refuse what it
// refuses, with its status codes and error shapes, at the versions
// docs/engines.md names.
const (
	DialectAny      = ""
	DialectVLLM     = engines.VLLM
	DialectLlamaCpp = engines.LlamaCpp
	DialectOllama   = engines.Ollama
	DialectSGLang   = engines.SGLang
)

// Dialects lists the values --dialect takes.
var Dialects = []string{DialectVLLM, DialectLlamaCpp, DialectOllama, DialectSGLang}

// llamaAutoSlots is what llama-server runs with when --parallel is not
// given (tools/server/server.cpp: "n_parallel is set to auto, using
// n_parallel = 4 and kv_unified = true").
const llamaAutoSlots = 4

// slots is the engine's slot count: --parallel, or llama-server's auto
// (4) in the llamacpp dialect, else 1.
func (c Config) slots() int {
	switch {
	case c.Parallel > 0:
		return c.Parallel
	case c.Dialect == DialectLlamaCpp:
		return llamaAutoSlots
	}
	return 1
}

// SlotContext is the context one llama.cpp slot holds, as llama-server
// splits --ctx-size: each of N explicit slots gets ctx/N, unless the KV
// cache is unified (--kv-unified, or the auto slot count) where every slot
// may use all of it. 0: unbounded (no --ctx-size).
func (c Config) SlotContext() int {
	if c.CtxSize <= 0 {
		return 0
	}
	if c.Parallel <= 0 || c.KVUnified {
		return c.CtxSize
	}
	return c.CtxSize / c.Parallel
}

// knowsModel says whether a request's model names this engine's base
// model: vLLM knows only its served names; Ollama its tags (the served
// name and those /api/create made); llama-server in single-model mode
// serves its model whatever the request names.
func (s *server) knowsModel(model string) bool {
	switch s.cfg.Dialect {
	case DialectLlamaCpp:
		return true
	case DialectOllama:
		return ollamaname.Same(model, s.cfg.ServedModelName) || s.created(model)
	}
	return model == "" || model == s.cfg.ServedModelName
}

// notFound answers a request for a model the engine does not have, in its
// engine's words and shape.
func (s *server) notFound(w http.ResponseWriter, model string) {
	switch s.cfg.Dialect {
	case DialectOllama:
		// server/routes.go answers 404 "model '%s' not found"; its OpenAI
		// middleware wraps it (openai.NewError: a 404 is a
		// not_found_error).
		writeJSON(w, http.StatusNotFound, map[string]any{"error": map[string]any{
			"message": fmt.Sprintf("model '%s' not found", model), "type": "not_found_error", "param": nil, "code": nil}})
	default:
		// vLLM's ErrorResponse for an unknown model.
		writeJSON(w, http.StatusNotFound, map[string]any{"error": map[string]any{
			"message": fmt.Sprintf("The model `%s` does not exist.", model), "type": "NotFoundError", "param": "model", "code": http.StatusNotFound}})
	}
}

// dialectRoutes adds the routes of the engine the dialect names, each
// under that engine's own preconditions.
func (s *server) dialectRoutes(mux *http.ServeMux) {
	switch s.cfg.Dialect {
	case DialectVLLM:
		mux.HandleFunc("GET /health", s.health)
		mux.HandleFunc("GET /metrics", s.metrics)
		// vllm/entrypoints/serve: the sleep routes and collective_rpc
		// are mounted only when VLLM_SERVER_DEV_MODE=1; elsewhere they
		// are FastAPI's 404 {"detail":"Not Found"}.
		if s.cfg.VLLMDevMode {
			mux.HandleFunc("POST /sleep", s.needSleepMode(s.vllmSleep))
			mux.HandleFunc("POST /wake_up", s.needSleepMode(s.vllmWake))
			mux.HandleFunc("GET /is_sleeping", s.vllmIsSleeping)
			mux.HandleFunc("POST /collective_rpc", s.vllmCollectiveRPC)
			mux.HandleFunc("POST /reset_prefix_cache", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
		}
		// The runtime LoRA routes exist only with
		// VLLM_ALLOW_RUNTIME_LORA_UPDATING.
		if s.cfg.VLLMRuntimeLoRA {
			mux.HandleFunc("POST /v1/load_lora_adapter", s.needLoRA(s.loadLoRA))
			mux.HandleFunc("POST /v1/unload_lora_adapter", s.needLoRA(s.unloadLoRA))
		}
	case DialectLlamaCpp:
		mux.HandleFunc("GET /health", s.health)
		mux.HandleFunc("GET /props", s.llamaProps)
		mux.HandleFunc("GET /slots", s.llamaSlots)
		mux.HandleFunc("GET /lora-adapters", s.llamaLoRAList)
		mux.HandleFunc("POST /lora-adapters", s.llamaLoRASet)
		mux.HandleFunc("GET /metrics", s.metrics)
		if s.cfg.LlamaRouter {
			mux.HandleFunc("GET /models", s.llamaModels)
			mux.HandleFunc("POST /models/load", s.llamaLoad)
			mux.HandleFunc("POST /models/unload", s.llamaUnload)
		}
	case DialectSGLang:
		s.sglangRoutes(mux)
	case DialectOllama:
		mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			fmt.Fprint(w, "Ollama is running")
		})
		mux.HandleFunc("GET /api/version", func(w http.ResponseWriter, _ *http.Request) {
			writeJSON(w, http.StatusOK, map[string]string{"version": OllamaVersion})
		})
		mux.HandleFunc("POST /api/generate", s.ollamaGenerate)
		mux.HandleFunc("POST /api/embed", s.ollamaEmbed)
		mux.HandleFunc("GET /api/ps", s.ollamaPS)
		mux.HandleFunc("/api/blobs/{digest}", s.ollamaBlob)
		mux.HandleFunc("POST /api/create", s.ollamaCreate)
	}
	mux.HandleFunc("GET /v1/models", s.models)
	mux.HandleFunc("POST /v1/completions", s.completions)
	mux.HandleFunc("POST /v1/chat/completions", s.chat)
	mux.HandleFunc("POST /v1/embeddings", s.embeddings)
	mux.HandleFunc("GET /sim/status", s.status)
	mux.HandleFunc("/", s.noRoute)
}

// noRoute answers a path the engine does not serve as that engine does:
// vLLM's FastAPI {"detail":"Not Found"}, llama-server's error handler
// (format_error_response "File Not Found", not_found_error), Ollama's gin
// router its default plain "404 page not found".
func (s *server) noRoute(w http.ResponseWriter, _ *http.Request) {
	switch s.cfg.Dialect {
	case DialectVLLM, DialectSGLang:
		// Both are FastAPI apps.
		writeJSON(w, http.StatusNotFound, map[string]string{"detail": "Not Found"})
	case DialectLlamaCpp:
		llamaError(w, http.StatusNotFound, "File Not Found", "not_found_error", nil)
	default:
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprint(w, "404 page not found")
	}
}

// OllamaVersion is the Ollama release the ollama dialect answers as.
const OllamaVersion = "0.33.0"

// needSleepMode refuses vLLM's sleep routes on an engine started without
// --enable-sleep-mode: vLLM's engine asserts "Sleep mode is not enabled in
// the model config", which its server answers 500.
func (s *server) needSleepMode(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !s.cfg.EnableSleepMode {
			writeJSON(w, http.StatusInternalServerError, map[string]any{"error": map[string]any{
				"message": "Sleep mode is not enabled in the model config", "type": "InternalServerError", "param": nil, "code": http.StatusInternalServerError}})
			return
		}
		h(w, r)
	}
}

// needLoRA refuses a runtime LoRA load on an engine started without
// --enable-lora: vLLM's engine has no LoRA manager to add it to.
func (s *server) needLoRA(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !s.cfg.EnableLoRA {
			writeJSON(w, http.StatusBadRequest, map[string]any{"error": map[string]any{
				"message": "LoRA is not enabled. Use --enable-lora to enable LoRA.", "type": "BadRequestError", "param": nil, "code": http.StatusBadRequest}})
			return
		}
		h(w, r)
	}
}

// llamaSlots is llama-server's GET /slots: one entry per slot, with its
// context and whether it is processing a request.
func (s *server) llamaSlots(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	busy := make(map[int]bool, len(s.busySlots))
	for id := range s.busySlots {
		busy[id] = true
	}
	s.mu.Unlock()
	out := make([]any, s.cfg.slots())
	for i := range out {
		out[i] = map[string]any{"id": i, "n_ctx": s.cfg.SlotContext(), "is_processing": busy[i]}
	}
	writeJSON(w, http.StatusOK, out)
}

// llamaWhileLoading answers every route of a llama.cpp engine still
// loading its model as llama-server does: 503 {"error":{"code":503,
// "message":"Loading model","type":"unavailable_error"}}.
func (s *server) llamaWhileLoading(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		loaded := s.loadedOnce
		s.mu.Unlock()
		if !loaded && r.URL.Path != "/sim/status" {
			llamaError(w, http.StatusServiceUnavailable, "Loading model", "unavailable_error", nil)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// llamaError answers in llama-server's error shape.
func llamaError(w http.ResponseWriter, code int, msg, typ string, extra map[string]any) {
	e := map[string]any{"code": code, "message": msg, "type": typ}
	for k, v := range extra {
		e[k] = v
	}
	writeJSON(w, code, map[string]any{"error": e})
}

// takeSlot picks the slot a llama.cpp request runs in: the one it names,
// else the lowest idle one. Callers hold s.mu; -1 when the named slot is
// busy or none is idle.
func (s *server) takeSlot(want int) int {
	if want >= 0 {
		if s.busySlots[want] {
			return -1
		}
		s.busySlots[want] = true
		return want
	}
	for i := range s.cfg.slots() {
		if !s.busySlots[i] {
			s.busySlots[i] = true
			return i
		}
	}
	return -1
}

// waitSlot waits, for a llama.cpp request, until its slot (or any, for
// want -1) is free and takes it, as llama-server defers a task until a
// slot is idle.
func (s *server) waitSlot(r *http.Request, want int) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if want < -1 {
		want = -1
	}
	if want >= 0 {
		// llama-server takes a slot id past the last modulo the slot
		// count (get_slot_by_id), and one below -1 as any.
		want %= s.cfg.slots()
	}
	for {
		{
			if id := s.takeSlot(want); id >= 0 {
				return id, nil
			}
		}
		s.slotWaiting++
		err := s.waitCtx(r.Context())
		s.slotWaiting--
		if err != nil {
			return -1, err
		}
	}
}

// metrics is GET /metrics in the engine's own series: vLLM's gauges of
// requests running and waiting (vllm/v1/metrics/loggers.py), or
// llama-server's requests processing and deferred, which it serves only
// with --metrics (else 501, as llama-server answers). Ollama has none.
func (s *server) metrics(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	running, waiting := s.st.inflight, s.st.waiting+s.slotWaiting
	s.mu.Unlock()
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	if s.cfg.Dialect == DialectLlamaCpp {
		if !s.cfg.LlamaMetrics {
			llamaError(w, http.StatusNotImplemented, "This server does not support metrics endpoint. Start it with `--metrics`", "not_supported_error", nil)
			return
		}
		// A request waiting for a slot has not been admitted: it counts
		// as deferred, not processing.
		fmt.Fprintf(w, "# HELP llamacpp:requests_processing Number of requests processing.\n# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing %d\n", running)
		fmt.Fprintf(w, "# HELP llamacpp:requests_deferred Number of requests deferred.\n# TYPE llamacpp:requests_deferred gauge\nllamacpp:requests_deferred %d\n", waiting)
		return
	}
	labels := fmt.Sprintf(`{engine="0",model_name=%q}`, s.cfg.ServedModelName)
	fmt.Fprintf(w, "# HELP vllm:num_requests_running Number of requests in model execution batches.\n# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running%s %d.0\n", labels, running)
	fmt.Fprintf(w, "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting%s %d.0\n", labels, waiting)
}

// freeSlot gives a slot back.
func (s *server) freeSlot(id int) {
	s.mu.Lock()
	delete(s.busySlots, id)
	s.cond.Broadcast()
	s.mu.Unlock()
}

// keepAliveDefault is how long Ollama keeps a model loaded after a request
// that names no keep_alive: OLLAMA_KEEP_ALIVE, else 5 minutes
// (envconfig/config.go).
func (c Config) keepAliveDefault() time.Duration {
	if c.OllamaKeepAlive != 0 {
		return c.OllamaKeepAlive
	}
	return 5 * time.Minute
}

// parseOllamaKeepAlive reads OLLAMA_KEEP_ALIVE as Ollama does: a duration,
// else a number of seconds; a negative value keeps models loaded for ever.
func ParseOllamaKeepAlive(v string) (time.Duration, error) {
	if v == "" {
		return 0, nil
	}
	d, err := parseKeepAlive(json.RawMessage(fmt.Sprintf("%q", v)))
	if err != nil {
		return 0, err
	}
	if d < 0 {
		return -1, nil
	}
	return d, nil
}
