package engine

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"text/template"

	"github.com/gpuplane/gpuplane/internal/engines"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// vllm runs `vllm serve`. vLLM sizes its KV cache so that what it profiles
// stays within --gpu-memory-utilization of each card, and its process then
// goes above that by its overshoot (CUDA graphs, NCCL, allocator memory
// outside the budget; internal/engines): the fraction is the share less
// that overshoot, so that the share is the most the process holds.
type vllm struct{}

func (vllm) Kind() string { return KindVLLM }

func (vllm) Command(p Params) (Command, error) {
	e := p.Spec.GetEngine()
	tensor, pipeline := p.parallel()
	args := []string{"serve", p.Spec.GetModel(),
		"--host", p.host(),
		"--port", strconv.Itoa(p.Port),
		"--served-model-name", p.servedName(),
		"--tensor-parallel-size", u32(tensor),
		"--pipeline-parallel-size", u32(pipeline),
	}
	// A whole card keeps vLLM's default (0.9): asking for 1.0 leaves no room
	// for the CUDA context and fails at start.
	if !p.wholeCard() {
		util, err := p.vllmUtilization()
		if err != nil {
			return Command{}, err
		}
		args = append(args, "--gpu-memory-utilization", util)
	}
	if n := e.GetMaxModelLen(); n > 0 {
		args = append(args, "--max-model-len", u32(n))
	}
	more, env := vllmControlFlags(p)
	args = append(args, more...)
	args = append(args, e.GetArgs()...)
	return Command{Path: "vllm", Args: args, Env: env, HealthPath: "/health"}, nil
}

// vllmControlFlags are the flags and environment that turn on the vLLM
// APIs the node drives; the sim's vllm dialect gets the same, and refuses
// without them as vLLM does.
func vllmControlFlags(p Params) (args, env []string) {
	if len(p.Spec.GetAdapters()) > 0 {
		// Adapters are loaded and unloaded at run time (runtime LoRA API);
		// the largest rank sizes the LoRA buffers.
		args = append(args, "--enable-lora", "--max-loras", u32(maxAdapters(p.Spec.GetEngine())), "--max-lora-rank", u32(maxRank(p.Spec)))
		env = append(env, "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True")
	}
	if p.MaySleep {
		// The sleep endpoints exist only in development mode.
		args = append(args, "--enable-sleep-mode")
		env = append(env, "VLLM_SERVER_DEV_MODE=1")
	}
	return args, env
}

// llamaContext is llama-server's -c for maxModelLen: explicit --parallel N
// slots split -c between them (each gets -c/N) unless --kv-unified, so -c
// is N × maxModelLen for every slot to hold maxModelLen; without
// --parallel llama-server runs 4 slots over one unified cache, each
// request up to all of -c. Empty without a maxModelLen.
func llamaContext(e *pb.EngineSpec) []string {
	n := e.GetMaxModelLen()
	if n == 0 {
		return nil
	}
	slots := LlamaSlots(e)
	if llamaUnified(e) {
		slots = 1
	}
	return []string{"-c", u64(uint64(n) * uint64(slots))}
}

// llamaBoundedContext is llama-server's -c: from maxModelLen where the
// deployment gives one (llamaContext), else, on a shared card, sized to
// the share. Without -c llama-server takes the model's whole trained
// context (128k tokens for many models), and its --fit shrinks it to the
// card's free memory, not to the share. Sized to the share: what the share
// leaves after the weights (the model file) and a tenth for compute
// buffers, over the KV bytes per token the file's metadata gives (f16),
// at most the trained context per slot, rounded down to 256 tokens and at
// least 256. A model file the agent cannot read (a Hugging Face name, a
// missing path) gets llamaFallbackContext per slot. A -c of the
// deployment's own (flag or LLAMA_ARG_CTX_SIZE) is left to it.
func llamaBoundedContext(p Params) []string {
	e := p.Spec.GetEngine()
	if c := llamaContext(e); c != nil || p.wholeCard() {
		return c
	}
	if hasFlag(e.GetArgs(), "-c", "--ctx-size") || e.GetEnv()["LLAMA_ARG_CTX_SIZE"] != "" || slices.ContainsFunc(e.GetArgs(), func(a string) bool { return strings.HasPrefix(a, "--ctx-size=") }) {
		return nil
	}
	slots := uint64(LlamaSlots(e))
	if llamaUnified(e) {
		slots = 1
	}
	g, err := readGGUFShape(p.Spec.GetModel())
	if err != nil {
		return []string{"-c", u64(llamaFallbackContext * slots)}
	}
	return []string{"-c", u64(shareContext(g, p.Replica.GetMemoryMib()*uint64(max(len(p.Replica.GetCards()), 1)), slots))}
}

// llamaFallbackContext is the context per slot of a llama.cpp model on a
// shared card whose file the agent cannot read to size it.
const llamaFallbackContext = 4096

// shareContext is the -c a share of shareMiB holds for model g with slots
// slots each up to its trained context (see llamaBoundedContext).
func shareContext(g ggufShape, shareMiB, slots uint64) uint64 {
	budget := int64(shareMiB<<20) - int64(g.FileBytes) - int64(shareMiB<<20)/10
	ctx := uint64(0)
	if kv := g.KVBytesPerToken(); budget > 0 && kv > 0 {
		ctx = uint64(budget) / kv
	}
	if g.ContextLength > 0 {
		ctx = min(ctx, g.ContextLength*slots)
	}
	return max(ctx/256*256, 256)
}

// llamaNoHostCache turns off llama-server's host-RAM prompt cache
// (--cache-ram, 8192 MiB by default, with idle slots saved to it): it
// keeps prompts' KV by their tokens alone and restores one into whichever
// slot a later request with a similar prompt lands in, whatever tenant or
// adapter computed it (tools/server/server-task.cpp,
// server_prompt_cache::load), and it is host memory no share accounts
// for. Each slot's own prompt cache stays: the gateway gives a tenant's
// requests their own slots (id_slot) and names the adapters of every
// request, and llama-server clears a slot whose adapters change.
var llamaNoHostCache = []string{"--cache-ram", "0"}

// llamaLoRAFlags load the deployment's adapters at start, llama-server's
// only way: --lora per adapter (ids 0.. in spec order, LlamaAdapterIDs),
// and --lora-init-without-apply so that none applies to a request that
// does not name it in its "lora" list (the base model's requests run on
// the base alone).
func llamaLoRAFlags(spec *pb.ModelSpec) []string {
	var out []string
	for _, a := range spec.GetAdapters() {
		out = append(out, "--lora", a.GetSource())
	}
	if len(out) > 0 {
		out = append(out, "--lora-init-without-apply")
	}
	return out
}

// LlamaAdapterIDs maps each adapter of a deployment whose engine speaks
// llama.cpp to its id in llama-server (its place in spec.adapters, the
// order of the --lora flags); nil for other engines, which load adapters
// at run time by name.
func LlamaAdapterIDs(spec *pb.ModelSpec) map[string]int {
	if ControlKind(spec.GetEngine()) != KindLlamaCpp || len(spec.GetAdapters()) == 0 {
		return nil
	}
	out := make(map[string]int, len(spec.GetAdapters()))
	for i, a := range spec.GetAdapters() {
		out[a.GetName()] = i
	}
	return out
}

// LlamaSlots is a llama.cpp engine's slot count: its --parallel (-np),
// else its environment's LLAMA_ARG_N_PARALLEL (llama-server reads it where
// no flag is given), else llama-server's auto, 4 (tools/server/server.cpp:
// "n_parallel is set to auto, using n_parallel = 4 and kv_unified =
// true"). The gateway runs each request in one of them.
func LlamaSlots(e *pb.EngineSpec) int {
	if n, ok := llamaExplicitSlots(e); ok {
		return n
	}
	return 4
}

// llamaExplicitSlots is the slot count --parallel or LLAMA_ARG_N_PARALLEL
// sets (each slot then gets its share of -c, unless the cache is unified);
// ok is false when neither does.
func llamaExplicitSlots(e *pb.EngineSpec) (int, bool) {
	if n, ok := llamaParallel(e.GetArgs()); ok {
		return n, true
	}
	if x, err := strconv.Atoi(strings.TrimSpace(e.GetEnv()["LLAMA_ARG_N_PARALLEL"])); err == nil && x > 0 {
		return min(x, 1<<10), true
	}
	return 0, false
}

// llamaUnified says whether every slot may use the whole -c: auto slots,
// --kv-unified (-kvu), or LLAMA_ARG_KV_UNIFIED set true without a flag.
func llamaUnified(e *pb.EngineSpec) bool {
	if _, explicit := llamaExplicitSlots(e); !explicit {
		return true
	}
	args := e.GetArgs()
	for i := len(args) - 1; i >= 0; i-- {
		switch args[i] {
		case "--kv-unified", "-kvu":
			return true
		case "--no-kv-unified", "-no-kvu":
			return false
		}
	}
	switch strings.ToLower(strings.TrimSpace(e.GetEnv()["LLAMA_ARG_KV_UNIFIED"])) {
	case "1", "true", "on", "enabled":
		return true
	}
	return false
}

// LlamaContext is the context one request to a llama.cpp engine may use,
// in tokens: a -c (--ctx-size) of the deployment's own, else its
// environment's LLAMA_ARG_CTX_SIZE, else the -c the driver derives from
// maxModelLen — divided between explicit slots unless the cache is
// unified. 0: unknown (no -c of any kind).
func LlamaContext(e *pb.EngineSpec) int {
	ctx := uint64(0)
	if c := llamaContext(e); len(c) == 2 {
		ctx, _ = strconv.ParseUint(c[1], 10, 64)
	}
	if v, err := strconv.ParseUint(strings.TrimSpace(e.GetEnv()["LLAMA_ARG_CTX_SIZE"]), 10, 64); err == nil && v > 0 && !hasFlag(e.GetArgs(), "-c", "--ctx-size") {
		ctx = v
	}
	args := e.GetArgs()
	for i, a := range args {
		var v string
		switch {
		case strings.HasPrefix(a, "--ctx-size="):
			v = strings.TrimPrefix(a, "--ctx-size=")
		case (a == "-c" || a == "--ctx-size") && i+1 < len(args):
			v = args[i+1]
		default:
			continue
		}
		if x, err := strconv.ParseUint(v, 10, 64); err == nil && x > 0 {
			ctx = x
		}
	}
	if !llamaUnified(e) {
		ctx /= uint64(LlamaSlots(e))
	}
	return int(min(ctx, 1<<31))
}

// llamaParallel is the positive --parallel (or -np) args set, the last
// one winning; ok is false when none does.
func llamaParallel(args []string) (n int, ok bool) {
	for i, a := range args {
		var v string
		switch {
		case strings.HasPrefix(a, "--parallel="):
			v = strings.TrimPrefix(a, "--parallel=")
		case strings.HasPrefix(a, "-np="):
			v = strings.TrimPrefix(a, "-np=")
		case (a == "--parallel" || a == "-np") && i+1 < len(args):
			v = args[i+1]
		default:
			continue
		}
		if x, err := strconv.Atoi(v); err == nil && x > 0 {
			n, ok = min(x, 1<<10), true
		}
	}
	return n, ok
}

func hasFlag(args []string, names ...string) bool {
	for _, a := range args {
		for _, n := range names {
			if a == n {
				return true
			}
		}
	}
	return false
}

// llamaCpp runs llama.cpp's llama-server with every layer on the GPU. It has
// no memory-fraction knob: its footprint is the weights plus the context
// (-c), so the share is held by the hard limits and the watchdog.
type llamaCpp struct{}

func (llamaCpp) Kind() string { return KindLlamaCpp }

func (llamaCpp) Command(p Params) (Command, error) {
	e := p.Spec.GetEngine()
	args := []string{
		"-m", p.Spec.GetModel(),
		"--host", p.host(),
		"--port", strconv.Itoa(p.Port),
		"--alias", p.servedName(),
		"-ngl", "999",
		// Its request gauges, which the agent reads (engine.ReadLoad).
		"--metrics",
	}
	args = append(args, llamaNoHostCache...)
	args = append(args, llamaBoundedContext(p)...)
	args = append(args, llamaLoRAFlags(p.Spec)...)
	if n := len(p.Cards); n > 1 {
		// An even split over the replica's cards (CUDA's ordinals 0..n-1).
		args = append(args, "--tensor-split", strings.TrimSuffix(strings.Repeat("1,", n), ","))
	}
	args = append(args, e.GetArgs()...)
	return Command{Path: "llama-server", Args: args, HealthPath: "/health"}, nil
}

// ollama runs `ollama serve` for one model, configured through its
// environment. Ollama sizes a model's offload by the free memory the
// driver reports, less OLLAMA_GPU_OVERHEAD (server/sched.go,
// llm/memory.go): the neighbours' memory is already missing from the free
// memory, so the overhead reserves only the part of the card that neither
// the share nor the neighbours' reservations hold. It is ready once its
// model is loaded (a preload), not when `ollama serve` answers.
type ollama struct{}

func (ollama) Kind() string { return KindOllama }

func (ollama) Command(p Params) (Command, error) {
	e := p.Spec.GetEngine()
	env := []string{
		"OLLAMA_HOST=" + p.hostPort(),
		"OLLAMA_MAX_LOADED_MODELS=1",
		"OLLAMA_KEEP_ALIVE=-1",
	}
	if !p.wholeCard() {
		if rest := ollamaOverheadMiB(p.smallestCardMiB(), p.Replica.GetMemoryMib(), p.NeighbourMiB); rest > 0 {
			env = append(env, "OLLAMA_GPU_OVERHEAD="+u64(rest<<20))
		}
	}
	if n := e.GetMaxModelLen(); n > 0 {
		env = append(env, "OLLAMA_CONTEXT_LENGTH="+u32(n))
	}
	if len(p.Cards) > 1 {
		env = append(env, "OLLAMA_SCHED_SPREAD=1")
	}
	args := append([]string{"serve"}, e.GetArgs()...)
	return Command{Path: "ollama", Args: args, Env: env, HealthPath: "/api/version", Preload: newOllamaPreload(p)}, nil
}

// ollamaOverheadMiB is OLLAMA_GPU_OVERHEAD in MiB for a share of a card
// whose other replicas reserve neighbours: what Ollama would see free
// beyond the share once the neighbours hold their reservations.
func ollamaOverheadMiB(card, share, neighbours uint64) uint64 {
	if card <= share+neighbours {
		return 0
	}
	return card - share - neighbours
}

// command runs a user's program: spec.engine.args is the whole command line,
// each argument a text/template over TemplateData.
type command struct{}

func (command) Kind() string { return KindCommand }

// TemplateData is what a command engine's arguments may refer to, e.g.
// `--port={{.Port}}` or `--mem={{.MemoryMiB}}`.
type TemplateData struct {
	Model           string
	ServedModelName string
	// Deployment is the deployment's name; Replica the replica's ordinal.
	Deployment string
	Replica    uint32
	Host       string
	Port       int
	// MemoryMiB is the share of each card in MiB, the bound the node's
	// watchdog holds the engine to; MemoryPercent (0..100) and
	// MemoryFraction (a decimal to four places, "0.45") are the same share
	// of the smallest of its cards, never a whole MiB more (shareOfCard).
	MemoryPercent    uint32
	MemoryFraction   string
	MemoryMiB        uint64
	ComputePercent   uint32
	MaxModelLen      uint32
	TensorParallel   uint32
	PipelineParallel uint32
	// CardUUIDs is comma-separated, in CUDA_VISIBLE_DEVICES order.
	CardUUIDs string
}

func (command) Command(p Params) (Command, error) {
	e := p.Spec.GetEngine()
	if len(e.GetArgs()) == 0 {
		return Command{}, errors.New("spec.engine.args must hold the command line of a command engine")
	}
	tensor, pipeline := p.parallel()
	mib, card := p.Replica.GetMemoryMib(), p.smallestCardMiB()
	data := TemplateData{
		Model:            p.Spec.GetModel(),
		ServedModelName:  p.servedName(),
		Deployment:       p.Model,
		Replica:          p.Replica.GetIndex(),
		Host:             p.host(),
		Port:             p.Port,
		MemoryPercent:    uint32(shareOfCard(mib, card, 100)),
		MemoryFraction:   fractionOfCard(mib, card),
		MemoryMiB:        mib,
		ComputePercent:   p.Replica.GetComputePercent(),
		MaxModelLen:      e.GetMaxModelLen(),
		TensorParallel:   tensor,
		PipelineParallel: pipeline,
		CardUUIDs:        strings.Join(p.uuids(), ","),
	}
	argv := make([]string, len(e.GetArgs()))
	for i, a := range e.GetArgs() {
		t, err := template.New("arg").Option("missingkey=error").Parse(a)
		if err != nil {
			return Command{}, fmt.Errorf("spec.engine.args[%d]: %w", i, err)
		}
		var b strings.Builder
		if err := t.Execute(&b, data); err != nil {
			return Command{}, fmt.Errorf("spec.engine.args[%d]: %w", i, err)
		}
		argv[i] = b.String()
	}
	return Command{Path: argv[0], Args: argv[1:]}, nil
}

// sim runs the built-in sim engine, `gpuplane engine sim`, sized to the
// share; spec.engine.args pass through, so a deployment can override any
// flag (a later flag wins).
type sim struct{}

func (sim) Kind() string { return KindSim }

func (sim) Command(p Params) (Command, error) {
	if p.Self == "" {
		return Command{}, errors.New("the gpuplane executable is unknown")
	}
	// A dialect's engine is given its knob as that engine's driver gives
	// it: the share less the engine's overshoot, which the dialect adds.
	knob, err := p.knobMiB()
	if err != nil {
		return Command{}, err
	}
	args := []string{"engine", "sim",
		"--host", p.host(),
		"--port", strconv.Itoa(p.Port),
		"--served-model-name", p.servedName(),
		"--memory-mib", u64(knob),
		"--card-mib", u64(p.smallestCardMiB()),
		"--card-uuids", strings.Join(p.uuids(), ","),
	}
	if c := p.Replica.GetComputePercent(); c > 0 {
		// Busy sim engines on a card split its compute by this weight.
		args = append(args, "--compute-percent", u32(c))
	}
	if len(p.Spec.GetAdapters()) > 0 || p.Spec.GetEngine().GetMaxAdapters() > 0 {
		args = append(args, "--max-loras", u32(maxAdapters(p.Spec.GetEngine())))
	}
	cmd := Command{Path: p.Self, HealthPath: "/health"}
	// A dialect gets what its engine's driver gives that engine, so the
	// strict sim refuses whatever the real engine would.
	d := engines.Dialect(p.Spec.GetEngine())
	if f := p.Spec.GetEngine().GetDialect(); f != "" {
		// spec.engine.dialect; a spec stored before the field carries
		// it in its arguments, which come last.
		args = append(args, "--dialect", f)
	}
	switch d {
	case KindVLLM:
		more, env := vllmControlFlags(p)
		args = append(args, more...)
		cmd.Env = env
	case KindLlamaCpp:
		args = append(args, "--metrics")
		args = append(args, llamaNoHostCache...)
		args = append(args, llamaContext(p.Spec.GetEngine())...)
		args = append(args, llamaLoRAFlags(p.Spec)...)
	case KindSGLang:
		if !p.wholeCard() {
			f, err := p.sglangFraction()
			if err != nil {
				return Command{}, err
			}
			args = append(args, "--mem-fraction-static", f)
		}
		args = append(args, sglangControlFlags(p)...)
	case KindOllama:
		// Ollama knows the model by its tag, not the served name.
		args[slices.Index(args, "--served-model-name")+1] = p.ControlModel()
		cmd.Env = []string{"OLLAMA_KEEP_ALIVE=-1"}
		cmd.HealthPath, cmd.Preload = "/api/version", newOllamaPreload(p)
	}
	cmd.Args = append(args, p.Spec.GetEngine().GetArgs()...)
	return cmd, nil
}

// maxAdapters is engine.maxAdapters, 4 when unset (docs/residency.md).
func maxAdapters(e *pb.EngineSpec) uint32 {
	if n := e.GetMaxAdapters(); n > 0 {
		return n
	}
	return 4
}

// maxRank is the largest rank of spec's adapters: vLLM's --max-lora-rank
// takes 8, 16, 32, 64, 128, 256, 320 or 512, so it is rounded up to one.
func maxRank(spec *pb.ModelSpec) uint32 {
	var r uint32
	for _, a := range spec.GetAdapters() {
		r = max(r, a.GetRank())
	}
	for _, v := range []uint32{8, 16, 32, 64, 128, 256, 320, 512} {
		if r <= v {
			return v
		}
	}
	return 512
}
