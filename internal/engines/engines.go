// Package engines is the one table of the engine kinds a deployment may
// name (spec.engine.kind) and what each can do (docs/engines.md): how its
// memory share becomes its flags, how the node sleeps and wakes it, how it
// takes LoRA adapters, how many requests it runs at once and where that is
// read, the metrics the agent reads, its health path, its start deadline,
// how it takes an API key, and, for the sim engine, the dialects it speaks.
//
// It is a leaf, so that the state machine's checks, the descriptor's
// checks, the node's drivers, the agent and the gateway all read the same
// row. A kind the table does not hold is refused (Lookup), never given a
// default. Adding an engine is adding a row here, its driver and controls
// in node/engine and, for tests, its dialect in node/sim.
//
// It never reads the clock, a file or the network.
package engines

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// The engine kinds, as spec.engine.kind names them.
const (
	VLLM     = "vllm"
	LlamaCpp = "llamacpp"
	Ollama   = "ollama"
	SGLang   = "sglang"
	Command  = "command"
	Sim      = "sim"
)

// Default is the kind of a deployment that names none.
const Default = VLLM

// SleepAPI is how the node puts an engine to sleep and wakes it.
type SleepAPI int

const (
	// SleepStartStop: no sleep API; the node stops the engine and starts
	// it again (llama.cpp, whose router controls need llama-server
	// without -m, and command engines).
	SleepStartStop SleepAPI = iota
	// SleepVLLM: POST /sleep?level=N and /wake_up (vLLM's sleep mode).
	SleepVLLM
	// SleepKeepAlive: Ollama's keep_alive 0 unloads the model, a request
	// loads it again.
	SleepKeepAlive
	// SleepMemoryOccupation: SGLang's /release_memory_occupation and
	// /resume_memory_occupation, which free and restore its weights and
	// KV cache only under --enable-memory-saver (else they answer 200 and
	// free nothing) and keep the weights only with
	// --enable-weights-cpu-backup.
	SleepMemoryOccupation
)

// AdapterLoad is how an engine takes LoRA adapters.
type AdapterLoad int

const (
	// AdaptersNone: the node cannot give it adapters.
	AdaptersNone AdapterLoad = iota
	// AdaptersAtRunTime: loaded and unloaded by HTTP calls while it runs.
	AdaptersAtRunTime
	// AdaptersAtStart: every adapter on its command line (llama.cpp's
	// --lora), picked per request.
	AdaptersAtStart
)

// Engine is one row of the table.
type Engine struct {
	// Kind is spec.engine.kind; Name how messages call it ("vLLM").
	Kind, Name string
	// ShareFlag is the flag the driver sets from the replica's memory
	// share ("" for none: the share is held another way, Memory.Knob).
	ShareFlag string
	// Sleep is how the node sleeps and wakes it; SleepLevels the
	// spec.engine.sleepLevel values it takes (none: the field is refused).
	Sleep       SleepAPI
	SleepLevels []int
	// SleepFlags are the flags that turn its sleep API on.
	SleepFlags []string
	// Adapters is how it takes LoRA adapters; LoadPath and UnloadPath are
	// the routes of a run-time load; NoAdapters says why it takes none.
	Adapters             AdapterLoad
	LoadPath, UnloadPath string
	NoAdapters           string
	// ConcurrencyFlag is the flag that says how many requests it runs at
	// once (read by the gateway as the replica's in-flight cap);
	// ConcurrencyEnv the environment variable that says it where no flag
	// does; DefaultConcurrency what it runs without either (0: unknown,
	// sized from the card).
	ConcurrencyFlag, ConcurrencyEnv string
	DefaultConcurrency              int
	// Slots says each request runs in a slot of its own (llama.cpp): the
	// gateway pins a tenant's requests to its slots.
	Slots bool
	// Running and Waiting are the Prometheus gauges of its /metrics the
	// agent reads ("" for an engine without /metrics).
	Running, Waiting string
	// HealthPath answers 200 once it serves.
	HealthPath string
	// StartTimeout is how long one start may take by default;
	// StartsAlone says no other engine may start on its cards meanwhile
	// (it sizes itself from the card's free memory at start).
	StartTimeout time.Duration
	StartsAlone  bool
	// KeyArgs and KeyEnv are the flags and environment variables that
	// set its API key (the node's to set: a deployment's are refused).
	KeyArgs, KeyEnv []string
	// CacheSalt says it keys its prefix cache by a request's cache_salt.
	CacheSalt bool
	// Choices says it answers n > 1 choices in one request.
	Choices bool
	// OpenAIArgs says it takes vLLM's serving flags (--max-model-len,
	// --runner, --scheduling-policy) as the sim engine does.
	VLLMArgs bool
	// Dialect says a sim engine may speak its API (spec.engine.dialect).
	Dialect bool
}

// table holds one row per kind, in the order messages list them.
var table = []Engine{
	{
		Kind: VLLM, Name: "vLLM", ShareFlag: "--gpu-memory-utilization",
		Sleep: SleepVLLM, SleepLevels: []int{1, 2}, SleepFlags: []string{"--enable-sleep-mode"},
		Adapters: AdaptersAtRunTime, LoadPath: "/v1/load_lora_adapter", UnloadPath: "/v1/unload_lora_adapter",
		ConcurrencyFlag: "--max-num-seqs",
		Running:         "vllm:num_requests_running", Waiting: "vllm:num_requests_waiting",
		HealthPath: "/health",
		// vLLM reads the weights (from network storage, for a large
		// model), then profiles memory and captures CUDA graphs.
		StartTimeout: 30 * time.Minute,
		// Its memory profiling charges every change of the device's free
		// memory during its start to its own use (vllm issue 55827).
		StartsAlone: true,
		KeyArgs:     []string{"--api-key"}, KeyEnv: []string{"VLLM_API_KEY"},
		CacheSalt: true, Choices: true, VLLMArgs: true, Dialect: true,
	},
	{
		Kind: LlamaCpp, Name: "llama.cpp",
		Adapters:        AdaptersAtStart,
		ConcurrencyFlag: "--parallel", ConcurrencyEnv: "LLAMA_ARG_N_PARALLEL", DefaultConcurrency: 4, Slots: true,
		Running: "llamacpp:requests_processing", Waiting: "llamacpp:requests_deferred",
		HealthPath: "/health",
		// llama-server maps a GGUF file and copies its layers to the
		// card; it fits its context to the free memory it finds (--fit).
		StartTimeout: 10 * time.Minute, StartsAlone: true,
		KeyArgs: []string{"--api-key", "--api-key-file"}, KeyEnv: []string{"LLAMA_API_KEY", "LLAMA_ARG_API_KEY", "LLAMA_ARG_API_KEY_FILE"},
		Dialect: true,
	},
	{
		Kind: Ollama, Name: "Ollama",
		Sleep:          SleepKeepAlive,
		NoAdapters:     "engine ollama cannot load LoRA adapters at run time (an adapter is a separate Ollama model): use kind vllm, sglang, llamacpp or sim, or deploy the adapter as its own model",
		ConcurrencyEnv: "OLLAMA_NUM_PARALLEL", DefaultConcurrency: 1,
		HealthPath: "/api/version",
		// The start includes the preload: creating the model from a GGUF
		// file and loading it (OLLAMA_LOAD_TIMEOUT, 5 minutes).
		StartTimeout: 10 * time.Minute,
		Dialect:      true,
	},
	{
		// python/sglang/srt/entrypoints/http_server.py (routes),
		// server_args.py (flags), managers/io_struct.py (bodies),
		// metrics/collector.py (gauges, with --enable-metrics).
		Kind: SGLang, Name: "SGLang", ShareFlag: "--mem-fraction-static",
		Sleep: SleepMemoryOccupation, SleepFlags: []string{"--enable-memory-saver", "--enable-weights-cpu-backup"},
		Adapters: AdaptersAtRunTime, LoadPath: "/load_lora_adapter", UnloadPath: "/unload_lora_adapter",
		ConcurrencyFlag: "--max-running-requests",
		Running:         "sglang:num_running_reqs", Waiting: "sglang:num_queue_reqs",
		HealthPath: "/health",
		// SGLang reads the weights, sizes its KV pool from what the card
		// has free (mem-fraction-static counts everything on the card)
		// and captures CUDA graphs.
		StartTimeout: 30 * time.Minute, StartsAlone: true,
		KeyArgs: []string{"--api-key"},
		Dialect: true,
	},
	{
		Kind: Command, Name: "a command engine",
		NoAdapters: "engine command has no adapter API the node can drive: use kind vllm, sglang, llamacpp or sim",
		// A user's program: long enough for a small model, short enough
		// that one that never listens does not hold its cards for long.
		StartTimeout: 5 * time.Minute,
		// It may size itself from the free memory as vLLM does.
		StartsAlone: true,
	},
	{
		Kind: Sim, Name: "the sim engine", ShareFlag: "--memory-mib",
		Sleep: SleepVLLM, SleepLevels: []int{1, 2},
		Adapters: AdaptersAtRunTime, LoadPath: "/v1/load_lora_adapter", UnloadPath: "/v1/unload_lora_adapter",
		ConcurrencyFlag: "--max-num-seqs",
		Running:         "vllm:num_requests_running", Waiting: "vllm:num_requests_waiting",
		HealthPath: "/health",
		// Ready after its --load-seconds (1 s by default).
		StartTimeout: 2 * time.Minute,
		CacheSalt:    true, VLLMArgs: true,
	},
}

// Kinds lists every kind, Default first.
func Kinds() []string {
	out := make([]string, len(table))
	for i, e := range table {
		out[i] = e.Kind
	}
	return out
}

// Dialects lists the engines a sim engine may speak.
func Dialects() []string {
	var out []string
	for _, e := range table {
		if e.Dialect {
			out = append(out, e.Kind)
		}
	}
	return out
}

// Lookup returns kind's row, or an error naming the known kinds.
func Lookup(kind string) (Engine, error) {
	if i := slices.IndexFunc(table, func(e Engine) bool { return e.Kind == kind }); i >= 0 {
		return table[i], nil
	}
	return Engine{}, fmt.Errorf("unknown engine kind %q; known kinds: %s", kind, strings.Join(Kinds(), ", "))
}

// Known says whether kind is in the table.
func Known(kind string) bool {
	_, err := Lookup(kind)
	return err == nil
}

// Dialect is the engine a sim engine answers as: spec.engine.dialect,
// else, for a spec stored before the field, the last --dialect of its
// arguments; "" for none or another kind. It is the one place a dialect
// is read.
func Dialect(e *pb.EngineSpec) string {
	if e.GetKind() != Sim {
		return ""
	}
	if d := e.GetDialect(); d != "" {
		return d
	}
	d := ""
	args := e.GetArgs()
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, "--dialect="); ok {
			d = v
		} else if a == "--dialect" && i+1 < len(args) {
			d = args[i+1]
		}
	}
	return d
}

// SpeaksKind is the kind whose API e's engine speaks: its kind, or for a
// sim engine with a known dialect the engine it stands for.
func SpeaksKind(e *pb.EngineSpec) string {
	if d := Dialect(e); d != "" && slices.Contains(Dialects(), d) {
		return d
	}
	return e.GetKind()
}

// Speaks is the row of the API e's engine speaks (SpeaksKind); ok is false
// for a kind the table does not hold.
func Speaks(e *pb.EngineSpec) (Engine, bool) {
	r, err := Lookup(SpeaksKind(e))
	return r, err == nil
}

// MaxInFlight is how many requests e's engine runs at once where its
// arguments or environment say it: its ConcurrencyFlag, else its
// ConcurrencyEnv, else its DefaultConcurrency; 0 for unknown. llama.cpp's
// slots are read by the caller that knows its flag's short forms.
func (r Engine) MaxInFlight(e *pb.EngineSpec) int {
	if r.ConcurrencyFlag != "" {
		if n, _ := strconv.ParseUint(ArgValue(e.GetArgs(), r.ConcurrencyFlag), 10, 64); n > 0 {
			return int(min(n, 1<<16))
		}
	}
	if r.ConcurrencyEnv != "" {
		if n, err := strconv.ParseUint(strings.TrimSpace(e.GetEnv()[r.ConcurrencyEnv]), 10, 32); err == nil && n > 0 {
			return int(min(n, 1<<16))
		}
	}
	return r.DefaultConcurrency
}

// ArgValue is the value of flag in args (--flag V or --flag=V, the first
// wins, as the agent has always read it), "" if absent.
func ArgValue(args []string, flag string) string {
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, flag+"="); ok {
			return v
		}
		if a == flag && i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}

// CheckDialect says why e's dialect is not acceptable, or "": only a sim
// engine takes one, and only an engine of the table that a sim speaks.
func CheckDialect(e *pb.EngineSpec) string {
	d := e.GetDialect()
	switch {
	case d == "":
		return ""
	case e.GetKind() != Sim:
		return fmt.Sprintf("only a sim engine takes a dialect (kind is %q)", e.GetKind())
	case !slices.Contains(Dialects(), d):
		return fmt.Sprintf("must be one of %s, got %q", strings.Join(Dialects(), ", "), d)
	}
	return ""
}

// KindsMarkdown is the table of kinds as docs/engines.md shows it.
func KindsMarkdown() string {
	var b strings.Builder
	b.WriteString("| kind | share flag | sleep and wake | adapters | requests at once | metrics (running, waiting) | health | start deadline | API key | sim dialect |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|\n")
	or := func(s, none string) string {
		if s == "" {
			return none
		}
		return s
	}
	code := func(ss ...string) string {
		var out []string
		for _, s := range ss {
			if s != "" {
				out = append(out, "`"+s+"`")
			}
		}
		return strings.Join(out, ", ")
	}
	for _, e := range table {
		sleep := map[SleepAPI]string{
			SleepStartStop:        "stop and start",
			SleepVLLM:             "`/sleep?level=N`, `/wake_up`",
			SleepKeepAlive:        "`keep_alive` 0 unloads, a request loads",
			SleepMemoryOccupation: "`/release_memory_occupation`, `/resume_memory_occupation`",
		}[e.Sleep]
		if len(e.SleepFlags) > 0 {
			sleep += " (" + code(e.SleepFlags...) + ")"
		}
		if len(e.SleepLevels) > 0 {
			sleep += fmt.Sprintf("; levels %v", e.SleepLevels)
		}
		ad := map[AdapterLoad]string{AdaptersNone: "none", AdaptersAtRunTime: "at run time: " + code(e.LoadPath, e.UnloadPath), AdaptersAtStart: "at start, on the command line"}[e.Adapters]
		conc := or(code(e.ConcurrencyFlag, e.ConcurrencyEnv), "unknown")
		if e.DefaultConcurrency > 0 {
			conc += fmt.Sprintf(", else %d", e.DefaultConcurrency)
		}
		if e.Slots {
			conc += " (slots)"
		}
		dialect := "no"
		if e.Dialect {
			dialect = "yes"
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", e.Kind, or(code(e.ShareFlag), "none"), sleep, ad, conc,
			or(code(e.Running, e.Waiting), "none"), or(code(e.HealthPath), "a live process"), e.StartTimeout, or(code(append(slices.Clone(e.KeyArgs), e.KeyEnv...)...), "none"), dialect)
	}
	return b.String()
}
