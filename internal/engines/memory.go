package engines

// Rules is the part of the table that says what bounds each engine's
// memory (docs/engines.md, "Memory: what bounds each engine"): per engine
// kind and version, the knob the driver sets, how far the engine's process
// goes above that knob (its overshoot, which the driver subtracts from the
// share so that the share is the most it uses), the watchdog's tolerance
// above the share, where its adapters' memory sits and what neither the
// knob nor the ledger holds. The state machine (which refuses a share too
// small for an engine at apply), the node's drivers, the executor's
// watchdog targets and the card manager's ledger all read the same rule.

import (
	"fmt"
	"strings"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// AdapterPool says when an engine allocates its LoRA adapters' memory.
type AdapterPool int

const (
	// AdaptersPerLoad: each adapter holds its memory from its load to its
	// unload (the sim engine without a dialect).
	AdaptersPerLoad AdapterPool = iota
	// AdaptersPoolAtStart: the engine allocates max_loras × max_lora_rank
	// slots once, at start, out of its memory budget; a load fills a slot
	// and an unload only drops the name (vLLM).
	AdaptersPoolAtStart
	// AdaptersAllAtStart: every adapter is loaded at start (llama.cpp's
	// --lora): part of the base's footprint for the engine's life.
	AdaptersAllAtStart
)

// Rule is what bounds one engine's memory at the versions it names.
type Rule struct {
	// Kind is the engine kind (spec.engine.kind, or the dialect of a sim
	// engine, which follows its engine's rule).
	Kind string
	// Name is how the engine is called in messages ("vLLM").
	Name string
	// Versions names the releases the rule was read from.
	Versions string
	// Knob is what the driver sets to bound the engine's memory.
	Knob string
	// OvershootMiB is how far the engine's process goes above its knob,
	// as measured (OvershootSource): the driver sets the knob this much
	// below the share, and a share no larger than it is refused.
	OvershootMiB    uint64
	OvershootSource string
	// OvershootWhat says what the overshoot is, for messages.
	OvershootWhat string
	// ToleranceMiB is how far above its share the watchdog lets the
	// engine go before it stops it: the spread of the overshoot that the
	// knob cannot absorb. 0 keeps the watchdog's default, the larger of 5 %
	// of the share and 256 MiB (allocator slack no flag controls).
	ToleranceMiB    uint64
	ToleranceSource string
	// Adapters says when the engine allocates its adapters' memory.
	Adapters AdapterPool
	// HostMiB is host RAM the engine holds beside the weights as the
	// driver starts it.
	HostMiB uint64
	// Ledger says what the card's ledger counts, GPU and host.
	Ledger string
	// NotEnforced says what nothing holds.
	NotEnforced string
}

// Rules is the table, one row per engine kind: the node applies the row
// of the versions it names (it does not probe an engine's version).
var Rules = []Rule{
	{
		Kind: VLLM, Name: "vLLM", Versions: "0.21 to 0.28 and main (CUDA-graph memory profiling on)",
		Knob: "--gpu-memory-utilization = (share − overshoot) / card memory (a --kv-cache-memory-bytes in spec.engine.args overrides it, and the watchdog alone holds the total)",
		// vllm-project/vllm PR #51590: at v0.28 the process ends 1.37 GiB
		// above the budget --gpu-memory-utilization requested (CUDA-graph
		// private pool 62 MiB of it; the rest NCCL, cuBLAS workspaces and
		// allocator slack outside the profiled budget); issue #53013.
		OvershootMiB:    1434,
		OvershootSource: "vLLM PR #51590 (1.37 GiB above the requested budget at v0.28), issue #53013",
		OvershootWhat:   "CUDA graphs, NCCL and allocator memory outside --gpu-memory-utilization",
		// vllm-project/vllm issue #57475: the CUDA-graph estimate that
		// sizes the KV pool under-reserves the real capture (0.46 GiB).
		ToleranceMiB:    512,
		ToleranceSource: "vLLM issue #57475 (CUDA-graph capture 0.46 GiB beyond its estimate)",
		Adapters:        AdaptersPoolAtStart,
		Ledger:          "GPU: the share, with the LoRA pool (max_loras × max_lora_rank) inside it from the start; host: nothing (the weights a level-1 sleep moves to host RAM are not counted)",
		NotEnforced:     "free memory moving while it profiles at start or sleeps (the node holds its neighbours' changes until then)",
	},
	{
		Kind: LlamaCpp, Name: "llama.cpp", Versions: "b6000 and later (llama-server)",
		Knob:            "-c (the context: KV cache) with every layer on the GPU; no total-memory knob",
		OvershootSource: "none measured: weights + KV(-c) + compute buffers, which -c does not bound",
		Adapters:        AdaptersAllAtStart,
		// The driver passes --cache-ram 0 (node/engine, llamaNoHostCache):
		// the host-RAM prompt cache (8192 MiB by default) would hold
		// memory no share counts and serve one tenant's prompt to another.
		HostMiB:     0,
		Ledger:      "GPU: the share, every --lora adapter inside it from the start; host: nothing (the driver turns the host-RAM prompt cache off with --cache-ram 0)",
		NotEnforced: "compute buffers above -c (a --cache-ram other than 0 in spec.engine.args or LLAMA_ARG_CACHE_RAM is refused at apply)",
	},
	{
		Kind: Ollama, Name: "Ollama", Versions: "0.30 to 0.33",
		Knob:            "none on the GPU: the runner fits its layers and context to the free memory it sees; OLLAMA_GPU_OVERHEAD is only logged and sizes the default context",
		OvershootSource: "unbounded: it takes what is free",
		Ledger:          "GPU: the share; host: nothing (the layers it leaves on the CPU are not counted)",
		NotEnforced:     "everything on a shared card without MPS or HAMi-core: the node refuses it there",
	},
	{
		Kind: SGLang, Name: "SGLang", Versions: "0.4.6 and later (python/sglang/srt/server_args.py, model_executor/model_runner.py)",
		Knob:            "--mem-fraction-static = (share + the neighbours' reservations) / card memory: SGLang sizes its weights and KV pool so that everything on the card, its neighbours' memory included, stays within that fraction of the whole card",
		OvershootSource: "none measured: CUDA graphs and activations outside the static pool, which SGLang leaves to 1 − mem-fraction-static of the card",
		Adapters:        AdaptersPoolAtStart,
		Ledger:          "GPU: the share, with the LoRA pool (--max-loras-per-batch × --max-lora-rank) inside it from the start; host: nothing (the weights --enable-weights-cpu-backup keeps in host RAM during a sleep are not counted)",
		NotEnforced:     "neighbours holding less than their reservations while it starts (asleep): it then takes the difference too, and the watchdog stops it above its share",
	},
	{
		Kind: Sim, Name: "the sim engine", Versions: "this release, no dialect",
		Knob:        "--memory-mib = the share",
		Adapters:    AdaptersPerLoad,
		Ledger:      "GPU: the share and each loaded adapter (rank × --lora-mib-per-rank)",
		NotEnforced: "nothing: it holds what it is told",
	},
	{
		Kind: Command, Name: "a command engine", Versions: "any",
		Knob:        "what the command line does with {{.MemoryMiB}}",
		Adapters:    AdaptersPerLoad,
		Ledger:      "GPU: the share",
		NotEnforced: "anything the program does not bound itself (the watchdog stops it above its share)",
	},
}

// For returns the memory rule of the engine e describes (a sim engine
// with a dialect follows its engine's); a kind without a rule gets one
// with no overshoot and the watchdog's default tolerance.
func For(e *pb.EngineSpec) Rule {
	return ForKind(SpeaksKind(e))
}

// ForKind returns the rule of an engine kind.
func ForKind(kind string) Rule {
	for _, r := range Rules {
		if r.Kind == kind {
			return r
		}
	}
	return Rule{Kind: kind, Name: kind}
}

// KnobMiB is the memory the engine's knob may be given for a share of
// shareMiB per card: the share less the engine's overshoot. A share no
// larger than the overshoot is refused (TooSmall).
func (r Rule) KnobMiB(shareMiB uint64) (uint64, error) {
	if err := r.TooSmall(shareMiB); err != nil {
		return 0, err
	}
	return shareMiB - r.OvershootMiB, nil
}

// TooSmall refuses a share that the engine's overshoot alone would fill,
// naming both numbers.
func (r Rule) TooSmall(shareMiB uint64) error {
	if r.OvershootMiB == 0 || shareMiB > r.OvershootMiB {
		return nil
	}
	return fmt.Errorf("a memory share of %d MiB per card is too small for %s, which holds %d MiB above its memory knob (%s): give it more than %d MiB (docs/engines.md)",
		shareMiB, r.Name, r.OvershootMiB, r.OvershootWhat, r.OvershootMiB)
}

// Markdown is the table of Rules as docs/engines.md shows it.
func Markdown() string {
	var b strings.Builder
	b.WriteString("| engine | versions | knob that bounds its memory | overshoot allowed for, and its source | watchdog tolerance above the share | the ledger counts | not enforced |\n")
	b.WriteString("|---|---|---|---|---|---|---|\n")
	for _, r := range Rules {
		over := "none"
		switch {
		case r.OvershootMiB > 0:
			over = fmt.Sprintf("%d MiB: the knob is set that much below the share (%s); %s", r.OvershootMiB, r.OvershootWhat, r.OvershootSource)
		case r.OvershootSource != "":
			over = r.OvershootSource
		}
		tol := "max(5 % of the share, 256 MiB)"
		if r.ToleranceMiB > 0 {
			tol = fmt.Sprintf("%d MiB: %s", r.ToleranceMiB, r.ToleranceSource)
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %s | %s | %s |\n", r.Kind, r.Versions, r.Knob, over, tol, r.Ledger, r.NotEnforced)
	}
	return b.String()
}
