package descriptor

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/gpuplane/gpuplane/fsm"
	"github.com/gpuplane/gpuplane/internal/cardfit"
	"github.com/gpuplane/gpuplane/internal/class"
	"github.com/gpuplane/gpuplane/internal/engines"
	"github.com/gpuplane/gpuplane/internal/wireenum"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// AcceleratorSpec is the spec of an Accelerator document. The optional
// numbers are pointers so that a value the user set can be told from a
// default: setting maxModels on a dedicated accelerator is an error, leaving
// it out is not.
type AcceleratorSpec struct {
	Device string `json:"device"`
	// Tenancy is "dedicated" (the default) or "shared", in any case.
	Tenancy string `json:"tenancy,omitempty"`
	// MaxModels is for shared accelerators only: models per card (default 2).
	MaxModels *int64 `json:"maxModels,omitempty"`
	// DevicesPerReplica is whole cards per replica on one node (default 1);
	// a shared accelerator allows only 1.
	DevicesPerReplica *int64 `json:"devicesPerReplica,omitempty"`
}

// Defaults for accelerator fields the user left out.
const (
	DefaultSharedMaxModels   = 2
	DefaultDevicesPerReplica = 1
)

// ModelDeploymentSpec is the spec of a ModelDeployment document. Parse fills
// in ServedModelName, Replicas, Engine.Kind, Engine.TensorParallel and
// Engine.PipelineParallel when the file leaves them out.
type ModelDeploymentSpec struct {
	// Model is the path or URI of the weights.
	Model           string    `json:"model"`
	ServedModelName string    `json:"servedModelName,omitempty"`
	Replicas        *int64    `json:"replicas,omitempty"`
	Placement       Placement `json:"placement"`
	Engine          Engine    `json:"engine"`
	// Resources is a gpuplane extension to docs/descriptors.md: what each replica needs
	// from its node besides cards, so that the scheduler does not crowd a
	// node's host CPU or memory. Optional; absent means "not tracked".
	Resources *HostResources `json:"resources,omitempty"`
	// Residency is pinned (the default), warm or onDemand (docs/residency.md), in
	// any case; warm and onDemand need a shared accelerator.
	Residency string `json:"residency,omitempty"`
	// Priority is interactive, standard (the default) or background.
	Priority string `json:"priority,omitempty"`
	// SLO is an optional latency target.
	SLO *SLO `json:"slo,omitempty"`
	// Adapters are LoRA adapters on this base model (docs/residency.md).
	Adapters []Adapter `json:"adapters,omitempty"`
	// Aliases are other names the gateway serves the deployment under:
	// endpoints on the same replicas, so on the same resident copy of the
	// weights (a gpuplane extension to docs/residency.md's variants).
	Aliases []string `json:"aliases,omitempty"`
	// Idle overrides the residency controller's idle timeouts for this
	// deployment: `idle: {sleepAfter: 2m, unloadAfter: 10m}`.
	Idle *Idle `json:"idle,omitempty"`
}

// Idle is a deployment's idle timeouts (docs/residency.md): how long a warm
// or onDemand model may sit idle before it is put to sleep, and how long an
// onDemand one may sleep before it is unloaded. Left out, the card's.
type Idle struct {
	SleepAfter  *Duration `json:"sleepAfter,omitempty"`
	UnloadAfter *Duration `json:"unloadAfter,omitempty"`
}

// MaxIdleTimeout bounds spec.idle's timeouts (the server holds deployments
// to the same bound, fsm.MaxIdleSeconds).
const MaxIdleTimeout = 7 * 24 * time.Hour

// Adapter is one LoRA adapter: `{name: sql, source: /adapters/sql, rank: 16}`,
// with `tenants: [acme]` to keep it private to those tenants.
type Adapter struct {
	Name    string   `json:"name"`
	Source  string   `json:"source"`
	Rank    *int64   `json:"rank"`
	Tenants []string `json:"tenants,omitempty"`
}

// SLO is a deployment's latency target: `slo: {ttftMs: 800}`.
type SLO struct {
	// TTFTMs is the p95 time to first token in milliseconds, > 0.
	TTFTMs *int64 `json:"ttftMs"`
}

// HostResources is the optional `resources` block of a deployment (a
// gpuplane extension to docs/descriptors.md):
//
//	resources: {cpu: 500m, memory: 8Gi}   # cpu also as 2 or 0.5 cores
type HostResources struct {
	CPU    *CPU      `json:"cpu,omitempty"`
	Memory *Quantity `json:"memory,omitempty"`
}

// Placement says where a deployment's replicas may run.
type Placement struct {
	// Accelerator is required: the scheduler never picks hardware kinds.
	Accelerator  string            `json:"accelerator"`
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`
}

// Engine describes the inference engine and the share of a card it gets.
type Engine struct {
	Kind string `json:"kind,omitempty"`
	// MemoryPercent and Memory are alternative memory shares (not both).
	MemoryPercent    *int64            `json:"memoryPercent,omitempty"`
	Memory           *Quantity         `json:"memory,omitempty"`
	ComputePercent   *int64            `json:"computePercent,omitempty"`
	MaxModelLen      *int64            `json:"maxModelLen,omitempty"`
	TensorParallel   *int64            `json:"tensorParallel,omitempty"`
	PipelineParallel *int64            `json:"pipelineParallel,omitempty"`
	Args             []string          `json:"args,omitempty"`
	Env              map[string]string `json:"env,omitempty"`
	// StartTimeout is how long one start of the engine may take to become
	// ready before the replica is Failed (default: the engine kind's).
	StartTimeout *Duration `json:"startTimeout,omitempty"`
	// Quantization is the weights' numeric format (bf16, fp8, awq, q4_k_m),
	// one word; part of the model's identity.
	Quantization string `json:"quantization,omitempty"`
	// MaxAdapters is how many adapters the engine keeps on the card at
	// once (default 4; vLLM --max-loras).
	MaxAdapters *int64 `json:"maxAdapters,omitempty"`
	// MaxInFlight is how many requests the gateway lets into one replica's
	// engine at once, overriding what it learns from the engine's
	// arguments (--max-num-seqs, llama.cpp slots, OLLAMA_NUM_PARALLEL).
	MaxInFlight *int64 `json:"maxInFlight,omitempty"`
	// Dialect, for a sim engine only, is the engine it answers as,
	// strictly: one of engines.Dialects() (docs/engines.md).
	Dialect string `json:"dialect,omitempty"`
	// SleepLevel is the vLLM sleep level a warm or onDemand replica
	// sleeps at: 1 (the default) keeps the weights in host RAM, 2 discards
	// them and a wake reloads them from disk.
	SleepLevel *int64 `json:"sleepLevel,omitempty"`
}

// SimDialects are the values spec.engine.dialect takes (internal/engines).
var SimDialects = engines.Dialects()

// EngineKinds are the engines a deployment may name; the first is the
// default (internal/engines).
var EngineKinds = engines.Kinds()

// Defaults for deployment fields the user left out.
const (
	DefaultReplicas = 1
	DefaultParallel = 1
)

// MaxStartTimeout bounds spec.engine.startTimeout: a day is more than any
// engine needs to load, and the API carries whole seconds as uint32. The
// server holds deployments to the same bound (fsm.MaxStartTimeoutSeconds).
const MaxStartTimeout = 24 * time.Hour

// CheckName checks that name is a DNS label (docs/descriptors.md rule 1) and returns the
// violation for field, or nil. The wording is the server's (fsm.ValidateName).
func CheckName(field, name string) *pb.Violation {
	if v := fsm.ValidateName(field, name); len(v) > 0 {
		return v[0]
	}
	return nil
}

// ParseTenancy maps "dedicated" or "shared", in any case, to its enum; an
// empty string is the default, dedicated.
func ParseTenancy(s string) (pb.Tenancy, bool) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "dedicated":
		return pb.Tenancy_TENANCY_DEDICATED, true
	case "shared":
		return pb.Tenancy_TENANCY_SHARED, true
	}
	return pb.Tenancy_TENANCY_UNSPECIFIED, false
}

// ParseResidency maps pinned, warm or onDemand, in any case, to its enum;
// an empty string is the default, pinned (cardfit.ParseResidency).
func ParseResidency(s string) (pb.Residency, bool) {
	r, ok := cardfit.ParseResidency(s)
	if !ok {
		return pb.Residency_RESIDENCY_UNSPECIFIED, false
	}
	return wireenum.ResidencyPB(r), true
}

// ParsePriority maps interactive, standard or background, in any case, to
// its enum (class.Parse); an empty string is the default, standard.
func ParsePriority(s string) (pb.Priority, bool) {
	if strings.TrimSpace(s) == "" {
		return pb.Priority_PRIORITY_STANDARD, true
	}
	c, ok := class.Parse(s)
	if !ok {
		return pb.Priority_PRIORITY_UNSPECIFIED, false
	}
	return wireenum.Priority(c), true
}

// Check reports the problems of an accelerator spec that need no cluster
// state: a device is named, the tenancy is known, rule 3 (a shared
// accelerator splits a single device) and rule 4's "maxModels is for shared
// accelerators only and is between 1 and 64". Whether the device kind exists
// and devicesPerReplica fits its MAX/NODE is for the server to say.
func (s *AcceleratorSpec) Check() []*pb.Violation {
	return s.check(func(string) bool { return false })
}

// check is Check with knowledge of fields that failed structurally: when
// tenancy itself could not be read, the tenancy-dependent rules are skipped
// rather than judged against the default.
//
// The rules themselves are the server's (fsm.ValidateAcceleratorSpec), run
// on the spec as written, so that the CLI and the server word them the same;
// only what the API's numbers cannot carry (an explicit 0, a negative number,
// an unknown tenancy word) is judged here.
func (s *AcceleratorSpec) check(failed func(path string) bool) []*pb.Violation {
	var out []*pb.Violation
	local := map[string]bool{}
	add := func(field, format string, args ...any) {
		local[field] = true
		out = append(out, &pb.Violation{Field: field, Description: fmt.Sprintf(format, args...)})
	}
	tenancy, ok := ParseTenancy(s.Tenancy)
	if !ok {
		add("spec.tenancy", "must be dedicated or shared, got %q", s.Tenancy)
	}
	// A typo such as "tenacy: shared" leaves Tenancy empty; judging
	// maxModels against the dedicated default would then mislead.
	tenancyKnown := ok && (s.Tenancy != "" || !failed("spec"))
	raw := &pb.AcceleratorSpec{Device: s.Device, Tenancy: tenancy}
	if n := s.MaxModels; n != nil {
		switch {
		case *n < 1 || *n > math.MaxUint32:
			if !tenancyKnown || tenancy == pb.Tenancy_TENANCY_SHARED {
				add("spec.maxModels", "%s", fsm.MaxModelsRange(*n))
				break
			}
			// On a dedicated accelerator the server's rule 4 says more
			// than the range would.
			raw.MaxModels = 1
		default:
			raw.MaxModels = uint32(*n)
		}
	}
	if n := s.DevicesPerReplica; n != nil {
		switch {
		case *n < 1:
			add("spec.devicesPerReplica", "must be at least 1, got %d", *n)
		case *n > math.MaxUint32:
			add("spec.devicesPerReplica", "must be at most %d, got %d", uint32(math.MaxUint32), *n)
		default:
			raw.DevicesPerReplica = uint32(*n)
		}
	}
	for _, v := range fsm.ValidateAcceleratorSpec(raw) {
		dependsOnTenancy := v.Field == "spec.maxModels" || v.Field == "spec.devicesPerReplica"
		if local[v.Field] || (dependsOnTenancy && !tenancyKnown) {
			continue
		}
		out = append(out, v)
	}
	return inSchemaOrder(out)
}

// Proto converts a spec that passed Check into the API's form, with defaults
// filled in: dedicated {devicesPerReplica: N or 1, maxModels: 0} or shared
// {maxModels: N or 2, devicesPerReplica: 1}. The CLI's `accelerators create`
// and `apply` both go through it, so the same spec always reaches the server
// in the same form and re-applying it is "unchanged".
func (s *AcceleratorSpec) Proto() *pb.AcceleratorSpec {
	tenancy, _ := ParseTenancy(s.Tenancy)
	out := &pb.AcceleratorSpec{Device: s.Device, Tenancy: tenancy}
	switch tenancy {
	case pb.Tenancy_TENANCY_SHARED:
		out.MaxModels = DefaultSharedMaxModels
		if s.MaxModels != nil {
			out.MaxModels = uint32(*s.MaxModels)
		}
		out.DevicesPerReplica = 1
	default:
		out.DevicesPerReplica = DefaultDevicesPerReplica
		if s.DevicesPerReplica != nil {
			out.DevicesPerReplica = uint32(*s.DevicesPerReplica)
		}
	}
	return out
}

// Check reports the problems of a deployment spec that need no other
// document and no cluster state: required fields, value ranges, one memory
// share at most and rule 10's "computePercent needs a memory share". Rules
// that relate the deployment to its accelerator (7, 8, 9) are for the file
// (when it defines the accelerator) or the server to check. `models deploy`
// runs it on a spec built from flags.
func (s *ModelDeploymentSpec) Check() []*pb.Violation {
	return s.check(func(string) bool { return false })
}

// check is Check with knowledge of fields that failed structurally.
//
// The rules are the server's (fsm.ValidateModelSpec), run on the spec as the
// API would carry it, so that the CLI and the server word them the same;
// only what the API cannot carry (0 where 0 means "not set", negative or
// too large numbers, unknown words, durations that are not whole seconds)
// is judged here, in the server's words where it has them.
func (s *ModelDeploymentSpec) check(failed func(path string) bool) []*pb.Violation {
	var out []*pb.Violation
	local := map[string]bool{}
	add := func(field, format string, args ...any) {
		local[field] = true
		out = append(out, &pb.Violation{Field: field, Description: fmt.Sprintf(format, args...)})
	}
	percent := func(field string, v *int64) {
		if v != nil && (*v < 1 || *v > 100) {
			add(field, "%s", fsm.PercentRange(*v))
		}
	}
	// The API carries these numbers as uint32.
	atLeast := func(field string, v *int64, min int64) {
		switch {
		case v == nil:
		case *v < min:
			add(field, "must be at least %d, got %d", min, *v)
		case *v > math.MaxUint32:
			add(field, "must be at most %d, got %d", uint32(math.MaxUint32), *v)
		}
	}
	atLeast("spec.replicas", s.Replicas, 0)
	if a := s.Placement.Accelerator; a != "" {
		if v := CheckName("spec.placement.accelerator", a); v != nil {
			local[v.Field] = true
			out = append(out, v)
		}
	}
	e := s.Engine
	percent("spec.engine.memoryPercent", e.MemoryPercent)
	if e.MemoryPercent != nil && e.Memory != nil {
		add("spec.engine.memory", "%s", fsm.BothMemoryShares)
	}
	percent("spec.engine.computePercent", e.ComputePercent)
	atLeast("spec.engine.maxModelLen", e.MaxModelLen, 1)
	atLeast("spec.engine.tensorParallel", e.TensorParallel, 1)
	atLeast("spec.engine.pipelineParallel", e.PipelineParallel, 1)
	if d := e.StartTimeout; d != nil {
		switch {
		case d.Duration <= 0:
			add("spec.engine.startTimeout", "must be more than 0, got %s", d)
		case d.Duration%time.Second != 0:
			add("spec.engine.startTimeout", "must be a whole number of seconds, got %s", d)
		case d.Duration > MaxStartTimeout:
			add("spec.engine.startTimeout", "must be at most %s, got %s", MaxStartTimeout, d)
		}
	}
	if _, ok := ParseResidency(s.Residency); !ok {
		add("spec.residency", "must be pinned, warm or onDemand, got %q", s.Residency)
	}
	if _, ok := ParsePriority(s.Priority); !ok {
		add("spec.priority", "must be interactive, standard or background, got %q", s.Priority)
	}
	if s.Idle != nil {
		res, _ := ParseResidency(s.Residency)
		for _, f := range []struct {
			field string
			d     *Duration
		}{{"spec.idle.sleepAfter", s.Idle.SleepAfter}, {"spec.idle.unloadAfter", s.Idle.UnloadAfter}} {
			switch d := f.d; {
			case d == nil:
			case res == pb.Residency_RESIDENCY_PINNED:
				add(f.field, "a pinned model is never demoted when idle: only warm and onDemand deployments take idle timeouts")
			case d.Duration < time.Second || d.Duration%time.Second != 0:
				add(f.field, "must be a whole number of seconds, at least 1s, got %s", d)
			case d.Duration > MaxIdleTimeout:
				add(f.field, "must be at most %s, got %s", MaxIdleTimeout, d)
			}
		}
		if s.Idle.UnloadAfter != nil && res == pb.Residency_RESIDENCY_WARM {
			add("spec.idle.unloadAfter", "a warm model is never unloaded when idle (its share stays reserved): only onDemand deployments take it")
		}
	}
	if s.SLO != nil && !failed("spec.slo") {
		if s.SLO.TTFTMs == nil {
			add("spec.slo.ttftMs", "required: the p95 time to first token in milliseconds (leave slo out for no target)")
		} else {
			atLeast("spec.slo.ttftMs", s.SLO.TTFTMs, 1)
		}
	}
	// The dialect, and what a sim speaking another engine cannot do (its
	// adapters, its sleep levels), are the state machine's checks below:
	// the same table (internal/engines) decides for every kind.
	if n := e.SleepLevel; n != nil && (*n < 1 || *n > 2) {
		add("spec.engine.sleepLevel", "must be 1 (the weights wait in host RAM) or 2 (the weights are discarded and a wake reloads them from disk), got %d", *n)
	}
	if n := e.MaxInFlight; n != nil && (*n < 1 || *n > fsm.MaxInFlight) {
		add("spec.engine.maxInFlight", "must be between 1 and %d, got %d", fsm.MaxInFlight, *n)
	}
	if n := e.MaxAdapters; n != nil && (*n < 1 || *n > fsm.MaxAdaptersOnCard) {
		add("spec.engine.maxAdapters", "must be between 1 and %d, got %d", fsm.MaxAdaptersOnCard, *n)
	}
	for i, a := range s.Adapters {
		if a.Rank == nil && !failed(fmt.Sprintf("spec.adapters[%d].rank", i)) {
			add(fmt.Sprintf("spec.adapters[%d].rank", i), "required: the adapter's LoRA rank, 1..%d", fsm.MaxAdapterRank)
		}
	}
	// A share that failed to parse still counts as one: rule 10 would
	// otherwise ask for what the user did write.
	shareFailed := failed("spec.engine.memoryPercent") || failed("spec.engine.memory")
	for _, v := range fsm.ValidateModelSpec(s.Proto()) {
		if local[v.Field] || (shareFailed && v.Field == "spec.engine.computePercent") {
			continue
		}
		// A memory share the file set out of range is still a share:
		// its range is the problem, said above, not rule 10.
		if v.Field == "spec.engine.computePercent" && e.ComputePercent != nil && (e.MemoryPercent != nil || e.Memory != nil) {
			continue
		}
		out = append(out, v)
	}
	return inSchemaOrder(out)
}

// adapters is the API's form of the adapters; a missing rank is sent as 1
// (Check names it), one beyond uint32 as the largest uint32.
func (s *ModelDeploymentSpec) adapters() []*pb.Adapter {
	if len(s.Adapters) == 0 {
		return nil
	}
	out := make([]*pb.Adapter, len(s.Adapters))
	for i, a := range s.Adapters {
		rank := uint32(1)
		if a.Rank != nil {
			rank = uint32(min(max(*a.Rank, 0), math.MaxUint32))
		}
		out[i] = &pb.Adapter{Name: a.Name, Source: a.Source, Rank: rank, Tenants: a.Tenants}
	}
	return out
}

// checkAgainst applies the rules that relate a deployment to its accelerator
// when the same file defines both: the server's (fsm.CheckModelAgainst), so
// that they read the same.
func (s *ModelDeploymentSpec) checkAgainst(name string, acc *AcceleratorSpec) []*pb.Violation {
	spec := s.Proto()
	if spec.Engine.TensorParallel == 0 || spec.Engine.PipelineParallel == 0 {
		// Judge rule 9 by the defaults the deployment will get.
		spec.Engine.TensorParallel, spec.Engine.PipelineParallel = max(spec.Engine.TensorParallel, 1), max(spec.Engine.PipelineParallel, 1)
	}
	return fsm.CheckModelAgainst(spec, name, fsm.NormalizeAcceleratorSpec(acc.Proto()), 0)
}

// schemaOrder lists the spec's fields in the order a descriptor writes them.
var schemaOrder = []string{
	"spec.device", "spec.tenancy", "spec.maxModels", "spec.devicesPerReplica",
	"spec.model", "spec.servedModelName", "spec.replicas", "spec.placement.accelerator", "spec.placement.nodeSelector",
	"spec.engine.kind", "spec.engine.memoryPercent", "spec.engine.memory", "spec.engine.computePercent",
	"spec.engine.maxModelLen", "spec.engine.tensorParallel", "spec.engine.pipelineParallel",
	"spec.engine.args", "spec.engine.env", "spec.engine.startTimeout", "spec.engine.quantization", "spec.engine.maxAdapters", "spec.engine.maxInFlight",
	"spec.engine.dialect", "spec.engine.sleepLevel", "spec.resources", "spec.residency", "spec.priority", "spec.slo", "spec.adapters", "spec.aliases",
	"spec.idle.sleepAfter", "spec.idle.unloadAfter",
}

// inSchemaOrder sorts violations, found here and by the server's rules, by
// their field's place in the descriptor, so that a file's problems read top
// to bottom.
func inSchemaOrder(vs []*pb.Violation) []*pb.Violation {
	rank := func(field string) int {
		for i, f := range schemaOrder {
			if field == f || strings.HasPrefix(field, f+".") || strings.HasPrefix(field, f+"[") {
				return i
			}
		}
		return len(schemaOrder)
	}
	slices.SortStableFunc(vs, func(a, b *pb.Violation) int { return rank(a.Field) - rank(b.Field) })
	return vs
}

// SetDefaults fills in what docs/descriptors.md lets a deployment named name leave out:
// servedModelName (the name), replicas (1), engine kind (vllm), tensor and
// pipeline parallel (1). Parse calls it; so does `models deploy`.
func (s *ModelDeploymentSpec) SetDefaults(name string) {
	if s.ServedModelName == "" {
		s.ServedModelName = name
	}
	if s.Replicas == nil {
		s.Replicas = new(int64(DefaultReplicas))
	}
	if s.Engine.Kind == "" {
		s.Engine.Kind = EngineKinds[0]
	}
	if s.Engine.TensorParallel == nil {
		s.Engine.TensorParallel = new(int64(DefaultParallel))
	}
	if s.Engine.PipelineParallel == nil {
		s.Engine.PipelineParallel = new(int64(DefaultParallel))
	}
}

// Proto converts a spec that passed Check and SetDefaults into the API's
// form. `apply -f` and `models deploy` both go through it, so the same
// deployment always reaches the server in the same form and re-applying it
// is "unchanged". The resources block is sent only when it sets something.
func (s *ModelDeploymentSpec) Proto() *pb.ModelSpec {
	u32 := func(v *int64) uint32 {
		if v == nil {
			return 0
		}
		return uint32(*v)
	}
	e := s.Engine
	out := &pb.ModelSpec{
		Model:           s.Model,
		ServedModelName: s.ServedModelName,
		Replicas:        DefaultReplicas,
		Placement:       &pb.PlacementSpec{Accelerator: s.Placement.Accelerator, NodeSelector: s.Placement.NodeSelector},
		Engine: &pb.EngineSpec{
			Kind:             e.Kind,
			MemoryPercent:    u32(e.MemoryPercent),
			ComputePercent:   u32(e.ComputePercent),
			MaxModelLen:      u32(e.MaxModelLen),
			TensorParallel:   u32(e.TensorParallel),
			PipelineParallel: u32(e.PipelineParallel),
			Args:             e.Args,
			Env:              e.Env,
			Quantization:     e.Quantization,
			SleepLevel:       u32(e.SleepLevel),
			Dialect:          e.Dialect,
		},
	}
	// The defaults (pinned, standard) are sent as unspecified, the form the
	// state machine stores them in.
	if r, _ := ParseResidency(s.Residency); r != pb.Residency_RESIDENCY_PINNED {
		out.Residency = r
	}
	if p, _ := ParsePriority(s.Priority); p != pb.Priority_PRIORITY_STANDARD {
		out.Priority = p
	}
	if s.SLO != nil && s.SLO.TTFTMs != nil {
		out.Slo = &pb.SLO{TtftMs: uint32(*s.SLO.TTFTMs)}
	}
	out.Adapters = s.adapters()
	out.Aliases = s.Aliases
	if i := s.Idle; i != nil && (i.SleepAfter != nil || i.UnloadAfter != nil) {
		out.Idle = &pb.IdleTimeouts{}
		if i.SleepAfter != nil {
			out.Idle.SleepAfterSeconds = uint32(i.SleepAfter.Duration / time.Second)
		}
		if i.UnloadAfter != nil {
			out.Idle.UnloadAfterSeconds = uint32(i.UnloadAfter.Duration / time.Second)
		}
	}
	if e.MaxInFlight != nil {
		out.Engine.MaxInFlight = uint32(*e.MaxInFlight)
	}
	if e.MaxAdapters != nil {
		out.Engine.MaxAdapters = uint32(*e.MaxAdapters)
	}
	if s.Replicas != nil {
		out.Replicas = uint32(*s.Replicas)
	}
	if e.Memory != nil {
		out.Engine.MemoryMib = e.Memory.MiB
	}
	if e.StartTimeout != nil {
		out.Engine.StartTimeoutSeconds = uint32(e.StartTimeout.Duration / time.Second)
	}
	if r := s.Resources; r != nil && (r.CPU != nil || r.Memory != nil) {
		out.Resources = &pb.HostResources{}
		if r.CPU != nil {
			out.Resources.CpuMilli = r.CPU.Milli
		}
		if r.Memory != nil {
			out.Resources.MemoryMib = r.Memory.MiB
		}
	}
	return out
}
