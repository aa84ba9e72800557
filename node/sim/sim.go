// Package sim is the built-in simulated inference engine that
// `gpuplane engine sim` runs (docs/engines.md): a real process serving an
// OpenAI-compatible API (/v1/models, /v1/completions, /v1/chat/completions
// with SSE streaming, /health) and the residency controls of the engines it
// stands for: vLLM's sleep mode (/sleep, /wake_up, /is_sleeping,
// /collective_rpc), llama.cpp's router (/models, /models/load,
// /models/unload, /props, --sleep-idle-seconds) and Ollama's keep_alive
// (/api/generate, /api/ps) and model store (/api/blobs, /api/create).
//
// It models a start as separate phases (process start before the port
// opens, runtime initialisation, weight load), memory as overhead + weights
// + a KV cache that grows with the tokens in flight (a request whose prompt
// does not fit in the pool waits, as continuous batching does), and sleep
// as a residual. It reports that memory through the simulated NVML
// (inventory.SimUsage), so the node's watchdog sees it as it would see a
// real engine on a real card.
//
// Sim engines on one simulated card are separate processes that share the
// card: each publishes a record (busy, copying, compute share) next to its
// memory, and reads its neighbours' every tick. Busy engines split the
// card's compute in proportion to their compute shares; weight copies
// (loads, wakes) split its copy bandwidth equally. So busy neighbours slow
// each other and concurrent loads take longer, as on a real card.
//
// A prefix cache keyed by the request's cache_salt (prefix.go) saves the
// prefill of the prompt blocks it holds and reports them in
// usage.prompt_tokens_details.cached_tokens, so tenant isolation (docs/gateway.md)
// is observable: a tenant never hits another's prompt.
//
// It holds no model: replies are generated words. It must never pretend to
// be healthy before its load time has passed.
package sim

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpuplane/gpuplane/node/inventory"
)

// Config is what `gpuplane engine sim` accepts.
type Config struct {
	Host            string
	Port            int
	ServedModelName string
	// StartTime passes before the port opens (interpreter and library
	// start-up); InitTime is runtime initialisation after it opens, with
	// the overhead already on the card; LoadTime is the weight load at the
	// card's full copy bandwidth. /health answers 503 until all three have
	// passed.
	StartTime, InitTime, LoadTime time.Duration
	// WakeTime copies the weights back from host RAM after a level-1 sleep
	// at full copy bandwidth; a level-2 wake reloads them (LoadTime).
	WakeTime time.Duration
	// MemoryMiB is the engine's peak on each card: OverheadMiB (the CUDA
	// context) + the weights + KVPoolMiB. Awake and idle it holds all but
	// the KV pool; KV grows by KVKiBPerToken per token in flight (prompt
	// and generated), up to the pool.
	MemoryMiB     uint64
	OverheadMiB   uint64
	KVPoolMiB     uint64
	KVKiBPerToken uint64
	// ResidualMiB stays on each card while asleep.
	ResidualMiB uint64
	// OvershootMiB is held above MemoryMiB while awake: the vllm
	// dialect's CUDA graphs, NCCL and allocator memory outside vLLM's
	// budget (vllmmemory.go). CardMiB is the card's memory, for vLLM's
	// messages.
	OvershootMiB, CardMiB uint64
	// HardLimitMiB is the memory limit a hard-limit layer (MPS, HAMi-core)
	// puts on the engine per card, which CUDA reports to it as the card
	// (ollamamemory.go); 0: none.
	HardLimitMiB uint64
	// TokensPerSecond paces each stream when the engine has the card to
	// itself; 0 means no delay.
	TokensPerSecond float64
	// PrefillTokensPerSecond paces a prompt's prefill, of the tokens the
	// prefix cache does not hold, before the first token; 0 means no
	// delay.
	PrefillTokensPerSecond float64
	// ComputePercent is the engine's compute share of its cards, the weight
	// by which busy engines on a card split its compute; 0 counts as 100.
	ComputePercent uint32
	// SchedulingPolicy is vLLM's --scheduling-policy: "fcfs" (default) or
	// "priority". As vLLM, a request with a non-zero `priority` is refused
	// unless it is "priority"; under "priority" the batch is ordered by it
	// (lower first, then arrival) and a request of higher priority than a
	// running one pauses that one when the batch is full (admit).
	SchedulingPolicy string
	// Runner is vLLM's --runner: RunnerGenerate refuses embeddings,
	// RunnerPooling completions and chat, as vLLM does for a generative
	// or a pooling model; "" or "auto" (the sim has no architecture to
	// read) answers both.
	Runner string
	// Parallel is llama.cpp's --parallel: the slots a request's `id_slot`
	// may name; 0 is 1, or llama-server's auto (4 slots over a unified KV
	// cache) in the llamacpp dialect.
	Parallel int
	// Dialect is the engine the sim stands for (dialect.go): DialectAny
	// (every engine's routes, none of their preconditions), or vllm,
	// llamacpp or ollama, which answer and refuse as that engine does.
	Dialect string
	// vLLM dialect: VLLMDevMode is VLLM_SERVER_DEV_MODE=1 (the sleep
	// routes exist), VLLMRuntimeLoRA VLLM_ALLOW_RUNTIME_LORA_UPDATING (the
	// LoRA routes exist), EnableSleepMode --enable-sleep-mode, EnableLoRA
	// --enable-lora, PromptTokensDetails --enable-prompt-tokens-details
	// (usage reports cached_tokens).
	VLLMDevMode, VLLMRuntimeLoRA, EnableSleepMode, EnableLoRA, PromptTokensDetails bool
	// SGLang dialect (sglang.go): MemFractionStatic is
	// --mem-fraction-static (0: --memory-mib), EnableMemorySaver
	// --enable-memory-saver, WeightsCPUBackup --enable-weights-cpu-backup,
	// EnableMetrics --enable-metrics (EnableLoRA is --enable-lora and
	// MaxLoRAs --max-loras-per-batch).
	MemFractionStatic                                  float64
	EnableMemorySaver, WeightsCPUBackup, EnableMetrics bool
	// MaxLoRARank is vLLM's --max-lora-rank: a load of an adapter of a
	// larger rank fails (0: any).
	MaxLoRARank int
	// CacheRAMMiB is llama-server's --cache-ram (llamacpp dialect): the
	// host-RAM prompt cache's limit in MiB (hostcache.go); 0 turns it
	// off, -1 sets no limit. The command's default is llama-server's,
	// DefaultCacheRAMMiB.
	CacheRAMMiB int
	// llama.cpp dialect: CtxSize is --ctx-size (0: unbounded), KVUnified
	// --kv-unified, LlamaRouter a llama-server started without -m (the
	// router's /models routes exist).
	CtxSize     int
	KVUnified   bool
	LlamaRouter bool
	// LlamaLoRA are llama-server's --lora files, adapter ids 0.. in
	// order; LlamaLoRAInitWithoutApply is --lora-init-without-apply,
	// accepted and, as in llama-server, changing nothing a request sees
	// (llamalora.go).
	LlamaLoRA                 []string
	LlamaLoRAInitWithoutApply bool
	// LlamaMetrics is llama-server's --metrics: /metrics exists.
	LlamaMetrics bool
	// OllamaKeepAlive is OLLAMA_KEEP_ALIVE (0: Ollama's 5 minutes;
	// negative: for ever).
	OllamaKeepAlive time.Duration
	// BatchSlowdown is α in a stream's speed r/(1+α(C−1)) with C requests in
	// flight: continuous batching shares the engine's own step.
	BatchSlowdown float64
	// MaxNumSeqs is vLLM's --max-num-seqs: at most that many requests run
	// at once, the rest wait (1 turns continuous batching off); 0: no
	// bound but the KV pool.
	MaxNumSeqs int
	// SleepIdle, when positive, puts the engine to sleep after that long
	// without requests, as llama.cpp's --sleep-idle-seconds; the next
	// request wakes it.
	SleepIdle time.Duration
	CardUUIDs []string
	// MaxLoRAs is how many LoRA adapters may be loaded at once (vLLM's
	// --max-loras; 0: DefaultMaxLoRAs); each holds rank × LoRAMiBPerRank
	// (0: DefaultLoRAMiBPerRank) and takes a load time drawn from LoRALoad
	// (lora.go).
	MaxLoRAs       int
	LoRAMiBPerRank uint64
	LoRALoad       LoadDist
	// Usage records the memory for the simulated NVML; nil registers nothing.
	Usage  *inventory.SimUsage
	Logger *slog.Logger
	// Ready, when set, receives the listening address once the port is open.
	Ready func(addr net.Addr)
}

// The runners Config.Runner names.
const (
	RunnerGenerate = "generate"
	RunnerPooling  = "pooling"
)

// Validate checks the memory arithmetic, naming the flags.
func (c Config) Validate() error {
	if c.ServedModelName == "" {
		return errors.New("sim engine: --served-model-name is required")
	}
	var errs []error
	if c.OverheadMiB+c.KVPoolMiB > c.MemoryMiB {
		errs = append(errs, fmt.Errorf("--overhead-mib (%d) + --kv-pool-mib (%d) must not exceed --memory-mib (%d)", c.OverheadMiB, c.KVPoolMiB, c.MemoryMiB))
	}
	if c.ResidualMiB > c.MemoryMiB {
		errs = append(errs, fmt.Errorf("--sleep-residual-mib (%d) must not exceed --memory-mib (%d)", c.ResidualMiB, c.MemoryMiB))
	}
	if pool := c.loraPoolMiB(); c.vllmMemory() && pool > 0 && c.OverheadMiB+c.KVPoolMiB+pool > c.MemoryMiB {
		errs = append(errs, fmt.Errorf("the LoRA pool (--max-loras × --max-lora-rank × --lora-mib-per-rank = %d MiB) does not fit in --memory-mib (%d) beside --overhead-mib (%d) and --kv-pool-mib (%d)", pool, c.MemoryMiB, c.OverheadMiB, c.KVPoolMiB))
	}
	if c.KVKiBPerToken > 0 && c.KVPoolMiB == 0 {
		errs = append(errs, errors.New("--kv-kib-per-token needs a --kv-pool-mib to grow into"))
	}
	if c.MaxNumSeqs < 0 {
		errs = append(errs, fmt.Errorf("--max-num-seqs (%d) must not be negative", c.MaxNumSeqs))
	}
	if c.Parallel < 0 {
		errs = append(errs, fmt.Errorf("--parallel (%d) must not be negative", c.Parallel))
	}
	if c.Dialect != DialectAny && !slices.Contains(Dialects, c.Dialect) {
		errs = append(errs, fmt.Errorf("--dialect %q: want one of %s (or none: every engine's API)", c.Dialect, strings.Join(Dialects, ", ")))
	}
	if c.CacheRAMMiB < -1 {
		errs = append(errs, fmt.Errorf("--cache-ram (%d) must be a size in MiB, 0 (off) or -1 (no limit)", c.CacheRAMMiB))
	}
	if c.CtxSize < 0 {
		errs = append(errs, fmt.Errorf("--ctx-size (%d) must not be negative", c.CtxSize))
	}
	if c.ComputePercent > 100 {
		errs = append(errs, fmt.Errorf("--compute-percent %d is not from 0 to 100", c.ComputePercent))
	}
	for name, d := range map[string]time.Duration{"--start-seconds": c.StartTime, "--init-seconds": c.InitTime,
		"--load-seconds": c.LoadTime, "--wake-seconds": c.WakeTime} {
		if d < 0 {
			errs = append(errs, fmt.Errorf("%s must not be negative", name))
		}
	}
	if c.MaxLoRAs < 0 || c.LoRALoad.Scale < 0 || c.LoRALoad.Fixed < 0 {
		errs = append(errs, errors.New("--max-loras, --lora-load-scale and --lora-load-time must not be negative"))
	}
	if c.Runner != "" && c.Runner != "auto" && c.Runner != RunnerGenerate && c.Runner != RunnerPooling {
		errs = append(errs, fmt.Errorf("--runner is %q: it must be auto, generate or pooling", c.Runner))
	}
	if c.SchedulingPolicy != "" && c.SchedulingPolicy != "fcfs" && c.SchedulingPolicy != "priority" {
		errs = append(errs, fmt.Errorf("--scheduling-policy is %q: it must be fcfs or priority", c.SchedulingPolicy))
	}
	if c.TokensPerSecond < 0 || c.BatchSlowdown < 0 {
		errs = append(errs, errors.New("--tokens-per-second and --batch-slowdown must not be negative"))
	}
	if c.PrefillTokensPerSecond < 0 {
		errs = append(errs, fmt.Errorf("--prefill-tokens-per-second %g must not be negative", c.PrefillTokensPerSecond))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("sim engine: %w", err)
	}
	return nil
}

// Run serves until ctx ends (the command cancels it on SIGTERM), then
// unregisters its memory and shuts the server down.
func Run(ctx context.Context, cfg Config) error {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	if err := sleepFor(ctx, cfg.StartTime); err != nil {
		return nil
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(cfg.Host, strconv.Itoa(cfg.Port)))
	if err != nil {
		return fmt.Errorf("sim engine: %w", err)
	}
	life, stop := context.WithCancel(ctx)
	defer stop()
	s := newServer(cfg, life)
	if cfg.Dialect == DialectOllama {
		// `ollama serve` answers once it listens and loads a model on
		// the first request (or preload) that names it: a preload sent
		// as soon as /api/version answers must find it so.
		s.st.phase, s.st.auto, s.st.keepAlive, s.loadedOnce = phUnloaded, true, cfg.keepAliveDefault(), true
	}
	srv := &http.Server{Handler: s.routes(), ReadHeaderTimeout: 10 * time.Second}
	closeUnusedOnShutdown(srv)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	cfg.Logger.Info("sim engine listening", "addr", ln.Addr().String(), "model", cfg.ServedModelName,
		"load", cfg.LoadTime, "memory_mib", cfg.MemoryMiB, "cards", strings.Join(cfg.CardUUIDs, ","))
	if cfg.Ready != nil {
		cfg.Ready(ln.Addr())
	}
	defer s.unreport()
	go s.watch(life)

	var loadErr error
	loaded := make(chan error, 1)
	go func() {
		s.ctl.Lock()
		defer s.ctl.Unlock()
		if cfg.Dialect == DialectOllama {
			s.report()
			loaded <- nil
			return
		}
		err := s.load(life)
		if err == nil {
			s.mu.Lock()
			s.loadedOnce = true
			s.mu.Unlock()
		}
		loaded <- err
	}()
	for running := true; running; {
		select {
		case <-ctx.Done():
			running = false
		case err := <-served:
			return fmt.Errorf("sim engine: %w", err)
		case err := <-loaded:
			loaded, running = nil, err == nil
			if err != nil && ctx.Err() == nil {
				loadErr = err
				cfg.Logger.Error("sim engine failed to start", "err", err)
			}
		}
	}
	cfg.Logger.Info("sim engine stopping")
	stop()
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil {
		return err
	}
	if loadErr != nil {
		return fmt.Errorf("sim engine: %w", loadErr)
	}
	return nil
}

// closeUnusedOnShutdown has srv's Shutdown close at once the connections
// that have not sent a request: a client's spare connection (an HTTP
// transport dials one for a request that then got an idle connection and
// pools it unused) has nothing to finish, but net/http waits about five
// seconds before it counts it idle, past the engine's limit for stopping,
// while an unload waits for the process to end. A request whose first
// bytes arrive just as the engine stops may be cut; it would have found
// the engine gone a moment later. HTTP/1 only: an HTTP/2 connection leaves
// StateNew without telling ConnState.
func closeUnusedOnShutdown(srv *http.Server) {
	var mu sync.Mutex
	unused := map[net.Conn]bool{}
	stopping := false
	srv.ConnState = func(c net.Conn, st http.ConnState) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case st == http.StateNew && stopping:
			_ = c.Close()
		case st == http.StateNew:
			unused[c] = true
		default:
			delete(unused, c)
		}
	}
	// Shutdown runs this once its listeners are closed.
	srv.RegisterOnShutdown(func() {
		mu.Lock()
		defer mu.Unlock()
		stopping = true
		for c := range unused {
			_ = c.Close()
		}
	})
}

type server struct {
	cfg        Config
	weightsMiB uint64
	pid        int
	// life ends when the engine stops; loads run under it rather than
	// under the request that asked for them.
	life   context.Context
	nextID atomic.Uint64
	// cache is the prefix cache, keyed by cache_salt (prefix.go);
	// prefilled counts the prompt tokens computed, those it did not hold.
	cache     *prefixCache
	prefilled atomic.Int64
	// slots are llama.cpp's slot caches, for requests naming an id_slot
	// (slots.go).
	slots *slotCache
	// host is llama-server's host-RAM prompt cache (hostcache.go); nil
	// outside the llamacpp dialect and with --cache-ram 0.
	host *hostCache
	// busySlots are the llama.cpp dialect's slots running a request
	// (guarded by mu).
	busySlots map[int]bool
	// slotWaiting counts the llama.cpp dialect's requests waiting for a
	// slot (guarded by mu): llama-server's deferred tasks.
	slotWaiting int
	// llamaLoRA are the llama.cpp dialect's adapters (llamalora.go,
	// guarded by mu).
	llamaLoRA llamaLoRA
	// sizedMiB is what the ollama dialect took at its last load
	// (ollamamemory.go; guarded by mu; 0: --memory-mib).
	sizedMiB uint64
	// store is the ollama dialect's blobs and created models
	// (ollamacreate.go).
	store ollamaStore
	// kvLostMiB is what a fall of the card's free memory while the vllm
	// dialect profiled took from its KV pool (guarded by mu).
	kvLostMiB uint64

	// ctl serializes transitions (load, sleep, wake, unload).
	ctl sync.Mutex
	// mu guards st and what follows it; cond signals when requests end or
	// the engine wakes.
	mu         sync.Mutex
	cond       *sync.Cond
	st         state
	loadedOnce bool
	nextReq    uint64
	cancels    map[uint64]context.CancelCauseFunc
	// running, waiters and nextTurn order the batch under priority
	// scheduling (admit); preempted counts the requests paused for one
	// of higher priority.
	running   map[uint64]*request
	waiters   map[*turn]bool
	nextTurn  uint64
	preempted int
	lora      loraState

	// pubMu orders writes to the simulated card; last* is what was written.
	pubMu    sync.Mutex
	reported bool
	lastMiB  uint64
	lastRec  inventory.SimEngine
}

func newServer(cfg Config, life context.Context) *server {
	s := &server{
		cfg: cfg, life: life, pid: os.Getpid(),
		weightsMiB: cfg.MemoryMiB - cfg.OverheadMiB - cfg.KVPoolMiB,
		cancels:    map[uint64]context.CancelCauseFunc{},
		running:    map[uint64]*request{}, waiters: map[*turn]bool{},
		cache:     newPrefixCache(prefixCacheTokens(cfg)),
		slots:     newSlotCache(),
		host:      newHostCache(cfg),
		busySlots: map[int]bool{},
	}
	s.lora = loraState{loaded: map[string]*adapter{}, cached: map[string]bool{},
		rng: rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(s.pid)))}
	s.initLlamaLoRA()
	s.cond = sync.NewCond(&s.mu)
	s.st.phase, s.st.computeFrac, s.st.copyFrac = phStarting, 1, 1
	return s
}

func (s *server) routes() http.Handler {
	mux := http.NewServeMux()
	if s.cfg.Dialect != DialectAny {
		s.dialectRoutes(mux)
		if s.cfg.Dialect == DialectLlamaCpp {
			return s.llamaWhileLoading(mux)
		}
		return mux
	}
	mux.HandleFunc("GET /health", s.health)
	mux.HandleFunc("GET /v1/models", s.models)
	mux.HandleFunc("POST /v1/completions", s.completions)
	mux.HandleFunc("POST /v1/chat/completions", s.chat)
	mux.HandleFunc("POST /v1/embeddings", s.embeddings)
	s.controlRoutes(mux)
	s.loraRoutes(mux)
	return mux
}

// health answers 200 once the first load is done, also while asleep or
// unloaded: like vLLM's and llama.cpp's /health it reports the process, not
// the residency, so the executor does not restart a sleeping engine.
func (s *server) health(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	loaded := s.loadedOnce
	s.mu.Unlock()
	if !loaded {
		http.Error(w, "loading", http.StatusServiceUnavailable)
		return
	}
	if s.cfg.Dialect == DialectLlamaCpp {
		// tools/server: {"status":"ok"}.
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
		return
	}
	w.WriteHeader(http.StatusOK)
}

// models lists the base model and, as vLLM does, each loaded adapter with
// the base as its parent.
func (s *server) models(w http.ResponseWriter, _ *http.Request) {
	data := []any{map[string]any{
		"id": s.cfg.ServedModelName, "object": "model", "created": 0, "owned_by": "gpuplane-sim",
	}}
	for _, name := range s.loadedAdapters() {
		data = append(data, map[string]any{"id": name, "object": "model", "created": 0, "owned_by": "gpuplane-sim",
			"root": name, "parent": s.cfg.ServedModelName})
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": data})
}

// completionRequest holds the fields of both completion requests that the
// sim reads.
type completionRequest struct {
	Model     string    `json:"model"`
	Prompt    any       `json:"prompt"`
	Messages  []message `json:"messages"`
	MaxTokens int       `json:"max_tokens"`
	Stream    bool      `json:"stream"`
	// StreamOptions.IncludeUsage adds a last chunk with the usage, as
	// OpenAI and vLLM do.
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	// CacheSalt, vLLM's field, is the prefix cache's namespace: absent is
	// a namespace of its own.
	CacheSalt *string `json:"cache_salt"`
	// Priority, vLLM's field: lower is handled earlier; non-zero needs
	// --scheduling-policy priority.
	Priority *int `json:"priority"`
	// IDSlot and CachePrompt, llama.cpp's fields: the slot to run in (-1:
	// any) and whether to reuse what it holds (default true).
	IDSlot      *int  `json:"id_slot"`
	CachePrompt *bool `json:"cache_prompt"`
	// LoRA, llama.cpp's field: the adapters (by --lora id) and scales of
	// this request; those it leaves out are at 0.
	LoRA []loraScale `json:"lora"`
	// RequestID, vLLM's field: the answer's id is "cmpl-" (completions)
	// or "chatcmpl-" (chat) and it; an X-Request-Id header takes
	// precedence, as in vLLM.
	RequestID string `json:"request_id"`
}

type message struct {
	Role    string `json:"role"`
	Content any    `json:"content"`
}

const defaultMaxTokens = 16

func (s *server) completions(w http.ResponseWriter, r *http.Request) {
	s.complete(w, r, false)
}

func (s *server) chat(w http.ResponseWriter, r *http.Request) {
	s.complete(w, r, true)
}

func (s *server) complete(w http.ResponseWriter, r *http.Request, chat bool) {
	received := time.Now()
	s.mu.Lock()
	loaded := s.loadedOnce
	s.mu.Unlock()
	if !loaded {
		s.refuse(w, errLoading)
		return
	}
	if s.cfg.Runner == RunnerPooling {
		// vLLM's answer for a pooling model.
		api := "Completions"
		if chat {
			api = "Chat Completions"
		}
		apiError(w, http.StatusBadRequest, "The model does not support "+api+" API", "BadRequestError")
		return
	}
	var req completionRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4<<20)).Decode(&req); err != nil {
		apiError(w, http.StatusBadRequest, "invalid request body: "+err.Error(), "invalid_request_error")
		return
	}
	model := s.cfg.ServedModelName
	if s.cfg.Dialect == DialectOllama {
		// Ollama answers with the name the request gave
		// (server/routes.go: Model: req.Model).
		model = req.Model
	}
	if !s.knowsModel(req.Model) {
		// An adapter is served only while registered; vLLM answers any
		// other name with a 404, Ollama any name but its tags.
		s.mu.Lock()
		ok := s.cfg.Dialect != DialectOllama && s.useAdapter(req.Model)
		s.mu.Unlock()
		if ok && s.cfg.Dialect == DialectVLLM {
			// --max-loras bounds the adapters in one batch, not those
			// registered: the request waits for a LoRA slot.
			ok = s.waitLoRASlot(r.Context(), req.Model)
			if !ok {
				return
			}
		}
		if !ok {
			s.notFound(w, req.Model)
			return
		}
		model = req.Model
		defer func() {
			s.mu.Lock()
			s.doneAdapter(model)
			s.cond.Broadcast()
			s.mu.Unlock()
		}()
	}
	if s.cfg.Dialect == DialectLlamaCpp && !chat && req.Prompt == nil {
		// nlohmann::json's at("prompt") on a body without it.
		llamaError(w, http.StatusBadRequest, "[json.exception.out_of_range.403] key 'prompt' not found", "invalid_request_error", nil)
		return
	}
	if chat && len(req.Messages) == 0 {
		apiError(w, http.StatusBadRequest, "messages must not be empty", "invalid_request_error")
		return
	}
	// vLLM's and OpenAI's rules for these two fields.
	if req.CacheSalt != nil && *req.CacheSalt == "" {
		apiError(w, http.StatusBadRequest, "cache_salt must be a non-empty string if provided", "invalid_request_error")
		return
	}
	if req.Priority != nil && *req.Priority != 0 && s.cfg.SchedulingPolicy != "priority" {
		apiError(w, http.StatusBadRequest, "Got priority "+strconv.Itoa(*req.Priority)+" but Priority scheduling is not enabled.", "invalid_request_error")
		return
	}
	if slots := s.cfg.slots(); s.cfg.Dialect == DialectAny && req.IDSlot != nil && (*req.IDSlot < -1 || *req.IDSlot >= slots) {
		apiError(w, http.StatusBadRequest, fmt.Sprintf("id_slot %d is out of range: the engine has %d slots (--parallel), -1 means any", *req.IDSlot, slots), "invalid_request_error")
		return
	}
	if s.cfg.Dialect != DialectAny && s.cfg.Dialect != DialectLlamaCpp {
		// vLLM and Ollama ignore llama.cpp's fields.
		req.IDSlot, req.CachePrompt, req.LoRA = nil, nil, nil
	}
	var applied []string
	var explicitLoRA bool
	if s.cfg.Dialect == DialectLlamaCpp {
		applied, explicitLoRA = s.loraFor(req.LoRA)
	}
	if req.StreamOptions != nil && !req.Stream {
		apiError(w, http.StatusBadRequest, "stream_options is only allowed when stream is true", "invalid_request_error")
		return
	}
	prompt := promptWords(req)
	promptTokens := len(prompt)
	if s.cfg.Dialect == DialectLlamaCpp {
		// llama-server runs every request in a slot: one it names, else
		// any idle one; the rest wait.
		want := -1
		if req.IDSlot != nil {
			want = *req.IDSlot
		}
		id, err := s.waitSlot(r, want)
		if err != nil {
			return
		}
		defer s.freeSlot(id)
		req.IDSlot = &id
		s.hostCacheOnLaunch(id, want >= 0, prompt)
		if n := s.cfg.SlotContext(); n > 0 {
			if promptTokens >= n {
				llamaError(w, http.StatusBadRequest, "the request exceeds the available context size, try increasing it", "exceed_context_size_error",
					map[string]any{"n_prompt_tokens": promptTokens, "n_ctx": n})
				return
			}
			// Generation stops where the slot's context ends.
			n = min(n, n-promptTokens)
			if req.MaxTokens <= 0 || req.MaxTokens > n {
				req.MaxTokens = n
			}
		}
	}
	n := req.MaxTokens
	if n <= 0 {
		n = defaultMaxTokens
	}
	priority := 0
	if req.Priority != nil {
		priority = *req.Priority
	}
	rq, err := s.admit(r.Context(), promptTokens, priority)
	if err != nil {
		s.refuse(w, err)
		return
	}
	defer s.release(rq)
	var blocks []blockHash
	var cached int
	slot := -1
	if req.IDSlot != nil {
		slot = *req.IDSlot
	}
	if slot >= 0 {
		reuse := (req.CachePrompt == nil || *req.CachePrompt) && !s.loraChanged(slot, applied, explicitLoRA)
		cached = s.slots.lookup(slot, prompt, reuse)
	} else {
		blocks = blockHashes(req.CacheSalt, prompt)
		cached = s.cache.lookup(blocks, promptTokens)
	}
	s.countLoRA(applied)
	err = s.prefill(rq, promptTokens-cached)
	if err == nil {
		if slot >= 0 {
			s.slots.store(slot, prompt)
		} else {
			s.cache.insert(blocks)
		}
	}
	tokens := s.reply(n)
	id := answerID(r, req.RequestID, chat, s.nextID.Add(1))
	created := time.Now().Unix()
	if req.Stream && err == nil {
		var use func(completion int) map[string]any
		if req.StreamOptions != nil && req.StreamOptions.IncludeUsage {
			use = func(completion int) map[string]any { return s.usage(promptTokens, completion, cached) }
		}
		s.stream(w, rq, chat, id, created, model, tokens, use, received)
		return
	}
	if err == nil {
		err = s.generate(rq, len(tokens), nil)
	}
	if err != nil {
		if errors.Is(err, errAborted) {
			apiError(w, http.StatusServiceUnavailable, err.Error(), "server_error")
		}
		return
	}
	text := strings.Join(tokens, "")
	choice := map[string]any{"index": 0, "finish_reason": "length"}
	object := "text_completion"
	if chat {
		object = "chat.completion"
		choice["message"] = map[string]any{"role": "assistant", "content": text}
	} else {
		choice["text"] = text
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"id": id, "object": object, "created": created, "model": model,
		"choices": []any{choice},
		"usage":   s.usage(promptTokens, len(tokens), cached),
	})
}

// answerID is the answer's id as vLLM forms it: "cmpl-" or "chatcmpl-"
// and the request's X-Request-Id header, else its request_id, else one of
// the engine's own, so that a client can tell that an answer is its
// request's.
func answerID(r *http.Request, requestID string, chat bool, n uint64) string {
	base := cmp.Or(r.Header.Get("X-Request-Id"), requestID, fmt.Sprintf("sim-%d", n))
	if chat {
		return "chatcmpl-" + base
	}
	return "cmpl-" + base
}

// usage is OpenAI's usage object, with the prompt tokens the prefix cache
// held where the engine reports them: vLLM only with
// --enable-prompt-tokens-details, Ollama never.
func (s *server) usage(prompt, completion, cached int) map[string]any {
	u := map[string]any{
		"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
	}
	switch {
	case s.cfg.Dialect == DialectOllama:
	case s.cfg.Dialect == DialectVLLM && !s.cfg.PromptTokensDetails:
	default:
		u["prompt_tokens_details"] = map[string]int{"cached_tokens": cached}
	}
	return u
}

// refuse answers a request the engine cannot take now with 503 in OpenAI's
// error shape. For a sleeping engine this is what vLLM's proposed fix does
// (vllm-project/vllm#15483, #30186); released vLLM versions crash instead,
// which no controller should rely on.
func (s *server) refuse(w http.ResponseWriter, err error) {
	apiError(w, http.StatusServiceUnavailable, "model "+s.cfg.ServedModelName+" "+err.Error(), "server_error")
}

// HeaderReceived, HeaderFirstTokenDue and HeaderFirstToken are the
// streamed answer's headers that time the engine's part of its first
// token, in Unix nanoseconds: when the engine received the request, when
// its model had the first token ready (its prefill and one token at the
// rates the card's sharing gave it), and when the process wrote it (later
// by however long the machine kept it from running; for a stream without
// a token, both are its end).
const (
	HeaderReceived      = "X-Sim-Received-Unix-Nano"
	HeaderFirstTokenDue = "X-Sim-First-Token-Due-Unix-Nano"
	HeaderFirstToken    = "X-Sim-First-Token-Unix-Nano"
)

// stream sends one server-sent event per token, then [DONE], as OpenAI's
// streaming API does. A stream cut off by a sleep ends with finish_reason
// "abort", as vLLM ends aborted requests. With use (stream_options
// include_usage) every chunk has "usage": null and a last chunk without
// choices carries the usage of the tokens sent, as OpenAI sends it.
//
// The headers go out with the first token, stamped with when the engine
// received the request (HeaderReceived), when the first token was due
// (HeaderFirstTokenDue) and when it was written (HeaderFirstToken): what
// a client sees beyond the engine's own time to first token is the path
// to and from the engine (`gpuplane bench interference` measures it per
// request).
func (s *server) stream(w http.ResponseWriter, rq *request, chat bool, id string, created int64, model string, tokens []string, use func(completion int) map[string]any, received time.Time) {
	flusher, _ := w.(http.Flusher)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	object := "text_completion"
	if chat {
		object = "chat.completion.chunk"
	}
	sent := 0
	began := false
	send := func(choice map[string]any) {
		if !began {
			began = true
			w.Header().Set(HeaderReceived, strconv.FormatInt(received.UnixNano(), 10))
			now := time.Now()
			w.Header().Set(HeaderFirstToken, strconv.FormatInt(now.UnixNano(), 10))
			due := rq.firstDue
			if due.IsZero() || due.After(now) {
				due = now
			}
			w.Header().Set(HeaderFirstTokenDue, strconv.FormatInt(due.UnixNano(), 10))
			w.WriteHeader(http.StatusOK)
		}
		chunk := map[string]any{
			"id": id, "object": object, "created": created, "model": model, "choices": []any{choice},
		}
		if use != nil {
			chunk["usage"] = nil
			if choice == nil {
				chunk["choices"], chunk["usage"] = []any{}, use(sent)
			}
		}
		data, _ := json.Marshal(chunk)
		fmt.Fprintf(w, "data: %s\n\n", data)
		if flusher != nil {
			flusher.Flush()
		}
	}
	err := s.generate(rq, len(tokens), func(i int) {
		choice := map[string]any{"index": 0, "finish_reason": nil}
		if chat {
			delta := map[string]any{"content": tokens[i]}
			if i == 0 {
				delta["role"] = "assistant"
			}
			choice["delta"] = delta
		} else {
			choice["text"] = tokens[i]
		}
		send(choice)
		sent++
	})
	final := map[string]any{"index": 0, "finish_reason": "length"}
	switch {
	case errors.Is(err, errAborted):
		final["finish_reason"] = "abort"
	case err != nil:
		return // the client went away
	}
	if chat {
		final["delta"] = map[string]any{}
	} else {
		final["text"] = ""
	}
	send(final)
	if use != nil {
		send(nil)
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
	if flusher != nil {
		flusher.Flush()
	}
}

// prefill computes a prompt's tokens that the prefix cache did not hold,
// at PrefillTokensPerSecond slowed as decoding is (rate): a cache hit
// shortens it in proportion to the tokens it covers. It runs from the
// request's admission (what admit does after, reporting the engine busy,
// is the engine's bookkeeping, not the prompt's wait), and records when it
// was done for generate.
func (s *server) prefill(rq *request, tokens int) error {
	s.prefilled.Add(int64(tokens))
	if tokens <= 0 || s.cfg.PrefillTokensPerSecond <= 0 {
		return nil
	}
	work, last := float64(tokens), rq.admitted
	if last.IsZero() {
		last = time.Now()
	}
	for {
		rate := s.cfg.PrefillTokensPerSecond * s.speed()
		now := time.Now()
		work -= now.Sub(last).Seconds() * rate
		last = now
		if work <= 0 {
			if rate > 0 {
				// A timer fires late (by at least the runtime's timer
				// granularity, about a millisecond): the prompt was done
				// before now, and decoding began then.
				rq.decodeFrom = now.Add(-time.Duration(-work / rate * float64(time.Second)))
			}
			return nil
		}
		wait := tick
		if rate > 0 {
			wait = min(tick, time.Duration(work/rate*float64(time.Second)))
		}
		t := time.NewTimer(wait)
		select {
		case <-rq.ctx.Done():
			t.Stop()
			return context.Cause(rq.ctx)
		case <-t.C:
		}
	}
}

// generate produces n tokens for rq at the stream's current rate (see
// rate), calling emit after each. It integrates the rate over time, so a
// late timer on a busy machine is caught up rather than slowing the stream,
// and a neighbour turning busy or idle changes the pace within a tick.
//
// Decoding starts where the prefill ended (rq.decodeFrom), not where its
// late timer woke it: otherwise every timer's lateness would add to the
// first token, which the engine's model (and simulate serve's) has at
// prefill + one token.
func (s *server) generate(rq *request, n int, emit func(i int)) error {
	credit, last := 0.0, time.Now()
	if !rq.decodeFrom.IsZero() && rq.decodeFrom.Before(last) {
		credit = last.Sub(rq.decodeFrom).Seconds() * s.rate()
	}
	for i := 0; i < n; {
		if s.prioritized() {
			paused, err := s.resumeWait(rq)
			if err != nil {
				return err
			}
			if paused {
				credit, last = 0, time.Now()
			}
		}
		rate := s.rate()
		if s.cfg.TokensPerSecond <= 0 {
			credit = float64(n - i)
		} else if credit < 1 {
			wait := tick
			if rate > 0 {
				wait = min(tick, time.Duration((1-credit)/rate*float64(time.Second)))
			}
			t := time.NewTimer(wait)
			select {
			case <-rq.ctx.Done():
				t.Stop()
				return context.Cause(rq.ctx)
			case <-t.C:
			}
			now := time.Now()
			credit += now.Sub(last).Seconds() * rate
			last = now
		}
		for ; credit >= 1 && i < n; i++ {
			if i == 0 && rate > 0 {
				// The first token was due when the credit, counted up to
				// last, reached 1.
				rq.firstDue = last.Add(-time.Duration((credit - 1) / rate * float64(time.Second)))
			}
			credit--
			s.hold(rq, 1)
			if emit != nil {
				emit(i)
			}
		}
		if i < n && rq.ctx.Err() != nil {
			return context.Cause(rq.ctx)
		}
	}
	return nil
}

var words = strings.Fields("this is a simulated reply from the gpuplane sim engine which holds no weights and answers every prompt with the same words")

// reply returns n tokens, each a word with its leading space.
func (s *server) reply(n int) []string {
	out := make([]string, n)
	for i := range out {
		w := words[i%len(words)]
		if i > 0 {
			w = " " + w
		}
		out[i] = w
	}
	return out
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// apiError answers in OpenAI's error shape.
func apiError(w http.ResponseWriter, code int, msg, typ string) {
	writeJSON(w, code, map[string]any{"error": map[string]any{"message": msg, "type": typ, "code": code}})
}
