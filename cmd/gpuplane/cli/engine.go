package cli

import (
	"log/slog"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpuplane/gpuplane/internal/engines"
	"github.com/gpuplane/gpuplane/node/executor"
	"github.com/gpuplane/gpuplane/node/inventory"
	"github.com/gpuplane/gpuplane/node/sim"
)

// newEngineCommand is `gpuplane engine`, the engines built into the binary.
// The executor runs them; people rarely do, so the group is hidden.
func newEngineCommand(g *globals) *cobra.Command {
	c := newGroupCommand("engine", "Run an engine built into gpuplane", nil, newEngineSimCommand(g), newEngineLogCommand(g))
	c.Hidden = true
	return c
}

// newEngineSimCommand is `gpuplane engine sim`: the simulated inference
// engine of docs/engines.md. It serves until SIGTERM or interrupt.
func newEngineSimCommand(g *globals) *cobra.Command {
	cfg := sim.Config{LoRALoad: sim.DefaultLoRALoad}
	var startSeconds, initSeconds, loadSeconds, wakeSeconds, idleSeconds float64
	var cards string
	cmd := &cobra.Command{
		Use:   "sim",
		Short: "Serve a simulated OpenAI-compatible model",
		Long: `Serve a simulated model over an OpenAI-compatible API (/v1/models,
/v1/completions, /v1/chat/completions, /health). A start has three phases:
--start-seconds before the port opens, --init-seconds of runtime
initialisation (--overhead-mib on the card), and --load-seconds of weight
load; /health answers 503 until all have passed, then 200. The engine
registers its memory on each of --card-uuids with the simulated NVML (the
directory in $` + inventory.EnvSimUsageDir + `), so that the node's watchdog
sees it: the overhead, the weights (--memory-mib less the overhead and the
KV pool) and a KV cache growing by --kv-kib-per-token per token in flight up
to --kv-pool-mib; a request whose prompt does not fit in the pool waits.

It answers the residency controls of vLLM (POST /sleep?level=1|2, POST
/wake_up, GET /is_sleeping; asleep it holds --sleep-residual-mib and refuses
requests; a level-1 wake takes --wake-seconds, a level-2 wake reloads),
llama.cpp's router (GET /models, POST /models/load, /models/unload, GET
/props, --sleep-idle-seconds) and Ollama (POST /api/generate with
keep_alive, GET /api/ps).

A prefix cache keyed by the request's cache_salt (vLLM's field; no salt is
a namespace of its own) and bounded by the KV pool saves the prefill
(--prefill-tokens-per-second) of the prompt blocks it holds and reports
them as usage.prompt_tokens_details.cached_tokens.

Sim engines on one card share it: busy engines split its compute by
--compute-percent, loads and wakes split its copy bandwidth. The executor
starts it for deployments of engine kind sim, sized to their share.

--dialect vllm, llamacpp, ollama or sglang makes it answer only that engine's API
and refuse what that engine refuses (docs/engines.md): vLLM's sleep routes
need VLLM_SERVER_DEV_MODE=1 and --enable-sleep-mode, its LoRA routes
VLLM_ALLOW_RUNTIME_LORA_UPDATING and --enable-lora, and adapters stay
registered through a sleep; llama.cpp runs --parallel slots (else 4 over a
unified cache) splitting --ctx-size; Ollama knows its model by its tag and
loads it on the first request or keep_alive load; SGLang's
--mem-fraction-static counts the card's other processes, and its
/release_memory_occupation frees memory only with --enable-memory-saver.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cfg.ServedModelName == "" {
				return usageErrorf(cmd, "--served-model-name is required")
			}
			for name, v := range map[string]float64{"--start-seconds": startSeconds, "--init-seconds": initSeconds,
				"--load-seconds": loadSeconds, "--wake-seconds": wakeSeconds} {
				if v < 0 {
					return usageErrorf(cmd, "%s must not be negative", name)
				}
			}
			if cfg.TokensPerSecond < 0 || cfg.BatchSlowdown < 0 {
				return usageErrorf(cmd, "--tokens-per-second and --batch-slowdown must not be negative")
			}
			if cfg.PrefillTokensPerSecond < 0 {
				return usageErrorf(cmd, "--prefill-tokens-per-second must not be negative")
			}
			if cfg.MaxNumSeqs < 0 {
				return usageErrorf(cmd, "--max-num-seqs must not be negative")
			}
			seconds := func(v float64) time.Duration { return time.Duration(v * float64(time.Second)) }
			cfg.StartTime, cfg.InitTime, cfg.LoadTime, cfg.WakeTime = seconds(startSeconds), seconds(initSeconds), seconds(loadSeconds), seconds(wakeSeconds)
			if idleSeconds > 0 {
				cfg.SleepIdle = seconds(idleSeconds)
			}
			if cfg.Dialect == sim.DialectVLLM && !cmd.Flags().Changed("overshoot-mib") {
				// What vLLM holds above its budget (docs/engines.md).
				cfg.OvershootMiB = engines.ForKind(sim.DialectVLLM).OvershootMiB
			}
			if !cmd.Flags().Changed("sleep-residual-mib") {
				cfg.ResidualMiB = cfg.OverheadMiB
			}
			if cards != "" {
				cfg.CardUUIDs = strings.Split(cards, ",")
			}
			// The environment the engines read (docs/engines.md).
			cfg.VLLMDevMode = g.getenv("VLLM_SERVER_DEV_MODE") == "1"
			cfg.VLLMRuntimeLoRA = envTrue(g.getenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING"))
			keep, err := sim.ParseOllamaKeepAlive(g.getenv("OLLAMA_KEEP_ALIVE"))
			if err != nil {
				return usageErrorf(cmd, "OLLAMA_KEEP_ALIVE: %v", err)
			}
			cfg.OllamaKeepAlive = keep
			limit, err := sim.ParseHardLimitMiB(g.getenv("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"), g.getenv("CUDA_DEVICE_MEMORY_LIMIT"))
			if err != nil {
				return usageErrorf(cmd, "%v", err)
			}
			cfg.HardLimitMiB = limit
			if !cmd.Flags().Changed("parallel") {
				cfg.Parallel = 0
			}
			if err := cfg.Validate(); err != nil {
				return usageErrorf(cmd, "%s", strings.TrimPrefix(err.Error(), "sim engine: "))
			}
			if dir := g.getenv(inventory.EnvSimUsageDir); dir != "" {
				cfg.Usage = inventory.NewSimUsage(dir)
			}
			cfg.Logger = slog.New(slog.NewTextHandler(g.stderr, nil))
			return sim.Run(ctx(cmd), cfg)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Host, "host", "127.0.0.1", "address to listen on")
	f.IntVar(&cfg.Port, "port", 8000, "port to listen on")
	f.StringVar(&cfg.ServedModelName, "served-model-name", "", "the model name clients send")
	f.Float64Var(&startSeconds, "start-seconds", 0, "seconds of process start before the port opens")
	f.Float64Var(&initSeconds, "init-seconds", 0, "seconds of runtime initialisation after the port opens (the overhead is on the card)")
	f.Float64Var(&loadSeconds, "load-seconds", 1, "seconds of weight load with the card's copy bandwidth to itself")
	f.Float64Var(&wakeSeconds, "wake-seconds", 0.5, "seconds to copy the weights back after a level-1 sleep, with the copy bandwidth to itself")
	f.Uint64Var(&cfg.MemoryMiB, "memory-mib", 0, "peak GPU memory on each card: overhead, weights and KV pool (the executor passes the share)")
	f.Uint64Var(&cfg.OverheadMiB, "overhead-mib", 0, "GPU memory of the runtime (CUDA context), held from initialisation on")
	f.Uint64Var(&cfg.KVPoolMiB, "kv-pool-mib", 0, "part of --memory-mib that the KV cache grows into")
	f.Uint64Var(&cfg.KVKiBPerToken, "kv-kib-per-token", 0, "KV cache per token in flight, in KiB (0: no KV growth)")
	f.Uint64Var(&cfg.ResidualMiB, "sleep-residual-mib", 0, "GPU memory held while asleep (default: --overhead-mib)")
	f.Uint64Var(&cfg.OvershootMiB, "overshoot-mib", 0, "GPU memory held above --memory-mib while awake, as vLLM's CUDA graphs, NCCL and allocator memory outside its budget (default: vLLM's measured overshoot in the vllm dialect, else 0)")
	f.Uint64Var(&cfg.CardMiB, "card-mib", 0, "the card's memory, for the free memory vLLM's messages name (the executor passes it)")
	f.Float64Var(&cfg.TokensPerSecond, "tokens-per-second", 50, "generation speed of one stream with the card to itself; 0 answers at once")
	f.Float64Var(&cfg.PrefillTokensPerSecond, "prefill-tokens-per-second", 0, "prompt tokens per second before the first token, of those the prefix cache (keyed by the request's cache_salt) does not hold; 0: prefill is free")
	f.Uint32Var(&cfg.ComputePercent, "compute-percent", 0, "compute share: busy engines on a card split its compute in proportion (0 counts as 100)")
	f.Float64Var(&cfg.BatchSlowdown, "batch-slowdown", 0, "α: with C requests in flight each stream runs at speed/(1+α(C-1))")
	f.IntVar(&cfg.MaxNumSeqs, "max-num-seqs", 0, "requests run at once, as vLLM's --max-num-seqs (1: no continuous batching); the rest wait; 0: bounded by the KV pool only")
	f.StringVar(&cfg.SchedulingPolicy, "scheduling-policy", "fcfs", "fcfs or priority, as vLLM's: a request with a non-zero \"priority\" is refused unless priority")
	f.StringVar(&cfg.Runner, "runner", "auto", "as vLLM's --runner: generate refuses embeddings, pooling refuses completions and chat; auto answers both")
	f.IntVar(&cfg.Parallel, "parallel", 1, "slots, as llama.cpp's --parallel: a request may name one in \"id_slot\" (0 to N-1, or -1 for any) and reuses the prompt it last ran unless \"cache_prompt\" is false; unset in the llamacpp dialect: llama-server's auto, 4 slots over a unified KV cache")
	f.Float64Var(&idleSeconds, "sleep-idle-seconds", -1, "sleep after this many idle seconds, waking on the next request, as llama.cpp (negative: never)")
	f.StringVar(&cards, "card-uuids", "", "cards to register the memory on, comma-separated UUIDs")
	f.StringVar(&cfg.Dialect, "dialect", "", "answer and refuse as one engine does: vllm, llamacpp, ollama or sglang (none: every engine's API, without their preconditions)")
	f.BoolVar(&cfg.EnableSleepMode, "enable-sleep-mode", false, "vllm dialect: the sleep routes work (they exist only with VLLM_SERVER_DEV_MODE=1)")
	f.BoolVar(&cfg.EnableLoRA, "enable-lora", false, "vllm dialect: runtime LoRA loads work (the routes exist only with VLLM_ALLOW_RUNTIME_LORA_UPDATING)")
	f.Float64Var(&cfg.MemFractionStatic, "mem-fraction-static", 0, "sglang dialect: the fraction of the whole card (--card-mib) its weights and KV pool may bring the card's use to, the other processes' memory included (0: --memory-mib)")
	f.BoolVar(&cfg.EnableMemorySaver, "enable-memory-saver", false, "sglang dialect: /release_memory_occupation frees the memory (without it, it answers 200 and frees nothing, as SGLang's)")
	f.BoolVar(&cfg.WeightsCPUBackup, "enable-weights-cpu-backup", false, "sglang dialect: a release keeps the weights in host RAM (without it a resume finds them gone and requests are refused)")
	f.BoolVar(&cfg.EnableMetrics, "enable-metrics", false, "sglang dialect: serve /metrics (sglang:num_running_reqs, sglang:num_queue_reqs)")
	f.IntVar(&cfg.MaxLoRAs, "max-loras-per-batch", sim.DefaultMaxLoRAs, "sglang dialect: SGLang's name for --max-loras")
	f.IntVar(&cfg.MaxNumSeqs, "max-running-requests", 0, "sglang dialect: SGLang's name for --max-num-seqs")
	f.StringSlice("lora-target-modules", nil, "sglang dialect: accepted, as SGLang's (the sim's adapters have no modules)")
	f.IntVar(&cfg.MaxLoRARank, "max-lora-rank", 0, "vllm dialect: the largest adapter rank a load accepts, as vLLM's --max-lora-rank (0: any)")
	f.BoolVar(&cfg.PromptTokensDetails, "enable-prompt-tokens-details", false, "vllm dialect: usage reports prompt_tokens_details.cached_tokens")
	f.IntVarP(&cfg.CtxSize, "ctx-size", "c", 0, "llamacpp dialect: the context, split over explicit --parallel slots unless --kv-unified (0: unbounded)")
	f.IntVar(&cfg.CacheRAMMiB, "cache-ram", sim.DefaultCacheRAMMiB, "llamacpp dialect: llama-server's host-RAM prompt cache, in MiB (0: off, -1: no limit): a request naming no slot saves its slot's prompt there and restores the cached prompt that best matches its own, whoever computed it; the cache's host memory is reported as the engine's")
	f.BoolVar(&cfg.KVUnified, "kv-unified", false, "llamacpp dialect: one KV cache every slot may fill (the default with auto slots)")
	f.StringArrayVar(&cfg.LlamaLoRA, "lora", nil, "llamacpp dialect: a LoRA adapter file loaded at start, as llama-server's --lora (repeat for more; ids 0.. in order); requests pick them with \"lora\": [{\"id\": N, \"scale\": S}]")
	f.BoolVar(&cfg.LlamaLoRAInitWithoutApply, "lora-init-without-apply", false, "llamacpp dialect: llama-server's flag, accepted; as there, the adapters' global scales stay 1 and a request without a lora list runs with them")
	f.BoolVar(&cfg.LlamaMetrics, "metrics", false, "llamacpp dialect: serve /metrics (llamacpp:requests_processing, llamacpp:requests_deferred), as llama-server's --metrics; vLLM's series are always served in the vllm dialect and without one")
	f.BoolVar(&cfg.LlamaRouter, "router", false, "llamacpp dialect: serve the router's /models, /models/load and /models/unload (llama-server without -m)")
	f.IntVar(&cfg.MaxLoRAs, "max-loras", sim.DefaultMaxLoRAs, "LoRA adapters loaded at once, as vLLM's --max-loras (POST /v1/load_lora_adapter)")
	f.Uint64Var(&cfg.LoRAMiBPerRank, "lora-mib-per-rank", sim.DefaultLoRAMiBPerRank, "GPU memory of a loaded adapter per unit of its rank (adapter_config.json's r, else 16)")
	f.Float64Var(&cfg.LoRALoad.Scale, "lora-load-scale", 1, "multiplies every adapter load time (drawn from GenTD26's measured LoRA loads: median about 4.4s)")
	f.DurationVar(&cfg.LoRALoad.Fixed, "lora-load-time", 0, "a fixed adapter load time instead of the drawn one (0: draw)")
	return cmd
}

// newEngineLogCommand is `gpuplane engine log`: the executor runs one next to
// every engine, its stdin the engine's stdout and stderr, to write the
// engine's log with a cap on its size on disk (see executor.WriteLog).
func newEngineLogCommand(g *globals) *cobra.Command {
	var dir string
	var maxBytes int64
	var keep int
	var watch executor.OrphanWatch
	cmd := &cobra.Command{
		Use:   "log",
		Short: "Write an engine's output (stdin) to its size-capped, rotated log",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if dir == "" || maxBytes <= 0 || keep < 0 {
				return usageErrorf(cmd, "--dir is required, --max-bytes must be more than 0 and --keep at least 0")
			}
			if watch.AgentFile != "" && (watch.Grace <= 0 || watch.StopGrace <= 0) {
				return usageErrorf(cmd, "--agent-file needs --orphan-grace and --stop-grace more than 0")
			}
			return executor.WriteLog(g.stdin, dir, maxBytes, keep, watch)
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "dir", "", "the replica's directory, where engine.log is written")
	f.Int64Var(&maxBytes, "max-bytes", 10<<20, "the most bytes of log kept on disk, all files together")
	f.IntVar(&keep, "keep", 3, "rotated files kept besides engine.log")
	f.StringVar(&watch.AgentFile, "agent-file", "", "the agent's mark (pid and start time): stop the engine once no agent has run for --orphan-grace")
	f.DurationVar(&watch.Grace, "orphan-grace", executor.DefaultOrphanGrace, "with --agent-file: how long the engine outlives its agent")
	f.DurationVar(&watch.StopGrace, "stop-grace", 10*time.Second, "with --agent-file: between SIGTERM and SIGKILL when stopping the engine")
	return cmd
}

// envTrue reads a boolean environment variable as vLLM's envs.py does:
// "1" or "true" in any case.
func envTrue(v string) bool {
	return v == "1" || strings.EqualFold(v, "true")
}
