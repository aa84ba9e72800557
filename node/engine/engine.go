package engine

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/gpuplane/gpuplane/internal/engines"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// Engine kinds, as the table (internal/engines) names them.
const (
	KindVLLM     = engines.VLLM
	KindLlamaCpp = engines.LlamaCpp
	KindOllama   = engines.Ollama
	KindSGLang   = engines.SGLang
	KindCommand  = engines.Command
	KindSim      = engines.Sim
)

// Params is everything a driver needs to build one replica's command.
type Params struct {
	// Model is the deployment's name.
	Model string
	Spec  *pb.ModelSpec
	// Replica is the placement: cards (indexes on this node), the memory
	// share of each card (memory_mib, the only form of the share a node
	// reads) and the compute share.
	Replica *pb.Replica
	// Cards are the replica's cards as this node reports them, in the order
	// of Replica.Cards.
	Cards []*pb.Card
	// Host and Port are where the engine listens.
	Host string
	Port int
	// Self is the gpuplane executable that runs the sim engine.
	Self string
	// MaySleep says the node's residency controller may sleep or unload
	// this replica (a warm or onDemand deployment), so the engine starts
	// with its controls enabled (vLLM's sleep mode).
	MaySleep bool
	// NeighbourMiB is the memory the other replicas placed on the
	// replica's cards reserve (the most on any one card): an engine that
	// sizes itself by the free memory it sees (Ollama) sees theirs gone.
	NeighbourMiB uint64
}

// Command is how to run an engine.
type Command struct {
	// Path is the program: a file name looked up in PATH or a path.
	Path string
	// Args are the arguments after the program name.
	Args []string
	// Env holds KEY=VALUE entries added to the agent's environment; a later
	// entry for the same key wins.
	Env []string
	// HealthPath is the HTTP path that answers 200 once the engine serves
	// requests; empty means the engine has no such endpoint and a live
	// process counts as healthy.
	HealthPath string
	// Preload, when set, runs once per start after HealthPath first
	// answers 200; the engine is ready only once it succeeded (Ollama
	// answers its health path before any model is loaded).
	Preload Preload
}

// Driver builds the command of one engine kind.
type Driver interface {
	// Kind is the spec.engine.kind this driver serves.
	Kind() string
	// Command builds the program, arguments, engine-specific environment and
	// health path; Build adds the card selection and hard limits.
	Command(p Params) (Command, error)
}

// drivers holds one Driver per kind.
var drivers = map[string]Driver{
	KindVLLM:     vllm{},
	KindLlamaCpp: llamaCpp{},
	KindOllama:   ollama{},
	KindSGLang:   sglang{},
	KindCommand:  command{},
	KindSim:      sim{},
}

// For returns the driver of kind, or an error naming the known kinds.
func For(kind string) (Driver, error) {
	if _, err := engines.Lookup(kind); err != nil {
		return nil, err
	}
	if d, ok := drivers[kind]; ok {
		return d, nil
	}
	return nil, fmt.Errorf("engine kind %q has no driver on this node", kind)
}

// Build returns the full command of a replica: the driver's command, then the
// deployment's spec.engine.env, then CUDA_VISIBLE_DEVICES and the hard
// limits of enf. The last two come last so that a deployment cannot widen its
// own cards or limits.
func Build(p Params, enf Enforcement) (Command, error) {
	if err := p.check(); err != nil {
		return Command{}, err
	}
	d, err := For(p.Spec.GetEngine().GetKind())
	if err != nil {
		return Command{}, err
	}
	if err := p.unboundedOnSharedCard(enf); err != nil {
		return Command{}, fmt.Errorf("%s engine for %s: %w", d.Kind(), p.name(), err)
	}
	cmd, err := d.Command(p)
	if err != nil {
		return Command{}, fmt.Errorf("%s engine for %s: %w", d.Kind(), p.name(), err)
	}
	env := p.Spec.GetEngine().GetEnv()
	for _, k := range slices.Sorted(maps.Keys(env)) {
		cmd.Env = append(cmd.Env, k+"="+env[k])
	}
	cmd.Env = append(cmd.Env, p.visibleDevices()...)
	cmd.Env = append(cmd.Env, enf.Env(p)...)
	return cmd, nil
}

func (p Params) check() error {
	var errs []error
	if p.Spec == nil || p.Spec.GetEngine() == nil {
		errs = append(errs, errors.New("no engine spec"))
	}
	if p.Replica == nil {
		errs = append(errs, errors.New("no placement"))
	} else if len(p.Cards) == 0 || len(p.Cards) != len(p.Replica.GetCards()) {
		errs = append(errs, fmt.Errorf("placed on cards %v, but only %d of them are cards of this node", p.Replica.GetCards(), len(p.Cards)))
	} else if mib := p.Replica.GetMemoryMib(); mib > 0 && p.smallestCardMiB() == 0 {
		errs = append(errs, fmt.Errorf("a memory share of %d MiB per card on cards %v whose memory this node does not know: its engine cannot be sized to it", mib, p.Replica.GetCards()))
	}
	if p.Port <= 0 {
		errs = append(errs, fmt.Errorf("invalid port %d", p.Port))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("build engine command for %s: %w", p.name(), err)
	}
	return nil
}

// name is MODEL/INDEX, how users name a replica.
func (p Params) name() string {
	return fmt.Sprintf("%s/%d", p.Model, p.Replica.GetIndex())
}

// visibleDevices selects the replica's cards. vLLM before 0.24 parses
// CUDA_VISIBLE_DEVICES as integers and fails at start on UUIDs, so it gets
// NVML's indexes with CUDA_DEVICE_ORDER=PCI_BUS_ID, under which CUDA
// numbers the cards in NVML's (PCI bus) order; the other engines take
// UUIDs, which cannot name another card whatever the order. A MIG
// instance (NVML's "MIG-" UUIDs) has no index CUDA takes: it is named by
// its UUID whatever the engine (vLLM with MIG needs a version that reads
// them).
func (p Params) visibleDevices() []string {
	mig := slices.ContainsFunc(p.Cards, func(c *pb.Card) bool { return strings.HasPrefix(c.GetUuid(), "MIG-") })
	if p.Spec.GetEngine().GetKind() != KindVLLM || mig {
		return []string{"CUDA_VISIBLE_DEVICES=" + strings.Join(p.uuids(), ",")}
	}
	idx := make([]string, len(p.Cards))
	for i, c := range p.Cards {
		idx[i] = u32(c.GetIndex())
	}
	return []string{"CUDA_DEVICE_ORDER=PCI_BUS_ID", "CUDA_VISIBLE_DEVICES=" + strings.Join(idx, ",")}
}

func (p Params) uuids() []string {
	out := make([]string, len(p.Cards))
	for i, c := range p.Cards {
		out[i] = c.GetUuid()
	}
	return out
}

// servedName is the name clients send as "model": spec.servedModelName,
// else the deployment's name.
func (p Params) servedName() string {
	if n := p.Spec.GetServedModelName(); n != "" {
		return n
	}
	return p.Model
}

// wholeCard says the replica's share is its cards' whole memory (a
// dedicated accelerator without a memory share, or a share of 100 %), or
// that it has none: the engine keeps its own default memory sizing.
func (p Params) wholeCard() bool {
	mib, card := p.Replica.GetMemoryMib(), p.smallestCardMiB()
	return mib == 0 || card > 0 && mib >= card
}

// shareOfCard is the share, memory MiB per card, in a knob whose unit is
// 1/per of the card's memory (per 100 for a percent, 10000 for a decimal
// fraction to four places): the largest value whose MiB of this card,
// counted as the state machine counts them (rounded down), are no more
// than the share. A share of p % of the card thus comes back as p, and no
// engine gets a whole MiB more than its share. cardMiB 0 (unknown) gives 0.
func shareOfCard(mib, cardMiB, per uint64) uint64 {
	if cardMiB == 0 {
		return 0
	}
	return min((per*(mib+1)-1)/cardMiB, per)
}

// fractionOfCard is shareOfCard to four places as a decimal ("0.45").
func fractionOfCard(mib, cardMiB uint64) string {
	return strconv.FormatFloat(float64(shareOfCard(mib, cardMiB, 10000))/10000, 'f', -1, 64)
}

// parallel returns the tensor and pipeline parallel sizes, defaulting to one
// card per replica.
func (p Params) parallel() (tensor, pipeline uint32) {
	tensor, pipeline = p.Spec.GetEngine().GetTensorParallel(), p.Spec.GetEngine().GetPipelineParallel()
	if tensor == 0 {
		tensor = 1
	}
	if pipeline == 0 {
		pipeline = 1
	}
	return tensor, pipeline
}

func (p Params) hostPort() string {
	host := p.Host
	if host == "" {
		host = "0.0.0.0"
	}
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	return host + ":" + strconv.Itoa(p.Port)
}

func (p Params) host() string {
	if p.Host == "" {
		return "0.0.0.0"
	}
	return p.Host
}

func u32(n uint32) string { return strconv.FormatUint(uint64(n), 10) }
func u64(n uint64) string { return strconv.FormatUint(n, 10) }

// ControlKind is the engine kind whose API a replica's engine speaks: its
// kind, or for a sim engine with a dialect the engine it stands for, so
// that the controls, adapters and gateway treat it as that engine
// (engines.SpeaksKind).
func ControlKind(e *pb.EngineSpec) string { return engines.SpeaksKind(e) }

// EngineModel is the name the engine knows the base model by in requests
// when it is not the served name: Ollama knows models only by their names
// in its store (spec.model, "llama3.2:1b", or for a GGUF file the name the
// driver creates it under, OllamaGGUFName), so the gateway sends that. ""
// for engines that serve under the served name (vLLM's
// --served-model-name, llama-server's --alias).
func EngineModel(spec *pb.ModelSpec) string {
	if ControlKind(spec.GetEngine()) != KindOllama {
		return ""
	}
	if m := spec.GetModel(); IsGGUFPath(m) {
		return OllamaGGUFName(m)
	}
	return spec.GetModel()
}
