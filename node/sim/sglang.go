package sim

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"
)

// SGLang, as the sglang dialect reproduces it (docs/engines.md, "Strict
// sim dialects"; read from python/sglang/srt/entrypoints/http_server.py,
// managers/io_struct.py, server_args.py, torch_memory_saver_adapter.py and
// metrics/collector.py):
//
//   - Memory. --mem-fraction-static is a fraction of the whole card: SGLang
//     sizes its weights and KV pool so that everything on the card, the
//     other processes' memory included, stays within it. The dialect, told
//     the card's memory (--card-mib), takes the fraction of the card less
//     what the other processes hold when it loads; a fraction the others
//     already fill fails the start, "Not enough memory. Please try to
//     increase --mem-fraction-static." Without the fraction it holds
//     --memory-mib.
//   - Sleep. GET or POST /release_memory_occupation and
//     /resume_memory_occupation ({"tags": null} for everything). Without
//     --enable-memory-saver SGLang's memory saver is a no-op: both answer
//     200 and nothing leaves the card. Without --enable-weights-cpu-backup
//     the weights' memory comes back empty: the dialect then refuses
//     requests (SGLang would answer from garbage), so that a driver that
//     forgot the flag shows.
//   - LoRA. POST /load_lora_adapter {"lora_name","lora_path"} and
//     /unload_lora_adapter {"lora_name"} answer {"success",
//     "error_message","loaded_adapters"}, 400 when success is false;
//     --enable-lora allocates --max-loras-per-batch slots at start, inside
//     the static memory (a load changes nothing on the card). /v1/models
//     lists adapters with their base as "parent".
//   - Health. /health answers 200 once serving; /health_generate runs one
//     token (503 while the memory is released).
//   - Metrics. /metrics serves sglang:num_running_reqs and
//     sglang:num_queue_reqs only with --enable-metrics (else it is not a
//     route: 404).

// errNotEnoughMemory is SGLang's error when the fraction leaves nothing
// for the KV pool (model_executor/model_runner.py).
//
//lint:ignore ST1005 SGLang's words, which clients match on
var errNotEnoughMemory = errors.New("Not enough memory. Please try to increase --mem-fraction-static.")

// errNoWeightsBackup refuses requests after a resume that found the
// weights' memory empty.
var errNoWeightsBackup = errors.New("has no weights: its memory was released without --enable-weights-cpu-backup, and the resume brought back empty memory")

// sglangSizeMiB is what the sglang dialect takes on a load: the fraction
// of the card less what the other processes hold on its fullest card; 0
// for another dialect or without a fraction (--memory-mib).
func (s *server) sglangSizeMiB() (uint64, error) {
	c := s.cfg
	if c.Dialect != DialectSGLang || c.MemFractionStatic <= 0 || c.CardMiB == 0 {
		return 0, nil
	}
	budget := uint64(c.MemFractionStatic * float64(c.CardMiB))
	var others uint64
	for _, n := range s.othersMiB() {
		others = max(others, n)
	}
	if budget <= others+c.OverheadMiB {
		return 0, fmt.Errorf("%w (--mem-fraction-static %g of %d MiB is %d MiB; the card's other processes hold %d MiB)",
			errNotEnoughMemory, c.MemFractionStatic, c.CardMiB, budget, others)
	}
	return budget - others, nil
}

func (s *server) sglangRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /health", s.health)
	mux.HandleFunc("GET /health_generate", s.sglangHealthGenerate)
	if s.cfg.EnableMetrics {
		mux.HandleFunc("GET /metrics", s.sglangMetrics)
	}
	for _, m := range []string{"GET", "POST"} {
		mux.HandleFunc(m+" /release_memory_occupation", s.sglangRelease)
		mux.HandleFunc(m+" /resume_memory_occupation", s.sglangResume)
	}
	mux.HandleFunc("POST /load_lora_adapter", s.sglangLoadLoRA)
	mux.HandleFunc("POST /unload_lora_adapter", s.sglangUnloadLoRA)
}

// sglangError is SGLang's _create_error_response shape.
func sglangError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, map[string]any{"object": "error", "message": msg, "type": http.StatusText(code), "param": nil, "code": code})
}

// sglangTags reads {"tags": [...]}: null or absent is every region; the
// only regions are weights and kv_cache.
func sglangTags(w http.ResponseWriter, r *http.Request) (weights, kv bool, err error) {
	var body struct {
		Tags []string `json:"tags"`
	}
	if r.Method == http.MethodPost && r.ContentLength != 0 {
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&body); err != nil {
			return false, false, fmt.Errorf("JSON decode error: %v", err)
		}
	}
	if len(body.Tags) == 0 {
		return true, true, nil
	}
	for _, t := range body.Tags {
		switch t {
		case "weights":
			weights = true
		case "kv_cache":
			kv = true
		default:
			return false, false, fmt.Errorf("unknown memory tag %q: want weights or kv_cache", t)
		}
	}
	return weights, kv, nil
}

// sglangRelease frees the weights and KV cache (level 1: the weights wait
// in host RAM when backed up). Without the memory saver it answers 200
// and frees nothing, as SGLang's no-op saver does.
func (s *server) sglangRelease(w http.ResponseWriter, r *http.Request) {
	if _, _, err := sglangTags(w, r); err != nil {
		sglangError(w, http.StatusBadRequest, err.Error())
		return
	}
	if !s.cfg.EnableMemorySaver {
		s.cfg.Logger.Warn("sim engine (sglang): release_memory_occupation without --enable-memory-saver frees nothing")
		w.WriteHeader(http.StatusOK)
		return
	}
	if err := s.sleep(r.Context(), 1, "abort", false); err != nil {
		sglangError(w, http.StatusBadRequest, err.Error())
		return
	}
	w.WriteHeader(http.StatusOK)
}

// sglangResume brings the released memory back; an engine that released
// nothing answers 200. Without the CPU backup the weights come back empty.
func (s *server) sglangResume(w http.ResponseWriter, r *http.Request) {
	weights, kv, err := sglangTags(w, r)
	if err != nil {
		sglangError(w, http.StatusBadRequest, err.Error())
		return
	}
	if !s.cfg.EnableMemorySaver {
		w.WriteHeader(http.StatusOK)
		return
	}
	s.mu.Lock()
	asleep := s.st.phase == phAsleep
	s.mu.Unlock()
	if err := s.wake(r.Context(), weights, kv); err != nil {
		sglangError(w, http.StatusBadRequest, err.Error())
		return
	}
	if asleep && weights && !s.cfg.WeightsCPUBackup {
		s.mu.Lock()
		s.st.stale = true
		s.mu.Unlock()
	}
	w.WriteHeader(http.StatusOK)
}

// sglangHealthGenerate is /health_generate: one token through the
// scheduler, which a released engine cannot run.
func (s *server) sglangHealthGenerate(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	ok := s.loadedOnce && s.st.phase == phAwake && !s.st.stale
	s.mu.Unlock()
	if !ok {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	w.WriteHeader(http.StatusOK)
}

// sglangMetrics is /metrics with SGLang's gauges of requests running and
// queued.
func (s *server) sglangMetrics(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	running, waiting := s.st.inflight, s.st.waiting
	s.mu.Unlock()
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	labels := fmt.Sprintf(`{model_name=%q}`, s.cfg.ServedModelName)
	fmt.Fprintf(w, "# HELP sglang:num_running_reqs The number of running requests.\n# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs%s %d.0\n", labels, running)
	fmt.Fprintf(w, "# HELP sglang:num_queue_reqs The number of requests in the waiting queue.\n# TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs%s %d.0\n", labels, waiting)
}

// sglangLoRAResult is SGLang's LoRAUpdateResult.
func (s *server) sglangLoRAResult(w http.ResponseWriter, err error) {
	code, msg := http.StatusOK, ""
	if err != nil {
		code, msg = http.StatusBadRequest, err.Error()
	}
	loaded := map[string]string{}
	s.mu.Lock()
	for name, a := range s.lora.loaded {
		if !a.loading {
			loaded[name] = a.path
		}
	}
	s.mu.Unlock()
	writeJSON(w, code, map[string]any{"success": err == nil, "error_message": msg, "loaded_adapters": loaded})
}

// sglangLoadLoRA is POST /load_lora_adapter: refused without --enable-lora
// and for a name SGLang already has.
func (s *server) sglangLoadLoRA(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Name string `json:"lora_name"`
		Path string `json:"lora_path"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&body); err != nil || body.Name == "" || body.Path == "" {
		sglangError(w, http.StatusBadRequest, "lora_name and lora_path are required")
		return
	}
	if !s.cfg.EnableLoRA {
		//lint:ignore ST1005 SGLang's words, which clients match on
		s.sglangLoRAResult(w, errors.New("LoRA is not enabled. Please set `--enable-lora` to enable LoRA."))
		return
	}
	s.mu.Lock()
	have := s.lora.loaded[body.Name] != nil
	s.mu.Unlock()
	if have {
		//lint:ignore ST1005 SGLang's words, which clients match on
		s.sglangLoRAResult(w, fmt.Errorf("Failed to load LoRA adapter %s: The LoRA adapter with name %s already exists.", body.Name, body.Name))
		return
	}
	took, err := s.loadAdapter(r.Context(), body.Name, body.Path)
	if err == nil {
		s.cfg.Logger.Info("sim engine loaded LoRA adapter", "adapter", body.Name, "took", took.Round(time.Millisecond))
	}
	s.sglangLoRAResult(w, err)
}

// sglangUnloadLoRA is POST /unload_lora_adapter: an adapter SGLang does
// not have fails.
func (s *server) sglangUnloadLoRA(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Name string `json:"lora_name"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&body); err != nil || body.Name == "" {
		sglangError(w, http.StatusBadRequest, "lora_name is required")
		return
	}
	s.mu.Lock()
	a := s.lora.loaded[body.Name]
	if a == nil || a.loading {
		s.mu.Unlock()
		//lint:ignore ST1005 SGLang's words, which clients match on
		s.sglangLoRAResult(w, fmt.Errorf("LoRA adapter %s is not loaded.", body.Name))
		return
	}
	for a.inflight > 0 {
		if err := s.waitCtx(r.Context()); err != nil {
			s.mu.Unlock()
			return
		}
	}
	if s.lora.loaded[body.Name] == a {
		delete(s.lora.loaded, body.Name)
	}
	s.mu.Unlock()
	s.report()
	s.sglangLoRAResult(w, nil)
}
