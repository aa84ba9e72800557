package fsm

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/gpuplane/gpuplane/internal/catalog"
	"github.com/gpuplane/gpuplane/internal/engines"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// EngineKinds are the engine kinds a deployment may name (the table,
// internal/engines).
var EngineKinds = engines.Kinds()

// MaxReplicas bounds one deployment's replica count.
const MaxReplicas = 1024

// MaxStartTimeoutSeconds bounds spec.engine.startTimeout (a day), as
// descriptor.MaxStartTimeout does for files and flags.
const MaxStartTimeoutSeconds = 24 * 60 * 60

// Bounds of spec.resources: more than any node has (a thousand cores, 64
// TiB), so that a typo is refused instead of waiting forever for a node.
const (
	MaxCPUMilli  = 1000 * 1000
	MaxMemoryMiB = 64 << 20
)

// NormalizeModelSpec fills the defaults of docs/descriptors.md: vllm engine, one replica,
// tensor and pipeline parallel 1, servedModelName = the deployment's name;
// residency pinned and priority standard (docs/residency.md) are stored as
// unspecified.
func NormalizeModelSpec(name string, spec *pb.ModelSpec) *pb.ModelSpec {
	return normalizeModelSpec(name, proto.Clone(spec).(*pb.ModelSpec))
}

// normalizeModelSpec is NormalizeModelSpec of a spec the caller owns: it
// fills spec's defaults in place (a new spec for nil) and returns it.
func normalizeModelSpec(name string, out *pb.ModelSpec) *pb.ModelSpec {
	if out == nil {
		out = &pb.ModelSpec{}
	}
	if out.ServedModelName == "" {
		out.ServedModelName = name
	}
	if out.Placement == nil {
		out.Placement = &pb.PlacementSpec{}
	}
	// The default residency and priority are stored as unspecified, so
	// that a spec naming them equals one from before they existed: a replay
	// of an old log then rebuilds the very state its snapshots hold.
	if out.Residency == pb.Residency_RESIDENCY_PINNED {
		out.Residency = pb.Residency_RESIDENCY_UNSPECIFIED
	}
	if out.Priority == pb.Priority_PRIORITY_STANDARD {
		out.Priority = pb.Priority_PRIORITY_UNSPECIFIED
	}
	if out.Engine == nil {
		out.Engine = &pb.EngineSpec{}
	}
	e := out.Engine
	if e.Kind == "" {
		e.Kind = engines.Default
	}
	if e.TensorParallel == 0 {
		e.TensorParallel = 1
	}
	if e.PipelineParallel == 0 {
		e.PipelineParallel = 1
	}
	return out
}

// ValidateModel checks what can be known about a deployment from the
// descriptor alone (rules 1, 10's first half, value ranges). It reports every
// problem.
func ValidateModel(name string, spec *pb.ModelSpec) []*pb.Violation {
	v := append(ValidateName("metadata.name", name), ValidateModelSpec(spec)...)
	if spec.GetServedModelName() == "" {
		// The deployment is served by its name (the default).
		v = append(v, servedNameClash(name, spec.GetAdapters())...)
		for i, a := range spec.GetAliases() {
			if a == name {
				v = append(v, &pb.Violation{Field: fmt.Sprintf("spec.aliases[%d]", i),
					Description: fmt.Sprintf("%q is the deployment's served model name already", a)})
			}
		}
	}
	return v
}

// ValidateModelSpec is ValidateModel without the name. The CLI's offline
// checks (fsm/descriptor) call it too, so that a rule reads the
// same whether the CLI or the server refuses.
func ValidateModelSpec(spec *pb.ModelSpec) []*pb.Violation {
	var v violations
	if spec.GetModel() == "" {
		v.add("spec.model", "is required: the path or URI of the weights")
	}
	if spec.GetReplicas() > MaxReplicas {
		v.add("spec.replicas", "must be at most %d, got %d", MaxReplicas, spec.GetReplicas())
	}
	if spec.GetPlacement().GetAccelerator() == "" {
		v.add("spec.placement.accelerator", "is required: a deployment is placed on an accelerator, never on a device")
	}
	e := spec.GetEngine()
	if k := e.GetKind(); k != "" && !engines.Known(k) {
		v.add("spec.engine.kind", "must be one of %s, got %q", strings.Join(EngineKinds, ", "), k)
	}
	if why := engines.CheckDialect(e); why != "" {
		v.add("spec.engine.dialect", "%s", why)
	}
	if p := e.GetMemoryPercent(); p > 100 {
		v.add("spec.engine.memoryPercent", "%s", PercentRange(int64(p)))
	}
	if e.GetMemoryPercent() > 0 && e.GetMemoryMib() > 0 {
		v.add("spec.engine.memory", "%s", BothMemoryShares)
	}
	if c := e.GetComputePercent(); c > 100 {
		v.add("spec.engine.computePercent", "%s", PercentRange(int64(c)))
	}
	if e.GetComputePercent() > 0 && e.GetMemoryPercent() == 0 && e.GetMemoryMib() == 0 {
		v.add("spec.engine.computePercent", "needs a memory share: set memoryPercent or memory too (rule 10)")
	}
	if s := e.GetStartTimeoutSeconds(); s > MaxStartTimeoutSeconds {
		v.add("spec.engine.startTimeout", "must be at most 24h0m0s, got %ds", s)
	}
	if m := e.GetMemoryMib(); m > MaxMemoryMiB {
		v.add("spec.engine.memory", "must be at most %dMi (64Ti), got %dMi", MaxMemoryMiB, m)
	}
	validateSleepLevel(&v, spec)
	validateStrings(&v, spec)
	validateEngineKey(&v, spec)
	validateHostCache(&v, spec)
	if c := spec.GetResources().GetCpuMilli(); c > MaxCPUMilli {
		v.add("spec.resources.cpuMilli", "must be at most %d (1000 cores), got %d", MaxCPUMilli, c)
	}
	if m := spec.GetResources().GetMemoryMib(); m > MaxMemoryMiB {
		v.add("spec.resources.memoryMib", "must be at most %d (64Ti), got %d", MaxMemoryMiB, m)
	}
	validateResidencyFields(&v, spec)
	validateAdapters(&v, spec)
	if len(spec.GetAliases()) > 0 {
		v = append(v, ValidateAliases(spec.GetServedModelName(), spec.GetAliases(), spec.GetAdapters())...)
	}
	return v
}

// validateSleepLevel checks spec.engine.sleepLevel: the levels of the
// engines that have them (engines.Engine.SleepLevels: vLLM, and the sim
// engine, which speaks vLLM's sleep API unless its dialect is another
// engine's), on a model the controller may put to sleep.
func validateSleepLevel(v *violations, spec *pb.ModelSpec) {
	e := spec.GetEngine()
	r, _ := engines.Speaks(e)
	switch l := e.GetSleepLevel(); {
	case l == 0:
	case l > 2:
		v.add("spec.engine.sleepLevel", "must be 1 (the weights wait in host RAM) or 2 (the weights are discarded and a wake reloads them from disk), got %d", l)
	case len(r.SleepLevels) == 0 && e.GetKind() != r.Kind:
		v.add("spec.engine.sleepLevel", "only vLLM has sleep levels: a %s engine speaking %s sleeps as %s does (docs/engines.md)", e.GetKind(), r.Kind, r.Kind)
	case len(r.SleepLevels) == 0:
		v.add("spec.engine.sleepLevel", "only vLLM has sleep levels (kind is %q): the node puts other engines to sleep their own way (docs/engines.md)", e.GetKind())
	case spec.GetResidency() != pb.Residency_RESIDENCY_WARM && spec.GetResidency() != pb.Residency_RESIDENCY_ON_DEMAND:
		v.add("spec.engine.sleepLevel", "a pinned model never sleeps: only warm and onDemand deployments take a sleep level")
	}
}

// validateStrings checks what an engine's process is given: environment
// variable names that execve can pass (not empty, no '=' or NUL), values
// and arguments without NUL, and node-selector labels without NUL.
func validateStrings(v *violations, spec *pb.ModelSpec) {
	e := spec.GetEngine()
	for _, k := range slices.Sorted(maps.Keys(e.GetEnv())) {
		switch {
		case k == "":
			v.add("spec.engine.env", "a variable name must not be empty")
		case strings.ContainsAny(k, "=\x00"):
			v.add("spec.engine.env", "variable name %q must not contain '=' or NUL", k)
		}
		if strings.ContainsRune(e.GetEnv()[k], 0) {
			v.add("spec.engine.env."+k, "the value must not contain NUL")
		}
	}
	for i, a := range e.GetArgs() {
		if strings.ContainsRune(a, 0) {
			v.add(fmt.Sprintf("spec.engine.args[%d]", i), "must not contain NUL")
		}
	}
	sel := spec.GetPlacement().GetNodeSelector()
	for _, k := range slices.Sorted(maps.Keys(sel)) {
		switch {
		case k == "":
			v.add("spec.placement.nodeSelector", "a label name must not be empty")
		case strings.ContainsRune(k, 0):
			v.add("spec.placement.nodeSelector", "label name %q must not contain NUL", k)
		}
		if strings.ContainsRune(sel[k], 0) {
			v.add("spec.placement.nodeSelector."+strings.ReplaceAll(k, "\x00", "\\0"), "the value must not contain NUL")
		}
	}
}

// validateEngineKey refuses an API key of the deployment's own for an
// engine the node drives: every call the node makes (health, metrics,
// controls, adapters, the gateway's requests) would be refused. The node
// gives vLLM and llama.cpp engines a key of its own (docs/engines.md).
func validateEngineKey(v *violations, spec *pb.ModelSpec) {
	e := spec.GetEngine()
	if e.GetKind() == engines.Command {
		return
	}
	// How every engine of the table takes an API key (engines.Engine's
	// KeyArgs and KeyEnv): a sim's arguments pass through to it, and a
	// deployment may change its kind.
	var engineKeyArgs, engineKeyEnv []string
	for _, k := range engines.Kinds() {
		r, _ := engines.Lookup(k)
		engineKeyArgs, engineKeyEnv = append(engineKeyArgs, r.KeyArgs...), append(engineKeyEnv, r.KeyEnv...)
	}
	for i, a := range e.GetArgs() {
		flag, _, _ := strings.Cut(a, "=")
		if slices.Contains(engineKeyArgs, flag) {
			v.add(fmt.Sprintf("spec.engine.args[%d]", i), "%s is the node's to set: each engine gets an API key only the node sends, and a key of the deployment's own would refuse every call the node makes; remove it", flag)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(e.GetEnv())) {
		if slices.Contains(engineKeyEnv, k) {
			v.add("spec.engine.env."+k, "is the node's to set: each engine gets an API key only the node sends, and a key of the deployment's own would refuse every call the node makes; remove it")
		}
	}
}

// validateHostCache refuses turning llama-server's host-RAM prompt cache
// back on (the driver runs it with --cache-ram 0): it restores a prompt's
// KV into any slot by its tokens alone, whatever tenant or adapter
// computed it, and holds host memory no share counts (docs/engines.md).
func validateHostCache(v *violations, spec *pb.ModelSpec) {
	e := spec.GetEngine()
	if e.GetKind() != engines.LlamaCpp {
		return
	}
	const why = "the node runs llama-server with --cache-ram 0: its host-RAM prompt cache serves one tenant's or adapter's prompt to another and holds host memory no share counts; remove it"
	args := e.GetArgs()
	for i, a := range args {
		flag, val, hasVal := strings.Cut(a, "=")
		if flag != "--cache-ram" && flag != "-cram" {
			continue
		}
		if !hasVal && i+1 < len(args) {
			val = args[i+1]
		}
		if strings.TrimSpace(val) != "0" {
			v.add(fmt.Sprintf("spec.engine.args[%d]", i), "%s %s: %s", flag, val, why)
		}
	}
	if val, ok := e.GetEnv()["LLAMA_ARG_CACHE_RAM"]; ok && strings.TrimSpace(val) != "0" {
		v.add("spec.engine.env.LLAMA_ARG_CACHE_RAM", "%s: %s", val, why)
	}
}

// share is what one replica of a deployment takes on each of its cards.
// shareOf computes it once, when a placement is applied; the replica keeps
// both numbers (Replica.share_milli, Replica.memory_mib) and nothing
// recomputes either from the other (docs/architecture.md, "The memory
// share").
type share struct {
	cards uint32 // cards per replica
	// milli is the packing weight of each card, 1..1000: what rule 11 and
	// the scheduler add up. A dedicated replica weighs the whole card.
	milli uint32
	// memoryMiB is the memory of each card the replica's engine may use:
	// what the node sets the engine's memory knob from, holds it to and
	// counts in its card's ledger.
	memoryMiB uint64
}

// shareOf computes a replica's share for an accelerator whose cards have
// cardMiB of memory. The one rounding rule: memoryPercent p gives
// ⌊cardMiB × p / 100⌋ MiB (never more than p % of the card) and weighs
// p × 10; memory m gives m MiB and weighs ⌈m × 1000 / cardMiB⌉ (never less
// than the memory it holds). Dedicated replicas weigh their whole cards;
// a memory setting still bounds what their engine uses.
func shareOf(spec *pb.ModelSpec, acc *pb.AcceleratorSpec, cardMiB uint64) share {
	e := spec.GetEngine()
	sh := share{cards: 1, milli: 1000, memoryMiB: cardMiB}
	switch {
	case e.GetMemoryPercent() > 0:
		sh.milli, sh.memoryMiB = e.GetMemoryPercent()*10, cardMiB*uint64(e.GetMemoryPercent())/100
	case e.GetMemoryMib() > 0 && cardMiB > 0:
		milli := uint32((e.GetMemoryMib()*1000 + cardMiB - 1) / cardMiB)
		sh.milli, sh.memoryMiB = min(milli, 1000), e.GetMemoryMib()
	}
	if acc.Tenancy != pb.Tenancy_TENANCY_SHARED {
		sh.cards, sh.milli = max(acc.DevicesPerReplica, 1), 1000
	}
	return sh
}

// MemoryShareMiB is the memory share of each card a replica of spec takes
// on accelerator acc whose cards have cardMiB (shareOf): for the CLI's
// what-if simulations of a deployment not placed.
func MemoryShareMiB(spec *pb.ModelSpec, acc *pb.AcceleratorSpec, cardMiB uint64) uint64 {
	return shareOf(spec, acc, cardMiB).memoryMiB
}

// cardMemory is the memory of the accelerator's device: the smallest reported
// card of that kind over all nodes' cards, whatever their node's status, else
// the catalog's.
//
// Every placement and model check calls it, so it sits on the apply path that
// replay runs a million times: it reads f.devices, which indexDevices
// rebuilds whenever an inventory changes, rather than scanning every card.
// Being read-only, it is safe under the concurrent reads of views and
// DryRun.
func (f *FSM) cardMemory(device string) uint64 {
	if d, ok := f.devices[device]; ok {
		return d.leastMiB
	}
	if c, ok := catalog.BySlug(device); ok {
		return c.MemoryMiB
	}
	return 0
}

// deviceIndex is what the apply path needs to know of one device kind over
// all nodes' cards, whatever their node's status.
type deviceIndex struct {
	leastMiB   uint64 // the smallest card's memory
	maxPerNode uint32 // the most cards of the kind on one node
}

// indexDevices rebuilds f.devices from the inventory. Every change to
// f.nodes or a node's cards must call it.
func (f *FSM) indexDevices() {
	m := make(map[string]deviceIndex, len(f.devices))
	perNode := map[string]uint32{}
	for _, n := range f.nodes {
		clear(perNode)
		for _, c := range n.Cards {
			d, ok := m[c.Device]
			if !ok || c.MemoryMib < d.leastMiB {
				d.leastMiB = c.MemoryMib
			}
			perNode[c.Device]++
			d.maxPerNode = max(d.maxPerNode, perNode[c.Device])
			m[c.Device] = d
		}
	}
	f.devices = m
}

// BothMemoryShares refuses a deployment that sets both memory shares.
const BothMemoryShares = "set memoryPercent or memory, not both"

// PercentRange is the bound on a share in percent, refusing got.
func PercentRange(got int64) string {
	return fmt.Sprintf("must be between 1 and 100, got %d", got)
}

// checkModel applies the rules that need the state (7, 8, 9, 10's memory cap).
func (f *FSM) checkModel(spec *pb.ModelSpec) violations {
	accName := spec.GetPlacement().GetAccelerator()
	acc, ok := f.accelerators[accName]
	if !ok {
		var v violations
		if accName != "" {
			v.add("spec.placement.accelerator", "accelerator %q not found (rule 7): create it first", accName)
		}
		return v
	}
	return CheckModelAgainst(spec, accName, acc.Spec, f.cardMemory(acc.Spec.Device))
}

// CheckModelAgainst applies the rules that relate a deployment to its
// accelerator named accName, whose spec is normalized
// (NormalizeAcceleratorSpec): rules 8, 9, 10's memory cap with cardMiB (0
// for unknown) and residency's need for a shared accelerator. The CLI's
// offline checks call it when a file defines both.
func CheckModelAgainst(spec *pb.ModelSpec, accName string, acc *pb.AcceleratorSpec, cardMiB uint64) []*pb.Violation {
	var v violations
	checkResidencyTenancy(&v, spec, accName, acc)
	e := spec.GetEngine()
	if acc.Tenancy == pb.Tenancy_TENANCY_SHARED && e.GetMemoryPercent() == 0 && e.GetMemoryMib() == 0 {
		v.add("spec.engine.memoryPercent", "accelerator %q is shared: set memoryPercent or memory, or the model would be sized against the whole card (rule 8)", accName)
	}
	tp, pp := max(e.GetTensorParallel(), 1), max(e.GetPipelineParallel(), 1)
	if tp*pp != acc.DevicesPerReplica {
		v.add("spec.engine.tensorParallel", "tensorParallel × pipelineParallel = %d × %d = %d must equal devicesPerReplica %d of accelerator %q (rule 9)",
			tp, pp, tp*pp, acc.DevicesPerReplica, accName)
	}
	if e.GetMemoryMib() > 0 && cardMiB > 0 && e.GetMemoryMib() > cardMiB {
		v.add("spec.engine.memory", "%dMi exceeds the %dMi of one %s card (rule 10)", e.GetMemoryMib(), cardMiB, acc.Device)
	}
	if cardMiB > 0 && (acc.Tenancy == pb.Tenancy_TENANCY_SHARED || e.GetMemoryPercent() > 0 || e.GetMemoryMib() > 0) {
		// The share is the most the engine may use: one its overshoot
		// above its memory knob would fill cannot hold it. On a dedicated
		// card, too, when the deployment bounds its engine's memory.
		field := "spec.engine.memoryPercent"
		if e.GetMemoryMib() > 0 {
			field = "spec.engine.memory"
		}
		if err := engines.For(e).TooSmall(shareOf(spec, acc, cardMiB).memoryMiB); err != nil {
			v.add(field, "%v", err)
		}
	}
	return v
}

// modelPrep is what applying an ApplyModel starts with and can know without
// the state: the descriptor's own violations and the normalized spec.
// DecodeEntry makes it, so that a replay does this on its decoding
// goroutine.
type modelPrep struct {
	violations violations
	spec       *pb.ModelSpec
}

func prepareModel(c *pb.ApplyModel) *modelPrep {
	return &modelPrep{violations(ValidateModel(c.GetName(), c.GetSpec())), NormalizeModelSpec(c.GetName(), c.GetSpec())}
}

// prepareDecodedModel is prepareModel of a command just decoded from a log
// entry, which nothing else holds (DecodeEntry): its spec is normalized in
// place, after validation, rather than cloned (a large part of an
// ApplyModel's cost). Applying reads the command's spec only through the
// modelPrep, and the state keeps it: a Decoder must never recycle it.
func prepareDecodedModel(c *pb.ApplyModel) *modelPrep {
	v := violations(ValidateModel(c.GetName(), c.GetSpec()))
	return &modelPrep{v, normalizeModelSpec(c.GetName(), c.GetSpec())}
}

// applyModel applies c; prep is prepareModel(c), or nil to make it here.
func (f *FSM) applyModel(c *pb.ApplyModel, prep *modelPrep, index uint64, dry bool) *pb.Result {
	if prep == nil {
		prep = prepareModel(c)
	}
	v, spec := prep.violations, prep.spec
	v = append(v, f.checkModel(spec)...)
	if len(v) > 0 {
		return invalid(fmt.Sprintf("deployment %q", c.GetName()), v)
	}
	prev, exists := f.models[c.GetName()]
	if exists && proto.Equal(prev.Spec, spec) {
		return accept(pb.Outcome_OUTCOME_UNCHANGED, "deployment %q unchanged", c.GetName())
	}
	if dry {
		return accept(outcomeOf(exists), "deployment %q would be applied", c.GetName())
	}
	if !exists {
		m := &pb.ModelDeployment{Name: c.GetName(), Spec: spec, Generation: 1, CreatedIndex: index, CreatedUnix: f.logTime / int64(time.Second)}
		f.models[m.Name] = m
		f.scale(m, 0)
		// accept(…, "deployment %q created with %d replicas", …) without
		// fmt (strconv.Quote is %q): one entry in ten of a busy log.
		return f.accepted(pb.Outcome_OUTCOME_CREATED, "deployment ", strconv.Quote(m.Name), " created with ", strconv.FormatUint(uint64(spec.Replicas), 10), " replicas")
	}
	m := prev
	oldReplicas := m.Spec.Replicas
	regenerate := !sameIdentity(m.Spec, spec)
	var warnings []string
	if residencyOf(m.Spec) != residencyOf(spec) {
		warnings = f.changeResidency(m, spec)
	}
	m.Spec = spec
	if regenerate {
		m.Generation++
		for i := uint32(0); i < min(oldReplicas, spec.Replicas); i++ {
			r := f.replicas[replicaKey{m.Name, i}]
			f.unplace(r, fmt.Sprintf("replaced by generation %d: waiting for the scheduler", m.Generation))
			r.Generation = m.Generation
			r.Accelerator = spec.Placement.Accelerator
			r.ComputePercent = spec.Engine.ComputePercent
		}
	}
	f.scale(m, oldReplicas)
	res := accept(pb.Outcome_OUTCOME_CONFIGURED, "deployment %q configured (generation %d, %d replicas)", m.Name, m.Generation, spec.Replicas)
	res.Warnings = warnings
	return res
}

// sameIdentity says whether two specs run the same replicas: they differ
// at most in what changes without re-placing anything — the replica count,
// the residency, priority and SLO the node's controller adapts to (docs/residency.md; a residency change re-checks the reservations, changeResidency),
// the adapters, which the node loads into the running base, and the
// aliases, names the gateway resolves to the same replicas.
func sameIdentity(a, b *pb.ModelSpec) bool {
	return proto.Equal(withoutMutable(a), withoutMutable(b))
}

func withoutMutable(spec *pb.ModelSpec) *pb.ModelSpec {
	s := withReplicas(spec, 0)
	s.Residency, s.Priority, s.Slo = pb.Residency_RESIDENCY_UNSPECIFIED, pb.Priority_PRIORITY_UNSPECIFIED, nil
	s.Aliases, s.Idle = nil, nil
	// llama-server loads its adapters at start (--lora): a change of
	// them is a new engine; who may use them is the gateway's.
	if !adaptersAtStart(spec.GetEngine()) {
		s.Adapters = nil
	}
	for _, a := range s.Adapters {
		a.Tenants = nil
	}
	// The gateway's admission, not the engine, reads maxInFlight; the
	// node's residency controller, not the engine's start, the sleep level.
	if s.Engine != nil {
		s.Engine.MaxInFlight, s.Engine.SleepLevel = 0, 0
	}
	return s
}

// adaptersAtStart says the engine takes its adapters at start: llama.cpp,
// or a sim engine speaking it.
func adaptersAtStart(e *pb.EngineSpec) bool {
	r, _ := engines.Speaks(e)
	return r.Adapters == engines.AdaptersAtStart
}

func withReplicas(spec *pb.ModelSpec, n uint32) *pb.ModelSpec {
	s := proto.Clone(spec).(*pb.ModelSpec)
	s.Replicas = n
	return s
}

// scale adds pending replicas up to the desired count, or removes the
// highest ordinals above it, releasing their shares.
func (f *FSM) scale(m *pb.ModelDeployment, have uint32) {
	if m.Spec.Replicas > have {
		// Replicas of deleted deployments are reused (a busy log creates and
		// deletes them all the time), others allocated together.
		var rs []pb.Replica
		if n := int(m.Spec.Replicas-have) - len(f.spareReplicas); n > 0 {
			rs = make([]pb.Replica, n)
		}
		for j := range int(m.Spec.Replicas - have) {
			var r *pb.Replica
			if k := len(f.spareReplicas); k > 0 {
				r, f.spareReplicas = f.spareReplicas[k-1], f.spareReplicas[:k-1]
			} else {
				r, rs = &rs[0], rs[1:]
			}
			r.Model, r.Index, r.Generation = m.Name, have+uint32(j), m.Generation
			r.Accelerator = m.Spec.Placement.Accelerator
			r.ComputePercent = m.Spec.Engine.ComputePercent
			r.State = pb.ReplicaState_REPLICA_STATE_PENDING
			r.Reason = "waiting for the scheduler"
			f.replicas[replicaKey{m.Name, r.Index}] = r
		}
	}
	f.dropReplicas(m.Name, m.Spec.Replicas, have)
}

// dropReplicas removes model's replicas from..to-1, releasing their shares.
func (f *FSM) dropReplicas(model string, from, to uint32) {
	for i := from; i < to; i++ {
		k := replicaKey{model, i}
		r := f.replicas[k]
		if r == nil {
			continue
		}
		if r.Node != "" {
			f.release(r)
		}
		delete(f.replicas, k)
		// Nothing else points at a replica (views and snapshots copy):
		// set it aside for scale.
		r.Reset()
		f.spareReplicas = append(f.spareReplicas, r)
	}
}

func (f *FSM) deleteModel(c *pb.DeleteModel, dry bool) *pb.Result {
	m, exists := f.models[c.GetName()]
	if !exists {
		return reject(pb.Code_CODE_NOT_FOUND, "deployment %q not found", c.GetName())
	}
	if !dry {
		f.dropReplicas(m.Name, 0, m.Spec.Replicas)
		delete(f.models, m.Name)
	}
	return f.accepted(pb.Outcome_OUTCOME_DELETED, "deployment ", strconv.Quote(c.GetName()), " deleted") // "deployment %q deleted"
}

// modelsOn lists the deployments placed on an accelerator, by name.
func (f *FSM) modelsOn(accelerator string) []string {
	var out []string
	for _, name := range sortedKeys(f.models) {
		if f.models[name].Spec.Placement.Accelerator == accelerator {
			out = append(out, name)
		}
	}
	return out
}

// unplaceWhere returns every placed replica matching pred to pending, in
// replica order. Only the matches are sorted: a node's status change must not
// sort every replica in the cluster.
func (f *FSM) unplaceWhere(pred func(*pb.Replica) bool, reason string) int {
	var keys []replicaKey
	for k, r := range f.replicas {
		if pred(r) {
			keys = append(keys, k)
		}
	}
	sortReplicaKeys(keys)
	for _, k := range keys {
		f.unplace(f.replicas[k], reason)
	}
	return len(keys)
}

// unplaceOn is unplaceWhere of the replicas placed on node, found in the
// by-node index rather than by scanning every replica.
func (f *FSM) unplaceOn(node, reason string) int {
	if node == "" { // every unplaced replica has Node ""; the index holds none
		return f.unplaceWhere(func(r *pb.Replica) bool { return r.Node == node }, reason)
	}
	keys := make([]replicaKey, 0, len(f.onNode[node]))
	for k := range f.onNode[node] {
		keys = append(keys, k)
	}
	sortReplicaKeys(keys)
	for _, k := range keys {
		f.unplace(f.replicas[k], reason)
	}
	return len(keys)
}

func (f *FSM) sortedReplicaKeys() []replicaKey {
	keys := make([]replicaKey, 0, len(f.replicas))
	for k := range f.replicas {
		keys = append(keys, k)
	}
	sortReplicaKeys(keys)
	return keys
}

func sortReplicaKeys(keys []replicaKey) {
	slices.SortFunc(keys, func(a, b replicaKey) int {
		if c := strings.Compare(a.model, b.model); c != 0 {
			return c
		}
		return int(a.index) - int(b.index)
	})
}
