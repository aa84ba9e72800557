package engine

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"text/template"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// vllm runs `vllm serve`. The share is vLLM's own cap: it sizes its KV cache
// so that the process stays within --gpu-memory-utilization of each card.
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
		args = append(args, "--gpu-memory-utilization", p.fraction())
	}
	if n := e.GetMaxModelLen(); n > 0 {
		args = append(args, "--max-model-len", u32(n))
	}
	var env []string
	if len(p.Spec.GetAdapters()) > 0 {
		// Adapters are loaded and unloaded at run time (runtime LoRA API);
		// the largest rank sizes the LoRA buffers.
		args = append(args, "--enable-lora", "--max-loras", u32(maxAdapters(e)), "--max-lora-rank", u32(maxRank(p.Spec)))
		env = append(env, "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True")
	}
	if p.MaySleep {
		// The sleep endpoints exist only in development mode.
		args = append(args, "--enable-sleep-mode")
		env = append(env, "VLLM_SERVER_DEV_MODE=1")
	}
	args = append(args, e.GetArgs()...)
	return Command{Path: "vllm", Args: args, Env: env, HealthPath: "/health"}, nil
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
	}
	if n := e.GetMaxModelLen(); n > 0 {
		args = append(args, "-c", u32(n))
	}
	if n := len(p.Cards); n > 1 {
		// An even split over the replica's cards (CUDA's ordinals 0..n-1).
		args = append(args, "--tensor-split", strings.TrimSuffix(strings.Repeat("1,", n), ","))
	}
	args = append(args, e.GetArgs()...)
	return Command{Path: "llama-server", Args: args, HealthPath: "/health"}, nil
}

// ollama runs `ollama serve` for one model, configured through its
// environment. OLLAMA_GPU_OVERHEAD reserves the rest of each card, so that
// Ollama's scheduler sizes the model's offload to the share.
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
		var card uint64
		for _, c := range p.Cards {
			if card == 0 || c.GetMemoryMib() < card {
				card = c.GetMemoryMib()
			}
		}
		if share := p.Replica.GetMemoryMib(); card > share {
			env = append(env, "OLLAMA_GPU_OVERHEAD="+u64((card-share)<<20))
		}
	}
	if n := e.GetMaxModelLen(); n > 0 {
		env = append(env, "OLLAMA_CONTEXT_LENGTH="+u32(n))
	}
	if len(p.Cards) > 1 {
		env = append(env, "OLLAMA_SCHED_SPREAD=1")
	}
	args := append([]string{"serve"}, e.GetArgs()...)
	return Command{Path: "ollama", Args: args, Env: env, HealthPath: "/api/version"}, nil
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
	// MemoryPercent is the share of each card (0..100), MemoryFraction the
	// same as a decimal ("0.4"), MemoryMiB the share in MiB.
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
	data := TemplateData{
		Model:            p.Spec.GetModel(),
		ServedModelName:  p.servedName(),
		Deployment:       p.Model,
		Replica:          p.Replica.GetIndex(),
		Host:             p.host(),
		Port:             p.Port,
		MemoryPercent:    p.Replica.GetShareMilli() / 10,
		MemoryFraction:   p.fraction(),
		MemoryMiB:        p.Replica.GetMemoryMib(),
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
	args := []string{"engine", "sim",
		"--host", p.host(),
		"--port", strconv.Itoa(p.Port),
		"--served-model-name", p.servedName(),
		"--memory-mib", u64(p.Replica.GetMemoryMib()),
		"--card-uuids", strings.Join(p.uuids(), ","),
	}
	if c := p.Replica.GetComputePercent(); c > 0 {
		// Busy sim engines on a card split its compute by this weight.
		args = append(args, "--compute-percent", u32(c))
	}
	if len(p.Spec.GetAdapters()) > 0 || p.Spec.GetEngine().GetMaxAdapters() > 0 {
		args = append(args, "--max-loras", u32(maxAdapters(p.Spec.GetEngine())))
	}
	args = append(args, p.Spec.GetEngine().GetArgs()...)
	return Command{Path: p.Self, Args: args, HealthPath: "/health"}, nil
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
