package sim

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gpuplane/gpuplane/internal/ollamaname"
)

// controlRoutes adds the residency controls of the engines the sim stands
// for. They do not collide, so one sim engine answers all of them.
func (s *server) controlRoutes(mux *http.ServeMux) {
	// vLLM's development-mode endpoints (vllm/entrypoints/serve/sleep/api_router.py).
	mux.HandleFunc("POST /sleep", s.vllmSleep)
	mux.HandleFunc("POST /wake_up", s.vllmWake)
	mux.HandleFunc("GET /is_sleeping", s.vllmIsSleeping)
	mux.HandleFunc("POST /collective_rpc", s.vllmCollectiveRPC)
	mux.HandleFunc("POST /reset_prefix_cache", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	// llama.cpp's llama-server: router mode and sleeping (tools/server/README.md).
	mux.HandleFunc("GET /models", s.llamaModels)
	mux.HandleFunc("POST /models/load", s.llamaLoad)
	mux.HandleFunc("POST /models/unload", s.llamaUnload)
	mux.HandleFunc("GET /props", s.llamaProps)
	// Ollama (docs/api.md): keep_alive load and unload, running models.
	mux.HandleFunc("POST /api/generate", s.ollamaGenerate)
	mux.HandleFunc("POST /api/embed", s.ollamaEmbed)
	mux.HandleFunc("GET /api/ps", s.ollamaPS)
	// The sim's own view, for tests and people: state, memory, shares and
	// how long the last load and wake took.
	mux.HandleFunc("GET /sim/status", s.status)
	// vLLM's request gauges (no dialect: vLLM's series).
	mux.HandleFunc("GET /metrics", s.metrics)
}

// vllmSleep is POST /sleep?level=1|2[&mode=abort|wait]: 200 with an empty
// body once asleep, as vLLM answers. vLLM answers a bad level with a 500;
// the sim says what is wrong with a 400.
func (s *server) vllmSleep(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	level := 1
	if v := q.Get("level"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || (n != 1 && n != 2) {
			http.Error(w, fmt.Sprintf("level %q: want 1 (weights to host RAM) or 2 (weights discarded)", v), http.StatusBadRequest)
			return
		}
		level = n
	}
	mode := q.Get("mode")
	switch mode {
	case "":
		mode = "abort"
	case "abort", "wait":
	default:
		http.Error(w, fmt.Sprintf("mode %q: the sim engine supports abort (the default) and wait", mode), http.StatusBadRequest)
		return
	}
	if err := s.sleep(r.Context(), level, mode, false); err != nil {
		code := http.StatusConflict
		if s.cfg.vllmMemory() && s.asleep() {
			// vLLM's assertion after the offload: the engine sleeps,
			// the request fails.
			code = http.StatusInternalServerError
		}
		http.Error(w, err.Error(), code)
		return
	}
	w.WriteHeader(http.StatusOK)
}

// vllmWake is POST /wake_up[?tags=weights&tags=kv_cache]: no tags wakes
// everything. It answers 200 with an empty body once woken, as vLLM does.
func (s *server) vllmWake(w http.ResponseWriter, r *http.Request) {
	tags := r.URL.Query()["tags"]
	weights, kv := len(tags) == 0, len(tags) == 0
	for _, t := range tags {
		switch t {
		case "weights":
			weights = true
		case "kv_cache":
			kv = true
		default:
			http.Error(w, fmt.Sprintf("tag %q: want weights or kv_cache", t), http.StatusBadRequest)
			return
		}
	}
	if err := s.wake(r.Context(), weights, kv); err != nil {
		http.Error(w, err.Error(), http.StatusConflict)
		return
	}
	w.WriteHeader(http.StatusOK)
}

func (s *server) vllmIsSleeping(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	sleeping := s.st.isSleeping()
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]bool{"is_sleeping": sleeping})
}

// vllmCollectiveRPC answers the one call a level-2 wake makes,
// reload_weights. The sim's wake already paid the reload, so it only
// checks that the weights are on the card.
func (s *server) vllmCollectiveRPC(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Method string `json:"method"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&body); err != nil {
		http.Error(w, "JSON decode error: "+err.Error(), http.StatusBadRequest)
		return
	}
	if body.Method != "reload_weights" {
		http.Error(w, fmt.Sprintf("method %q: the sim engine only answers reload_weights", body.Method), http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	on := s.st.weightsOn
	s.mu.Unlock()
	if !on {
		http.Error(w, "reload_weights: the weights are not on the card; POST /wake_up?tags=weights first", http.StatusConflict)
		return
	}
	if s.cfg.Dialect == DialectVLLM {
		// vLLM reads the weights from disk again, whether or not a
		// level-2 sleep discarded them.
		s.ctl.Lock()
		err := s.copyWeights(r.Context(), s.cfg.LoadTime.Seconds())
		if err == nil {
			s.mu.Lock()
			s.st.stale = false
			s.st.reloads++
			s.mu.Unlock()
		}
		s.ctl.Unlock()
		if err != nil {
			http.Error(w, "reload_weights: "+err.Error(), http.StatusInternalServerError)
			return
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"results": []any{nil}})
}

// llamaStatus is the model's status as llama.cpp's router lists it.
func (s *server) llamaStatus() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch s.st.phase {
	case phAwake:
		return "loaded"
	case phAsleep:
		return "sleeping"
	case phUnloaded:
		return "unloaded"
	}
	return "loading"
}

func (s *server) llamaModels(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"data": []any{map[string]any{
		"id": s.cfg.ServedModelName, "object": "model", "status": map[string]any{"value": s.llamaStatus()},
	}}})
}

// llamaModel reads the {"model": NAME} body of the router's load and
// unload, answering an error for another model.
func (s *server) llamaModel(w http.ResponseWriter, r *http.Request) bool {
	var body struct {
		Model string `json:"model"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&body); err != nil {
		apiError(w, http.StatusBadRequest, "invalid request body: "+err.Error(), "invalid_request_error")
		return false
	}
	if body.Model != s.cfg.ServedModelName {
		apiError(w, http.StatusBadRequest, fmt.Sprintf("model %q not found; this server has %q", body.Model, s.cfg.ServedModelName), "invalid_request_error")
		return false
	}
	return true
}

// llamaLoad starts a load and answers at once, as the router does; GET
// /models shows "loading", then "loaded".
func (s *server) llamaLoad(w http.ResponseWriter, r *http.Request) {
	if !s.llamaModel(w, r) {
		return
	}
	go func() {
		if err := s.ensureLoaded(s.life); err != nil {
			s.cfg.Logger.Warn("load", "err", err)
		}
	}()
	writeJSON(w, http.StatusOK, map[string]bool{"success": true})
}

// llamaUnload unloads the model: the router stops the model's process,
// cutting off its requests.
func (s *server) llamaUnload(w http.ResponseWriter, r *http.Request) {
	if !s.llamaModel(w, r) {
		return
	}
	s.unload(r.Context(), true)
	writeJSON(w, http.StatusOK, map[string]bool{"success": true})
}

func (s *server) llamaProps(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	sleeping := s.st.isSleeping()
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{
		"model_alias": s.cfg.ServedModelName, "total_slots": s.cfg.slots(), "is_sleeping": sleeping,
		"default_generation_settings": map[string]any{"n_ctx": s.cfg.SlotContext()},
	})
}

// ollamaGenerate answers Ollama's load and unload requests: an empty
// prompt loads the model (and holds it for keep_alive), an empty prompt
// with keep_alive 0 unloads it. Generation goes through /v1.
func (s *server) ollamaGenerate(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Model     string          `json:"model"`
		Prompt    string          `json:"prompt"`
		KeepAlive json.RawMessage `json:"keep_alive"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&body); err != nil {
		ollamaError(w, http.StatusBadRequest, "invalid request body: "+err.Error())
		return
	}
	if body.Model != s.cfg.ServedModelName && (s.cfg.Dialect != DialectOllama || !s.knowsModel(body.Model)) {
		ollamaError(w, http.StatusNotFound, fmt.Sprintf("model '%s' not found", body.Model))
		return
	}
	unload := false
	if len(body.KeepAlive) > 0 {
		d, err := parseKeepAlive(body.KeepAlive)
		unload = err == nil && d == 0
	}
	if s.cfg.Dialect == DialectOllama && s.cfg.Runner == RunnerPooling && !unload {
		// Ollama unloads any model, but generates (and so loads through
		// /api/generate) only with one that can complete.
		ollamaError(w, http.StatusBadRequest, fmt.Sprintf("%q does not support generate", body.Model))
		return
	}
	if body.Prompt != "" {
		ollamaError(w, http.StatusBadRequest, "the sim engine answers /api/generate only to load or unload (an empty prompt); generate through /v1/completions")
		return
	}
	keep := time.Duration(-1)
	if s.cfg.Dialect == DialectOllama {
		keep = s.cfg.keepAliveDefault()
	}
	if len(body.KeepAlive) > 0 {
		d, err := parseKeepAlive(body.KeepAlive)
		if err != nil {
			ollamaError(w, http.StatusBadRequest, err.Error())
			return
		}
		keep = d
	}
	reason := "load"
	if keep == 0 {
		s.unload(r.Context(), true)
		reason = "unload"
	} else {
		s.mu.Lock()
		s.st.keepAlive = keep
		s.mu.Unlock()
		if err := s.ensureLoaded(s.life); err != nil {
			ollamaError(w, http.StatusInternalServerError, err.Error())
			return
		}
		s.noteLoaded(body.Model)
		s.mu.Lock()
		s.armExpiry()
		s.mu.Unlock()
	}
	// Ollama answers with the name the request gave.
	writeJSON(w, http.StatusOK, map[string]any{
		"model": body.Model, "created_at": time.Now().UTC().Format(time.RFC3339Nano),
		"response": "", "done": true, "done_reason": reason,
	})
}

// ollamaEmbed answers Ollama's /api/embed: it loads the model whatever it
// can do (server/routes.go EmbedHandler schedules the runner without
// asking for a capability), answers no embeddings without input, and one
// vector per input otherwise.
func (s *server) ollamaEmbed(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Model     string          `json:"model"`
		Input     json.RawMessage `json:"input"`
		KeepAlive json.RawMessage `json:"keep_alive"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4<<20)).Decode(&body); err != nil {
		ollamaError(w, http.StatusBadRequest, err.Error())
		return
	}
	var inputs []string
	if len(body.Input) > 0 && string(body.Input) != "null" {
		var one string
		if err := json.Unmarshal(body.Input, &one); err == nil {
			if one != "" {
				inputs = []string{one}
			}
		} else if err := json.Unmarshal(body.Input, &inputs); err != nil {
			ollamaError(w, http.StatusBadRequest, "invalid input type")
			return
		}
	}
	if !s.knowsModel(body.Model) {
		ollamaError(w, http.StatusNotFound, fmt.Sprintf("model '%s' not found", body.Model))
		return
	}
	keep := s.cfg.keepAliveDefault()
	if len(body.KeepAlive) > 0 {
		d, err := parseKeepAlive(body.KeepAlive)
		if err != nil {
			ollamaError(w, http.StatusBadRequest, err.Error())
			return
		}
		keep = d
	}
	s.mu.Lock()
	s.st.keepAlive = keep
	s.mu.Unlock()
	if err := s.ensureLoaded(s.life); err != nil {
		ollamaError(w, http.StatusInternalServerError, err.Error())
		return
	}
	s.noteLoaded(body.Model)
	s.mu.Lock()
	s.armExpiry()
	s.mu.Unlock()
	vectors := make([][]float64, len(inputs))
	tokens := 0
	for i, in := range inputs {
		vectors[i] = embed(in)
		tokens += len(strings.Fields(in))
	}
	resp := map[string]any{"model": body.Model, "embeddings": vectors}
	if len(inputs) > 0 {
		resp["prompt_eval_count"] = tokens
	}
	writeJSON(w, http.StatusOK, resp)
}

// parseKeepAlive reads Ollama's keep_alive: a duration string ("5m",
// "-1s"), or a number of seconds; negative keeps the model loaded forever.
func parseKeepAlive(raw json.RawMessage) (time.Duration, error) {
	var n float64
	if err := json.Unmarshal(raw, &n); err == nil {
		return time.Duration(n * float64(time.Second)), nil
	}
	var str string
	if err := json.Unmarshal(raw, &str); err == nil {
		if d, err := time.ParseDuration(str); err == nil {
			return d, nil
		}
		if f, err := strconv.ParseFloat(str, 64); err == nil {
			return time.Duration(f * float64(time.Second)), nil
		}
	}
	return 0, fmt.Errorf("keep_alive %s: want a duration such as \"5m\" or a number of seconds", raw)
}

func (s *server) ollamaPS(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	models := []any{}
	if s.st.phase == phAwake {
		size := int64(s.footprintMiB()) << 20
		expires := "0001-01-01T00:00:00Z"
		if !s.st.expire.IsZero() {
			expires = s.st.expire.UTC().Format(time.RFC3339Nano)
		}
		name := s.cfg.ServedModelName
		if s.cfg.Dialect == DialectOllama {
			name = ollamaname.Shortest(s.psName())
		}
		models = append(models, map[string]any{
			"name": name, "model": name,
			"size": size, "size_vram": size, "expires_at": expires,
		})
	}
	writeJSON(w, http.StatusOK, map[string]any{"models": models})
}

func ollamaError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, map[string]string{"error": msg})
}

// Status is what GET /sim/status answers.
type Status struct {
	State     string `json:"state"`
	Level     int    `json:"level,omitempty"`
	MemoryMiB uint64 `json:"memory_mib"`
	HostMiB   uint64 `json:"host_mib"`
	KVTokens  int    `json:"kv_tokens"`
	InFlight  int    `json:"in_flight"`
	Waiting   int    `json:"waiting"`
	// Preempted counts the requests paused for one of higher priority
	// (--scheduling-policy priority).
	Preempted     int     `json:"preempted"`
	ComputeShare  float64 `json:"compute_share"`
	CopyShare     float64 `json:"copy_share"`
	LastLoadSecs  float64 `json:"last_load_seconds"`
	LastWakeSecs  float64 `json:"last_wake_seconds"`
	TokensPerSecs float64 `json:"tokens_per_second"`
	// PrefixCacheTokens is what the prefix cache holds, in tokens;
	// PrefillTokens counts the prompt tokens computed since the start,
	// those the cache did not hold.
	PrefixCacheTokens int   `json:"prefix_cache_tokens"`
	PrefillTokens     int64 `json:"prefill_tokens"`
	// Adapters are the LoRA adapters loaded (or loading) on the card.
	Adapters []string `json:"adapters,omitempty"`
	// WeightReloads counts vLLM's reload_weights (vllm dialect): reads
	// of the weights from disk by a running engine.
	WeightReloads int `json:"weight_reloads"`
	// LoRAApplied counts the requests run with each llama.cpp --lora
	// adapter (by path) at a non-zero scale (llamacpp dialect).
	LoRAApplied map[string]int `json:"lora_applied,omitempty"`
}

func (s *server) status(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, s.snapshot())
}

func (s *server) snapshot() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := &s.st
	batch := 1 + s.cfg.BatchSlowdown*float64(max(st.inflight-1, 0))
	return Status{
		State: string(st.phase), Level: st.level, MemoryMiB: s.footprintMiB(), HostMiB: s.hostMiB(),
		KVTokens: st.tokens, InFlight: st.inflight, Waiting: st.waiting, Preempted: s.preempted, ComputeShare: st.computeFrac, CopyShare: st.copyFrac,
		LastLoadSecs: st.lastLoad.Seconds(), LastWakeSecs: st.lastWake.Seconds(),
		TokensPerSecs:     s.cfg.TokensPerSecond * st.computeFrac / batch,
		PrefixCacheTokens: s.cache.tokens(),
		PrefillTokens:     s.prefilled.Load(),
		Adapters:          slices.Sorted(maps.Keys(s.lora.loaded)),
		WeightReloads:     st.reloads,
		LoRAApplied:       maps.Clone(s.llamaLoRA.applied),
	}
}
