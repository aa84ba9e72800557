package residency

import (
	"fmt"
	"time"

	"github.com/gpuplane/gpuplane/internal/cardfit"
	"github.com/gpuplane/gpuplane/internal/class"
)

// ModelID names one deployment's replica on a card: each is a resident of
// its own (its engine, its cost in the ledger). What the controller learns
// is kept per variant instead (ProfileKey): replicas of the same base
// weights, quantization, engine and device share one profile.
type ModelID string

// Residency is how the card keeps a model (docs/residency.md): the card-fit
// rule's type (internal/cardfit), which names and parses it.
type Residency = cardfit.Residency

const (
	// Pinned is loaded when placed and never unloaded by the controller; its
	// share is reserved.
	Pinned = cardfit.Pinned
	// Warm has its share reserved, may sleep while idle and lend that memory
	// to onDemand models, and takes it back when requested.
	Warm = cardfit.Warm
	// OnDemand has no reservation: loaded on demand or forecast into memory
	// nobody reserved (or a sleeping warm model lent), put to sleep or
	// unloaded when idle or when memory is needed.
	OnDemand = cardfit.OnDemand
)

// Priority is a deployment's class; a higher value outranks a lower one.
// It is the gateway's request class (internal/class): one vocabulary for both.
type Priority = class.Class

const (
	Background  = class.Background
	Standard    = class.Standard
	Interactive = class.Interactive
)

// priorityWeight is the class weight in a model's value: an interactive
// model's reload hurts four times what a background one's does.
func priorityWeight(p Priority) float64 {
	switch p {
	case Interactive:
		return 4
	case Standard:
		return 2
	}
	return 1
}

// State is a replica's residency state (docs/residency.md):
// Cold → Loading → Resident ⇄ Draining → Sleeping | Cold,
// Sleeping → Waking → Resident, any state → Failed.
type State uint8

const (
	Cold State = iota
	Loading
	Resident
	Draining
	Sleeping
	Waking
	Failed
)

func (s State) String() string {
	switch s {
	case Cold:
		return "Cold"
	case Loading:
		return "Loading"
	case Resident:
		return "Resident"
	case Draining:
		return "Draining"
	case Sleeping:
		return "Sleeping"
	case Waking:
		return "Waking"
	case Failed:
		return "Failed"
	}
	return fmt.Sprintf("State(%d)", uint8(s))
}

// Tier is where a model's weights are: on the card, in host RAM (asleep) or
// on disk (cold). Reload cost depends on it.
func (s State) Tier() string {
	switch s {
	case Loading, Resident, Draining, Waking:
		return "gpu"
	case Sleeping:
		return "host"
	}
	return "disk"
}

// Deployment is what the controller knows about one model on this card. The
// integrator fills it from the replicated deployment and the engine driver's
// capabilities; the byte and time figures are priors the profiler replaces
// once it has measured them.
type Deployment struct {
	Model     ModelID
	Residency Residency
	Priority  Priority
	// Share is the bytes reserved on this card for a pinned or warm model;
	// for an onDemand model, the most it is expected to use.
	Share int64
	// Footprint is the expected resident cost (weights + KV pool +
	// overhead); 0 means Share.
	Footprint int64
	// Peak is the expected cost while loading; 0 means Footprint.
	Peak int64
	// Residual is the expected cost while asleep.
	Residual int64
	// CanSleep is true when the engine supports sleep/wake (vLLM sleep
	// mode, the sim engine); without it, demotion is an unload.
	CanSleep bool
	// SleepDiscards says a sleep drops the weights instead of keeping them
	// in host RAM (vLLM's level 2, Ollama's keep_alive unload): it takes
	// no host memory, and a wake reloads the weights from disk while the
	// engine's process stays up.
	SleepDiscards bool
	// LoadTime and WakeTime are priors for a cold load and a wake.
	LoadTime time.Duration
	WakeTime time.Duration
	// Weights names the base weights (a deployment's spec.model); with
	// Quantization, Engine and Device it is the variant the profiler
	// learns about, shared by every replica of it. Empty: Model, so that a
	// caller that names no weights profiles each replica apart.
	Weights string
	// Quantization, Engine and Device complete the profiler's key.
	Quantization string
	Engine       string
	Device       string
	// IdleSleep and IdleUnload replace the card's timeouts of the same
	// name (Config) for this model when set: the deployment's spec.idle.
	IdleSleep  time.Duration
	IdleUnload time.Duration
	// Failover says the replica was placed on this card after its node or
	// card was lost: its first load is recorded with TriggerFailover.
	Failover bool
}

func (d Deployment) validate() error {
	switch {
	case d.Model == "":
		return fmt.Errorf("deployment: model: must not be empty")
	case d.Residency > OnDemand:
		return fmt.Errorf("deployment %s: residency: unknown value %d", d.Model, d.Residency)
	case d.Priority > Interactive:
		return fmt.Errorf("deployment %s: priority: unknown value %d", d.Model, d.Priority)
	case d.Share <= 0:
		return fmt.Errorf("deployment %s: share: must be > 0 bytes, got %d", d.Model, d.Share)
	case d.Footprint < 0 || d.Peak < 0 || d.Residual < 0:
		return fmt.Errorf("deployment %s: footprint, peak and residual must be ≥ 0", d.Model)
	case d.LoadTime < 0 || d.WakeTime < 0:
		return fmt.Errorf("deployment %s: loadTime and wakeTime must be ≥ 0", d.Model)
	}
	return nil
}

// ActionKind is what the controller asks the node to do.
type ActionKind uint8

const (
	// ActLoad starts the engine or loads the model (cold load) for waiting
	// requests or a reserved model.
	ActLoad ActionKind = iota + 1
	// ActPrewarm is a cold load for a forecast arrival; the engine does the
	// same as for ActLoad.
	ActPrewarm
	// ActSleep demotes the engine to host RAM (vLLM /sleep level 1).
	ActSleep
	// ActWake wakes a sleeping engine (vLLM /wake_up).
	ActWake
	// ActEvict stops the engine (or unloads the model) to free memory for
	// another model.
	ActEvict
	// ActUnload stops the engine because it is idle or its deployment left.
	ActUnload
	// ActDrain stops dispatching new requests to the engine; the controller
	// follows with ActSleep or ActEvict once in-flight requests finish or the
	// drain deadline passes (then the node cuts them off with an error).
	ActDrain
	// ActSerialize records that Model and Peer run one at a time, each
	// keeping the card for a time slot. No engine operation.
	ActSerialize
	// ActReject fails the requests waiting for Model with the Reason.
	ActReject
	// ActLoadAdapter loads Adapter into Model's engine (vLLM's
	// /v1/load_lora_adapter); AdapterLoaded or AdapterLoadFailed follows.
	ActLoadAdapter
	// ActUnloadAdapter unloads Adapter from Model's engine to host RAM
	// (/v1/unload_lora_adapter); AdapterUnloaded follows.
	ActUnloadAdapter
	// ActDropAdapter records that Adapter left host RAM for disk. No
	// engine operation.
	ActDropAdapter
	// ActProtect records that Peer, of a lower class, no longer takes
	// Model's memory for a while: Peer's demand displaced Model, and Model
	// was asked for again, too often (lend.go). No engine operation.
	ActProtect
	// ActBestEffort records that the protected set changed: which models
	// the card holds at their SLO and which are best-effort
	// (besteffort.go). No engine operation; Model is empty.
	ActBestEffort
	// ActWait records that Model's requests have waited WaitNoted for the
	// card, and why (wait.go): a decision only, never an action.
	ActWait
)

func (k ActionKind) String() string {
	switch k {
	case 0:
		return "none"
	case ActLoad:
		return "load"
	case ActPrewarm:
		return "prewarm"
	case ActSleep:
		return "sleep"
	case ActWake:
		return "wake"
	case ActEvict:
		return "evict"
	case ActUnload:
		return "unload"
	case ActDrain:
		return "drain"
	case ActSerialize:
		return "serialize"
	case ActReject:
		return "reject"
	case ActLoadAdapter:
		return "load-adapter"
	case ActUnloadAdapter:
		return "unload-adapter"
	case ActDropAdapter:
		return "drop-adapter"
	case ActProtect:
		return "protect"
	case ActBestEffort:
		return "best-effort"
	case ActWait:
		return "wait"
	}
	return fmt.Sprintf("ActionKind(%d)", uint8(k))
}

// Trigger is who or what caused a decision (docs/residency.md,
// "Decisions"). Only TriggerOperator names a person: an API caller who
// asked for the load or unload (Decision.By names the token).
type Trigger uint8

const (
	// TriggerRequest: requests waiting for the model (or a higher class's
	// requests that need its memory).
	TriggerRequest Trigger = iota
	// TriggerForecast: an arrival predicted from the model's past requests.
	TriggerForecast
	// TriggerPressure: memory pressure or thrash on the card (a ledger
	// violation's fallback, a pair serialized, a model protected).
	TriggerPressure
	// TriggerIdle: the model's idle timeout or keep_alive ran out.
	TriggerIdle
	// TriggerOperator: an operator's load or unload through the API.
	TriggerOperator
	// TriggerScheduler: the cluster's desired state changed — a replica
	// placed on or removed from the card, a reserved model kept on it, a
	// deployment's spec changed.
	TriggerScheduler
	// TriggerFailover: a replica placed here after its node or card was
	// lost is brought up.
	TriggerFailover
	// TriggerOwnerReturn: a warm or pinned owner takes back the share it
	// had lent.
	TriggerOwnerReturn
	// TriggerTurn: a model of the same or a lower class has waited its
	// turn out and takes the card (turns.go, lowturn.go).
	TriggerTurn
	// TriggerWatchdog: a model whose engine crashed or failed to start is
	// brought back after its retry backoff.
	TriggerWatchdog
)

func (t Trigger) String() string {
	switch t {
	case TriggerRequest:
		return "request"
	case TriggerForecast:
		return "forecast"
	case TriggerPressure:
		return "pressure"
	case TriggerIdle:
		return "idle"
	case TriggerOperator:
		return "operator"
	case TriggerScheduler:
		return "scheduler"
	case TriggerFailover:
		return "failover"
	case TriggerOwnerReturn:
		return "owner-return"
	case TriggerTurn:
		return "turn"
	case TriggerWatchdog:
		return "watchdog"
	}
	return fmt.Sprintf("Trigger(%d)", uint8(t))
}

// entitles reports whether a decision with this trigger acts for a
// reserved share or the cluster's desired state (an operator's call, a
// placement or removal, an owner's return, a restart): such a decision
// may take a borrower's memory whatever its class.
func (t Trigger) entitles() bool {
	switch t {
	case TriggerOperator, TriggerScheduler, TriggerFailover, TriggerOwnerReturn, TriggerWatchdog:
		return true
	}
	return false
}

// demand reports whether a decision with this trigger serves waiting
// requests: a request's own, or a turn that came due for them.
func (t Trigger) demand() bool { return t == TriggerRequest || t == TriggerTurn }

// Action is one thing the node should do, with the decision behind it.
type Action struct {
	Kind  ActionKind
	Model ModelID
	// Peer is the other model of an ActSerialize or ActProtect.
	Peer ModelID
	// Adapter is the adapter of an ActLoadAdapter, ActUnloadAdapter or
	// ActDropAdapter (adapters.go).
	Adapter  string
	Decision Decision
}

// Decision records one controller decision: when, where, what, why and the
// numbers that decided it.
type Decision struct {
	Time    time.Time
	Card    string
	Action  ActionKind
	Model   ModelID
	Trigger Trigger
	// For is the model an eviction, sleep or drain makes room for.
	For    ModelID
	Inputs Inputs
	Reason string
	// By names who asked, for a TriggerOperator decision (the API token's
	// name, empty when not known).
	By string
	// Advised is true when the controller runs in advise mode: recorded,
	// not executed.
	Advised bool
}

// Inputs are the numbers behind a decision.
type Inputs struct {
	// Rate is Model's decayed arrival rate, requests per minute.
	Rate float64
	// Value is Model's value per GiB (see DESIGN.md); ForValue is the
	// beneficiary's.
	Value    float64
	ForValue float64
	// Bytes is what the action frees (evict, sleep, drain) or takes (load,
	// wake, prewarm).
	Bytes int64
	// Need is the bytes the beneficiary lacks; Free is what the ledger had
	// for it before the action.
	Need int64
	Free int64
	// Reload is what bringing Model back costs from its tier after the
	// action (wake or cold load time).
	Reload time.Duration
	// Active is Model's requests queued or in flight.
	Active int
}

// ProfileKey identifies what the profiler learns about: a variant. The same
// weights with another quantization, engine or device are profiled apart;
// replicas of one variant (of one deployment or of several) share one
// profile.
type ProfileKey struct {
	// Model is the base weights (Deployment.Weights, else its Model).
	Model        ModelID
	Quantization string
	Engine       string
	Device       string
}

func (d Deployment) profileKey() ProfileKey {
	m := d.Model
	if d.Weights != "" {
		m = ModelID(d.Weights)
	}
	return ProfileKey{Model: m, Quantization: d.Quantization, Engine: d.Engine, Device: d.Device}
}
