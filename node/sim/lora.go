package sim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// The sim's emulation of vLLM's runtime LoRA API (docs/features/lora.md,
// started with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True):
// POST /v1/load_lora_adapter {"lora_name","lora_path"} and POST
// /v1/unload_lora_adapter {"lora_name"}; a request selects an adapter by
// its name in "model", and /v1/models lists loaded adapters with their
// "parent". At most MaxLoRAs are loaded at once (vLLM's --max-loras); each
// holds rank × LoRAMiBPerRank of card memory, reported to the simulated
// NVML with the rest of the engine. Requests for different adapters share
// the engine's batch like any others.

// LoadDist is the distribution of adapter load times: a mixture of two
// log-normals (a fast mode and a slow one), every draw multiplied by Scale.
type LoadDist struct {
	// FastShare is the probability of a draw from the fast mode.
	FastShare  float64
	FastMedian time.Duration
	FastSigma  float64
	SlowMedian time.Duration
	SlowSigma  float64
	// Scale multiplies every draw (tests shrink loads with it); 0 means 1.
	Scale float64
	// Fixed, when positive, replaces the draw (times Scale).
	Fixed time.Duration
}

// DefaultLoRALoad is fitted to GenTD26's lora_update_latency_anon.csv
// (27,415 measured LoRA loads of a production diffusion service, in ms):
// the histogram has two modes, so the samples were split at 2,000 ms and a
// log-normal fitted to each side by the mean and standard deviation of the
// logarithms: 8.0 % of loads fall in the fast mode (median 1,045 ms, σ
// 0.264), the rest in the slow one (median 4,514 ms, σ 0.264). The data's
// own median is 4,378 ms, p5 1,131 ms, p95 6,767 ms, p99 8,214 ms.
var DefaultLoRALoad = LoadDist{
	FastShare:  0.080,
	FastMedian: 1045 * time.Millisecond,
	FastSigma:  0.264,
	SlowMedian: 4514 * time.Millisecond,
	SlowSigma:  0.264,
}

// Draw returns one load time.
func (d LoadDist) Draw(r *rand.Rand) time.Duration {
	scale := d.Scale
	if scale <= 0 {
		scale = 1
	}
	if d.Fixed > 0 {
		return time.Duration(float64(d.Fixed) * scale)
	}
	median, sigma := d.SlowMedian, d.SlowSigma
	if r.Float64() < d.FastShare {
		median, sigma = d.FastMedian, d.FastSigma
	}
	return time.Duration(float64(median) * math.Exp(sigma*r.NormFloat64()) * scale)
}

// Defaults of the LoRA emulation.
const (
	DefaultMaxLoRAs       = 4
	DefaultLoRARank       = 16
	DefaultLoRAMiBPerRank = 2
	// HostLoadFactor is the share of a drawn load time a reload of an
	// adapter the engine loaded before takes: its weights are still in
	// host RAM (vLLM's CPU LoRA cache), only the copy to the card remains.
	HostLoadFactor = 0.1
)

// adapter is one loaded LoRA adapter.
type adapter struct {
	path     string
	rank     int
	mib      uint64
	inflight int
	loading  bool
	// batched: its requests run in the batch, holding one of
	// --max-loras LoRA slots (vLLM dialect), until its last ends.
	batched bool
}

// loraState is the engine's adapters, guarded by server.mu.
type loraState struct {
	loaded map[string]*adapter
	// cached remembers the paths loaded before: reloading one is faster.
	cached map[string]bool
	rng    *rand.Rand
}

func (s *server) maxLoRAs() int {
	if s.cfg.MaxLoRAs > 0 {
		return s.cfg.MaxLoRAs
	}
	return DefaultMaxLoRAs
}

// loraMiB is what the loaded (and loading) adapters hold on the card.
// Callers hold s.mu.
func (s *server) loraMiB() uint64 {
	if s.cfg.vllmMemory() || s.cfg.Dialect == DialectSGLang {
		// vLLM's and SGLang's pools are inside their budgets from the
		// start.
		return 0
	}
	var n uint64
	for _, a := range s.lora.loaded {
		n += a.mib
	}
	return n
}

// adapterRank reads the rank ("r") from a PEFT adapter_config.json in the
// adapter's directory, as vLLM does; without one the sim assumes
// DefaultLoRARank (its adapters are usually made-up paths). A config that
// is there but unreadable fails the load, as it fails vLLM's.
func adapterRank(path string) (int, error) {
	data, err := os.ReadFile(filepath.Join(path, "adapter_config.json"))
	if errors.Is(err, fs.ErrNotExist) {
		return DefaultLoRARank, nil
	}
	if err != nil {
		return 0, err
	}
	var c struct {
		R int `json:"r"`
	}
	if err := json.Unmarshal(data, &c); err != nil {
		return 0, fmt.Errorf("%s: %w", filepath.Join(path, "adapter_config.json"), err)
	}
	if c.R <= 0 {
		return 0, fmt.Errorf("%s: r must be a positive rank, got %d", filepath.Join(path, "adapter_config.json"), c.R)
	}
	return c.R, nil
}

func (s *server) loraRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/load_lora_adapter", s.loadLoRA)
	mux.HandleFunc("POST /v1/unload_lora_adapter", s.unloadLoRA)
}

// loadLoRA answers when the adapter is loaded, 200 with a plain-text
// message as vLLM does; 400 for a name already loaded or no free slot.
func (s *server) loadLoRA(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Name string `json:"lora_name"`
		Path string `json:"lora_path"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&body); err != nil || body.Name == "" || body.Path == "" {
		apiError(w, http.StatusBadRequest, "Both 'lora_name' and 'lora_path' must be provided.", "invalid_request_error")
		return
	}
	took, err := s.loadAdapter(r.Context(), body.Name, body.Path)
	if err != nil {
		typ := "invalid_request_error"
		if s.cfg.Dialect == DialectVLLM {
			typ = "BadRequestError"
			if strings.Contains(err.Error(), "already been loaded") {
				typ = "InvalidUserInput"
			}
		}
		apiError(w, http.StatusBadRequest, err.Error(), typ)
		return
	}
	s.cfg.Logger.Info("sim engine loaded LoRA adapter", "adapter", body.Name, "took", took.Round(time.Millisecond))
	w.Header().Set("Content-Type", "text/plain")
	fmt.Fprintf(w, "Success: LoRA adapter '%s' added successfully.", body.Name)
}

// loadAdapter loads one adapter, taking a load time drawn from the
// configured distribution (a tenth of it for one loaded before).
func (s *server) loadAdapter(ctx context.Context, name, path string) (time.Duration, error) {
	rank, err := adapterRank(path)
	if err != nil {
		return 0, fmt.Errorf("cannot load LoRA adapter '%s': %w", name, err)
	}
	// An adapter without a config (a made-up path) is assumed to fit.
	if _, statErr := os.Stat(filepath.Join(path, "adapter_config.json")); statErr == nil &&
		s.cfg.Dialect == DialectVLLM && s.cfg.MaxLoRARank > 0 && rank > s.cfg.MaxLoRARank {
		//lint:ignore ST1005 vLLM's words, which clients match on
		return 0, fmt.Errorf("LoRA rank %d is greater than max_lora_rank %d.", rank, s.cfg.MaxLoRARank)
	}
	perRank := s.cfg.LoRAMiBPerRank
	if perRank == 0 {
		perRank = DefaultLoRAMiBPerRank
	}
	s.mu.Lock()
	switch {
	case name == s.cfg.ServedModelName:
		s.mu.Unlock()
		return 0, fmt.Errorf("the LoRA adapter name '%s' is the base model's name", name)
	case s.lora.loaded[name] != nil:
		s.mu.Unlock()
		// vLLM's words (serving_models.py), which clients match on.
		//lint:ignore ST1005 vLLM's words, which clients match on
		return 0, fmt.Errorf("The lora adapter '%s' has already been loaded.", name)
	case s.st.phase != phAwake:
		ph := s.st.phase
		s.mu.Unlock()
		return 0, fmt.Errorf("cannot load LoRA adapter '%s' while the engine is %s", name, ph)
	case s.cfg.Dialect != DialectVLLM && len(s.lora.loaded) >= s.maxLoRAs():
		// vLLM registers any number (its --max-loras bounds a batch,
		// waitLoRASlot); the other dialects keep the sim's old bound.
		n := len(s.lora.loaded)
		s.mu.Unlock()
		return 0, fmt.Errorf("cannot load LoRA adapter '%s': %d of --max-loras %d are loaded; unload one first", name, n, s.maxLoRAs())
	}
	took := s.cfg.LoRALoad.Draw(s.lora.rng)
	if s.lora.cached[path] {
		took = time.Duration(float64(took) * HostLoadFactor)
	}
	a := &adapter{path: path, rank: rank, mib: uint64(rank) * perRank, loading: true}
	s.lora.loaded[name] = a
	s.mu.Unlock()
	s.report()
	err = sleepFor(ctx, took)
	s.mu.Lock()
	if err != nil || s.lora.loaded[name] != a {
		if s.lora.loaded[name] == a {
			delete(s.lora.loaded, name)
		}
		s.mu.Unlock()
		s.report()
		if err == nil {
			err = fmt.Errorf("LoRA adapter '%s' was dropped while loading", name)
		}
		return 0, err
	}
	a.loading = false
	s.lora.cached[path] = true
	s.mu.Unlock()
	s.report()
	return took, nil
}

// unloadLoRA removes an adapter once the requests using it are done; 404
// for one not loaded, as vLLM answers.
func (s *server) unloadLoRA(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Name string `json:"lora_name"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&body); err != nil || body.Name == "" {
		apiError(w, http.StatusBadRequest, "'lora_name' must be provided.", "invalid_request_error")
		return
	}
	s.mu.Lock()
	a := s.lora.loaded[body.Name]
	if a == nil || a.loading {
		s.mu.Unlock()
		apiError(w, http.StatusNotFound, fmt.Sprintf("The lora adapter '%s' cannot be found.", body.Name), "NotFoundError")
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
	s.cfg.Logger.Info("sim engine unloaded LoRA adapter", "adapter", body.Name)
	w.Header().Set("Content-Type", "text/plain")
	fmt.Fprintf(w, "Success: LoRA adapter '%s' removed successfully.", body.Name)
}

// dropAdapters empties the card of adapters (a sleep or an unload of the
// engine): their weights stay cached in host RAM. Callers hold s.mu.
func (s *server) dropAdapters() {
	clear(s.lora.loaded)
}

// sleepAdapters is what a sleep does to the adapters: vLLM keeps them
// registered (its API server's list outlives the engine's sleep, so a
// second load of one answers 400 "has already been loaded"); their card
// memory goes with the weights' (footprintMiB counts them only awake).
// The any dialect drops them, as the sim always did. Callers hold s.mu.
func (s *server) sleepAdapters() {
	if s.cfg.Dialect != DialectVLLM && s.cfg.Dialect != DialectSGLang {
		s.dropAdapters()
	}
}

// waitLoRASlot waits until adapter name may join the batch: at most
// --max-loras adapters run at once (vLLM's scheduler keeps a request for
// another waiting). The request already counts in its adapter's inflight
// (useAdapter); false when its client went away. Callers do not hold s.mu.
func (s *server) waitLoRASlot(ctx context.Context, name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		a := s.lora.loaded[name]
		if a == nil {
			return false
		}
		active := 0
		for n, o := range s.lora.loaded {
			if n != name && o.batched {
				active++
			}
		}
		if a.batched || active < s.maxLoRAs() {
			a.batched = true
			return true
		}
		if s.waitCtx(ctx) != nil {
			a.inflight--
			s.cond.Broadcast()
			return false
		}
	}
}

// useAdapter marks a request for adapter name; ok is false when no such
// adapter is loaded. Callers hold s.mu.
func (s *server) useAdapter(name string) bool {
	a := s.lora.loaded[name]
	if a == nil || a.loading {
		return false
	}
	a.inflight++
	return true
}

// doneAdapter ends a request's use of adapter name. Callers hold s.mu.
func (s *server) doneAdapter(name string) {
	if a := s.lora.loaded[name]; a != nil && a.inflight > 0 {
		a.inflight--
		if a.inflight == 0 {
			a.batched = false
		}
	}
}

// loadedAdapters lists the adapters being served, sorted.
func (s *server) loadedAdapters() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for name, a := range s.lora.loaded {
		if !a.loading {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}
