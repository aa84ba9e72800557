package residency

import (
	"fmt"
	"slices"
	"time"
)

// Mode says whether the controller's actions are executed.
type Mode uint8

const (
	// Act returns actions for the node to execute.
	Act Mode = iota
	// Advise records the same decisions and returns no actions: the plan
	// and the decision log show what would have happened.
	Advise
)

// Config sets one card's controller. Zero fields take the defaults noted.
type Config struct {
	// Card names the card in decisions and violations.
	Card string
	// Memory is the card's memory in bytes (required).
	Memory int64
	// HeadroomPercent is kept free of every cost (default 5).
	HeadroomPercent float64
	// HostMemory bounds the host RAM sleeping models may hold; 0 is no
	// bound.
	HostMemory int64
	Mode       Mode
	// MinResidency protects a newly resident model from eviction by equal
	// or lower priority demand (default 30s; at least twice its load time).
	MinResidency time.Duration
	// IdleSleep demotes an idle onDemand or warm model (default 5m);
	// IdleUnload unloads an onDemand model asleep that long (default 30m).
	IdleSleep  time.Duration
	IdleUnload time.Duration
	// DrainDeadline bounds how long a drained engine's in-flight requests
	// may run before they are cut off (default 30s).
	DrainDeadline time.Duration
	// RateHalfLife is the half-life of the decayed arrival rate (default
	// 10m).
	RateHalfLife time.Duration
	// PrewarmMargin is added to the reload time when deciding how early to
	// prewarm (default 5s).
	PrewarmMargin time.Duration
	// ThrashCount evictions of one pair by each other within ThrashWindow
	// serialize the pair (defaults 3 and 10m) for SerializeFor (default
	// 30m), each taking the card for a slot of at least SlotFactor (default
	// 4) times its reload time.
	ThrashCount  int
	ThrashWindow time.Duration
	SerializeFor time.Duration
	SlotFactor   float64
	// RetryBackoff is the first wait after a failed load or a crash,
	// doubling per consecutive failure up to MaxBackoff (defaults 2s, 5m).
	RetryBackoff time.Duration
	MaxBackoff   time.Duration
	// MaxDecisions bounds the decision log kept in memory (default 1024).
	MaxDecisions int
	// Profiler, when set, is shared with the node's other controllers;
	// nil gives the controller one of its own.
	Profiler *Profiler
	// BestEffort turns on the protected set (besteffort.go): when the
	// card cannot hold every model with demand, the largest set it can
	// hold is protected and the others are served best-effort. Off by
	// default: the simulator measures it (`simulate serve`), the agent
	// does not run it yet.
	BestEffort bool
}

func (c Config) withDefaults() (Config, error) {
	if c.Memory <= 0 {
		return c, fmt.Errorf("residency config: memory: must be > 0 bytes, got %d", c.Memory)
	}
	if c.HeadroomPercent < 0 || c.HeadroomPercent >= 100 {
		return c, fmt.Errorf("residency config: headroomPercent: must be in [0, 100), got %g", c.HeadroomPercent)
	}
	if c.HeadroomPercent == 0 {
		c.HeadroomPercent = 5
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.MinResidency, 30*time.Second)
	def(&c.IdleSleep, 5*time.Minute)
	def(&c.IdleUnload, 30*time.Minute)
	def(&c.DrainDeadline, 30*time.Second)
	def(&c.RateHalfLife, 10*time.Minute)
	def(&c.PrewarmMargin, 5*time.Second)
	def(&c.ThrashWindow, 10*time.Minute)
	def(&c.SerializeFor, 30*time.Minute)
	def(&c.RetryBackoff, 2*time.Second)
	def(&c.MaxBackoff, 5*time.Minute)
	if c.ThrashCount <= 0 {
		c.ThrashCount = 3
	}
	if c.SlotFactor <= 0 {
		c.SlotFactor = 4
	}
	if c.MaxDecisions <= 0 {
		c.MaxDecisions = 1024
	}
	return c, nil
}

// replica is the controller's view of one model on the card. It is a plain
// value so a step can be tried on a copy (advise mode, Plan, the fallback
// after a violation).
type replica struct {
	// keep is the keep_alive of its last request, where it gave one
	// (keepSet; keepalive.go).
	keep    time.Duration
	keepSet bool
	// opLoad is set while an operator's load waits for its step, opUnload
	// while an operator's unload does, with opFor the model whose operator
	// load it makes room for (operator.go).
	opLoad, opUnload bool
	opFor            ModelID
	opBy             string
	dep              Deployment
	// prof is what the profiler learned for dep's key, mem its memory
	// figures at dep's share (shared, not part of a step's trial copy).
	prof  *Profile
	mem   *memFigures
	state State
	// since is when the replica entered its state; resident when it last
	// became resident; opStart when the running load or wake began.
	since    time.Time
	resident time.Time
	opStart  time.Time
	// active counts requests queued or in flight.
	active int
	// done is the decayed count of its requests offered and answered
	// (besteffort.go, beDone).
	done    doneCount
	lastUse time.Time
	fc      forecast
	// rate is fc's rate at the start of the current step.
	rate float64
	// measured is the last memory sample in the current state (0: none).
	measured int64
	// pending is the Sleep or Evict/Unload that follows a drain or a load
	// in progress; issued is true once that action went out.
	pending   ActionKind
	issued    bool
	drainBy   time.Time
	drainFor  ModelID
	drainTrig Trigger
	// held counts the requests that arrived while r drains: a draining
	// engine takes no new work (only a Resident one is dispatched to), so
	// they wait at the gateway for its return and the drain does not wait
	// for them.
	held int
	// rejected is true once waiting requests were rejected, until the next
	// arrival.
	rejected bool
	// wasLent is true from a warm model's sleep until it loads or wakes
	// again: a crash or unload while asleep leaves its share lent.
	wasLent bool
	// prewarm is true while a forecast, not a request, holds the model.
	prewarm  bool
	failures int
	retryAt  time.Time
	removed  bool
	// lentTo is the onDemand model a warm owner was put to sleep for, until
	// that borrower had its turn; yielding is set while the owner, asked
	// for again, waits for that turn (until yieldUntil) with its share
	// still lent (turns.go).
	lentTo     ModelID
	yielding   bool
	yieldUntil time.Time
	yieldCap   time.Time
	// yieldTo is whose turn a yielding r waits for, and yieldEnd when
	// that turn ends at the latest (the wait's cause, wait.go).
	yieldTo  ModelID
	yieldEnd time.Time
	// lowYielded is the lower-class or best-effort turn a warm owner
	// yielded to in its current wait (zero: none yet): it yields to one
	// turn per wait, so that turns granted one after another do not keep
	// it asleep (lowturn.go).
	lowYielded lowTurn
	// waitSince is when r's current wait for the card began (zero while
	// resident or without demand); demandAt when it last had requests
	// waiting; slotBy, set each step, when it gets the card at the latest
	// (zero: no promise), shown by Plan.
	waitSince time.Time
	demandAt  time.Time
	slotBy    time.Time
	// waitNoted is the start of the last wait recorded as a `wait`
	// decision (wait.go).
	waitNoted time.Time
	// spellStart is when r's current spell of requests began (burst.go).
	spellStart time.Time
	// spellLen is the EWMA of r's spells' lengths in seconds, over spells
	// spells seen.
	spellLen float64
	spells   int

	// opHeld is set by an operator's unload until a request for the model
	// arrives or an operator loads it: a forecast alone does not bring it
	// back, as a model `ollama stop` unloaded stays off until asked for.
	opHeld bool
}

// thrash remembers which model evicted which, to find pairs that keep
// forcing each other out.
type eviction struct {
	victim, by ModelID
	at         time.Time
	// gap is, for an eviction, how long the victim had been idle; for a
	// return (lend.go), the idle spell it came back after.
	gap time.Duration
}

type pairKey struct{ a, b ModelID }

func pairOf(x, y ModelID) pairKey {
	if x > y {
		x, y = y, x
	}
	return pairKey{x, y}
}

// Output is what one event produced.
type Output struct {
	// Actions to execute, in order (none in advise mode).
	Actions []Action
	// Violations found by the ledger check in this step.
	Violations []Violation
	// Err is set when the event was refused (a bad deployment); nothing
	// changed.
	Err error
}

// Controller is one card's residency controller. It is not safe for
// concurrent use: the node feeds it from one loop.
type Controller struct {
	// be is the protected set in force (besteffort.go).
	be     beState
	cfg    Config
	clock  Clock
	usable int64
	reps   []replica
	index  map[ModelID]int
	prof   *profiler

	evictions  []eviction
	serialized map[pairKey]time.Time
	// returns are the request-driven loads and wakes of a model that a
	// lower class's demand had displaced (victim: the model, by: that
	// demand), within ThrashWindow; protected maps (model, lower-class
	// peer) to when the peer may take the model's memory again (lend.go).
	returns   []eviction
	protected map[protectKey]protection
	// cuts remembers, per borrower, when an owner's return last cut its
	// turn short (turns.go), within ThrashWindow.
	cuts map[ModelID]time.Time
	// low is the lower-class turn in progress, lowNext per model the
	// earliest start of its next (lowturn.go); stepLow and stepLowNext
	// (nil: unchanged) the step's copies, kept once the step is.
	low, stepLow         lowTurn
	lowNext, stepLowNext map[ModelID]lastTurn

	decisions []Decision
	decNext   int
	decTotal  int

	violations     []Violation
	violationCount int
	pinnedOnly     bool
	lastBroken     string

	// adapters are the LoRA adapters of the bases on the card
	// (adapters.go), kept outside the replicas' trial copies.
	adapters map[ModelID]*adapterSet

	// advised remembers the last advised action per model so advise mode
	// records a decision when it changes, not on every tick.
	advised map[ModelID]ActionKind

	// stepEvictions are the step's evictions for requests, stepReturns its
	// returns, remembered for anti-thrash once the step is kept.
	stepEvictions []eviction
	stepReturns   []eviction
	stepProtects  []protectKey
	stepKeep      []protection
	stepCuts      []cut
	// step scratch; sumNow and sumCommitted are Σ claims, valid while
	// sumsOK
	sumNow, sumCommitted int64
	sumsOK               bool
	out                  []Action
	earmark              int64
	cands                []candidate
	snapshot             []replica
}

// New returns a controller for one card.
func New(cfg Config, clock Clock) (*Controller, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if clock == nil {
		return nil, fmt.Errorf("residency: clock: must not be nil")
	}
	usable := cfg.Memory - int64(float64(cfg.Memory)*cfg.HeadroomPercent/100)
	if cfg.Profiler == nil {
		cfg.Profiler = NewProfiler()
	}
	return &Controller{
		prof:       &cfg.Profiler.p,
		cfg:        cfg,
		clock:      clock,
		usable:     usable,
		index:      make(map[ModelID]int),
		serialized: make(map[pairKey]time.Time),
		protected:  make(map[protectKey]protection),
		cuts:       make(map[ModelID]time.Time),
		advised:    make(map[ModelID]ActionKind),
		adapters:   make(map[ModelID]*adapterSet),
	}, nil
}

// Usable is the card's memory minus the headroom.
func (c *Controller) Usable() int64 { return c.usable }

// PinnedOnly reports whether a ledger violation dropped the card to
// pinned-only behaviour.
func (c *Controller) PinnedOnly() bool { return c.pinnedOnly }

// ViolationCount is how many ledger violations were found.
func (c *Controller) ViolationCount() int { return c.violationCount }

// Violations returns the most recent violations (up to 16), oldest first.
func (c *Controller) Violations() []Violation { return append([]Violation(nil), c.violations...) }

// Profiles returns what the profiler learned, ordered by key (with a shared
// Profiler, what every controller sharing it learned).
func (c *Controller) Profiles() []Profile { return c.prof.all() }

// Decisions returns the decision log kept in memory, oldest first.
func (c *Controller) Decisions() []Decision {
	if c.decTotal <= len(c.decisions) {
		return append([]Decision(nil), c.decisions...)
	}
	out := make([]Decision, 0, len(c.decisions))
	out = append(out, c.decisions[c.decNext:]...)
	return append(out, c.decisions[:c.decNext]...)
}

// Status is one replica as the controller sees it.
type Status struct {
	Model     ModelID
	Residency Residency
	Priority  Priority
	State     State
	Active    int
	Cost      int64
}

// Replica returns Model's status; ok is false for an unknown model.
func (c *Controller) Replica(m ModelID) (Status, bool) {
	i, ok := c.index[m]
	if !ok {
		return Status{}, false
	}
	r := &c.reps[i]
	return Status{Model: m, Residency: r.dep.Residency, Priority: r.dep.Priority, State: r.state, Active: r.active, Cost: c.cost(r)}, true
}

// CardBy is when Model, its requests waiting for the card, gets it at the
// latest: the bound the plan shows ("gets the card by"; docs/residency.md,
// "No starvation"). ok is false for an unknown model or one with no
// requests waiting for the card.
func (c *Controller) CardBy(m ModelID) (by time.Time, ok bool) {
	r := c.rep(m)
	if r == nil || r.slotBy.IsZero() {
		return time.Time{}, false
	}
	return r.slotBy, true
}

// Yielding reports whether Model, a warm owner with requests waiting,
// waits because it yields its share to another model's turn: a
// borrower's once its return was cut short, or a lower-class or
// best-effort model's bounded turn (turns.go, lowturn.go). The
// `serialize` decision that says so promises its requests the card back
// by CardBy, whatever their class; the gateway keeps them waiting until
// then rather than refusing them after their cold wait.
func (c *Controller) Yielding(m ModelID) bool {
	r := c.rep(m)
	return r != nil && r.yielding && !r.removed
}

func (c *Controller) rep(m ModelID) *replica {
	if i, ok := c.index[m]; ok {
		return &c.reps[i]
	}
	return nil
}

func (c *Controller) setState(r *replica, s State, now time.Time) {
	if r.state == s {
		return
	}
	r.state = s
	r.since = now
	r.measured = 0
	r.held = 0
	switch s {
	case Sleeping:
		r.prewarm, r.wasLent = false, true
	case Cold, Failed:
		r.prewarm = false
	default:
		r.wasLent = false
	}
	if s == Resident {
		r.resident = now
		r.waitSince = time.Time{}
	}
}

// Handle applies one event and runs the policy. In Act mode the returned
// actions are to be executed in order; their outcomes come back as events
// (LoadDone, SleepDone, ...). In Advise mode no actions are returned and
// the replicas' states follow only what the node reports.
func (c *Controller) Handle(ev Event) Output {
	now := c.clock.Now()
	var out Output
	if handled, err := c.observeAdapter(ev, now); err != nil {
		out.Err = err
		return out
	} else if !handled {
		if err := c.observe(ev, now); err != nil {
			out.Err = err
			return out
		}
	}
	if c.cfg.Mode == Advise {
		c.advise(now)
		c.pageAllAdapters(&out, now)
		return out
	}
	c.snapshot = append(c.snapshot[:0], c.reps...)
	acts := c.step(now)
	vs := c.check(c.snapshot, acts, now)
	if len(vs) > 0 {
		out.Violations = c.violated(vs, now)
		c.pinnedOnly = true
		// Retry the step from the state before it, as a pinned-only card:
		// only pinned and warm models are served, nothing is lent.
		c.reps = append(c.reps[:0], c.snapshot...)
		acts = c.step(now)
	}
	c.recordThrash(acts, now)
	for i := range acts {
		c.record(acts[i].Decision)
	}
	c.noteWaits(now)
	for _, a := range acts {
		// A best-effort decision is recorded only: no engine operation.
		if a.Kind != ActBestEffort {
			out.Actions = append(out.Actions, a)
		}
	}
	c.pageAllAdapters(&out, now)
	return out
}

// pageAllAdapters runs the adapter step after the models' step and checks
// what it did. Adapters are paged in advise mode too: without a load no
// adapter is served at all.
func (c *Controller) pageAllAdapters(out *Output, now time.Time) {
	if len(c.adapters) == 0 {
		return
	}
	active := c.adapterActive()
	acts := c.adapterStep(now)
	if vs := c.checkAdapters(acts, active, now); len(vs) > 0 {
		out.Violations = append(out.Violations, c.violated(vs, now)...)
		c.pinnedOnly = true
	}
	for i := range acts {
		c.record(acts[i].Decision)
	}
	out.Actions = append(out.Actions, acts...)
}

// advise runs the policy on a copy and records changed advice.
func (c *Controller) advise(now time.Time) {
	c.snapshot = append(c.snapshot[:0], c.reps...)
	acts := c.step(now)
	c.reps = append(c.reps[:0], c.snapshot...)
	seen := make(map[ModelID]bool, len(acts))
	for _, a := range acts {
		seen[a.Model] = true
		if c.advised[a.Model] == a.Kind {
			continue
		}
		c.advised[a.Model] = a.Kind
		d := a.Decision
		d.Advised = true
		c.record(d)
	}
	for m := range c.advised {
		if !seen[m] {
			delete(c.advised, m)
		}
	}
}

func (c *Controller) record(d Decision) {
	if len(c.decisions) < c.cfg.MaxDecisions {
		c.decisions = append(c.decisions, d)
	} else {
		c.decisions[c.decNext] = d
		c.decNext = (c.decNext + 1) % len(c.decisions)
	}
	c.decTotal++
}

// observe updates the replicas from an event. An event for an unknown model
// is ignored (the node may report an engine the controller already
// forgot); a bad deployment returns its error and changes nothing.
func (c *Controller) observe(ev Event, now time.Time) error {
	switch e := ev.(type) {
	case RequestArrived:
		if r := c.rep(e.Model); r != nil {
			r.active++
			if r.state == Draining {
				r.held++
			}
			r.lastUse = now
			r.prewarm = false
			r.rejected = false
			r.opHeld = false
			// A request without keep_alive takes the card's idle
			// timeouts again, as Ollama's default does (keepalive.go).
			r.keepSet = false
			r.done.add(now, 1, 0)
			c.arrived(r, now)
			r.fc.observe(now, c.cfg.RateHalfLife)
		}
	case ProtectModels:
		if !c.cfg.BestEffort {
			return fmt.Errorf("protect: card %s runs without the protected set (gpuplane agent --best-effort=false): every model competes for it by value", c.cfg.Card)
		}
		for _, m := range e.Models {
			if c.rep(m) == nil {
				return fmt.Errorf("protect: model %s: not on card %s", m, c.cfg.Card)
			}
		}
		if err := c.protectFits(e.Models); err != nil {
			return err
		}
		c.be.pinned, c.be.by = slices.Clone(e.Models), e.By
		c.be.at = time.Time{}
	case RequestFinished:
		if r := c.rep(e.Model); r != nil {
			if r.active > 0 {
				r.active--
			}
			r.held = min(r.held, r.active)
			r.lastUse = now
			r.prof.tokens(e.Tokens, e.Elapsed)
			if e.Answered {
				r.done.add(now, 0, 1)
			}
		}
	case RequestsActive:
		if r := c.rep(e.Model); r != nil && e.Active >= 0 {
			r.active = e.Active
			r.held = min(r.held, r.active)
		}
	case LoadDone:
		r := c.rep(e.Model)
		switch {
		case r == nil:
		case r.state == Loading:
			r.prof.loaded(now.Sub(r.opStart))
			c.becameResident(r, now)
		case r.state == Waking:
			r.prof.woke(now.Sub(r.opStart))
			c.becameResident(r, now)
		case c.cfg.Mode == Advise && (r.state == Cold || r.state == Failed):
			// In advise mode the node loads replicas as it always did.
			c.becameResident(r, now)
		}
	case WakeDone:
		if r := c.rep(e.Model); r != nil && r.state == Waking {
			r.prof.woke(now.Sub(r.opStart))
			c.becameResident(r, now)
		}
	case LoadFailed:
		if r := c.rep(e.Model); r != nil && (r.state == Loading || r.state == Waking) {
			c.fail(r, now)
		}
	case EngineCrashed:
		if r := c.rep(e.Model); r != nil && r.state != Cold {
			c.fail(r, now)
		}
	case SleepDone:
		if r := c.rep(e.Model); r != nil && r.state == Draining && r.pending == ActSleep {
			r.pending, r.issued, r.drainFor = 0, false, ""
			c.setState(r, Sleeping, now)
			if e.Measured && e.Residual >= 0 {
				// Measured as it completed: the step that follows counts
				// what the sleep really kept. Unmeasured, a sleep with no
				// residual known counts nothing until the card's next
				// memory sample (its footprint would evict the sleeper for
				// memory it already freed; nothing lets a load start into
				// memory it may keep: TestASleepReportsWhatItKept).
				r.measured = e.Residual
				r.prof.memory(r.state, e.Residual-c.loadedAdapterBytes(r), r.mem)
			}
		}
	case Unloaded:
		if r := c.rep(e.Model); r != nil && r.state != Cold {
			r.pending, r.issued, r.drainFor = 0, false, ""
			c.setState(r, Cold, now)
			if r.removed {
				c.remove(e.Model)
			}
		}
	case MemorySample:
		if r := c.rep(e.Model); r != nil && e.Bytes >= 0 && r.state != Cold && r.state != Failed {
			r.measured = e.Bytes
			// The profile learns the base alone: its adapters come and go.
			// Only adapters confirmed loaded are surely in the sample; one
			// loading or unloading may or may not be, and counting it in
			// the base errs on the safe side.
			r.prof.memory(r.state, e.Bytes-c.loadedAdapterBytes(r), r.mem)
		}
	case DeploymentAdded:
		return c.upsert(e.Deployment, now)
	case DeploymentChanged:
		return c.upsert(e.Deployment, now)
	case DeploymentRemoved:
		if r := c.rep(e.Model); r != nil {
			r.removed = true
			// The requests held for a drained engine's return fail with
			// the deployment (the gateway answers them): a drain now
			// waits for the ones running only.
			r.held = 0
			if r.state == Cold || r.state == Failed {
				c.remove(e.Model)
			}
		}
	case KeepAlive:
		c.keepAlive(e)
	case OperatorLoad:
		r, err := c.operatorCheck(e.Model, true, e.By)
		if err != nil {
			return err
		}
		r.opBy = e.By
		r.opHeld = false
		// A preloaded model follows the card's idle timeouts, as Ollama's
		// preload takes the default keep_alive.
		r.keepSet = false
		if r.state != Resident && r.state != Loading && r.state != Waking {
			r.opLoad = true
		}
	case OperatorUnload:
		r, err := c.operatorCheck(e.Model, false, e.By)
		if err != nil {
			return err
		}
		r.opBy = e.By
		r.opLoad, r.opUnload, r.opHeld = false, true, true
	case ClearViolations:
		c.pinnedOnly = false
		c.lastBroken = ""
	case Tick:
	}
	return nil
}

func (c *Controller) becameResident(r *replica, now time.Time) {
	r.failures = 0
	r.opLoad = false
	c.setState(r, Resident, now)
	if r.pending != 0 {
		// A drain or removal arrived while loading: it starts now.
		c.setState(r, Draining, now)
		if r.drainBy.Before(now) {
			r.drainBy = now.Add(c.cfg.DrainDeadline)
		}
	}
}

func (c *Controller) fail(r *replica, now time.Time) {
	r.prof.Failures++
	r.failures++
	back := c.cfg.RetryBackoff << min(r.failures-1, 20)
	if back > c.cfg.MaxBackoff || back <= 0 {
		back = c.cfg.MaxBackoff
	}
	r.retryAt = now.Add(back)
	r.opLoad = false
	r.pending, r.issued, r.drainFor = 0, false, ""
	c.setState(r, Failed, now)
	if r.removed {
		c.remove(r.dep.Model)
	}
}

func (c *Controller) upsert(d Deployment, now time.Time) error {
	if err := d.validate(); err != nil {
		return err
	}
	if r := c.rep(d.Model); r != nil {
		if d.Residency.Reserves() && !r.dep.Residency.Reserves() && !r.issued &&
			(r.pending == ActEvict || r.pending == ActUnload) && d.CanSleep {
			// Now warm or pinned: a demotion decided before goes to host RAM,
			// so the model wakes rather than cold-loads.
			r.pending = ActSleep
		}
		r.dep = d
		r.prof = c.prof.get(d.profileKey())
		r.mem = r.prof.memAt(d.Share)
		r.removed = false
		return nil
	}
	c.index[d.Model] = len(c.reps)
	prof := c.prof.get(d.profileKey())
	c.reps = append(c.reps, replica{dep: d, prof: prof, mem: prof.memAt(d.Share), state: Cold, since: now})
	return nil
}

func (c *Controller) remove(m ModelID) {
	i, ok := c.index[m]
	if !ok {
		return
	}
	last := len(c.reps) - 1
	if i != last {
		c.reps[i] = c.reps[last]
		c.index[c.reps[i].dep.Model] = i
	}
	c.reps = c.reps[:last]
	delete(c.index, m)
	delete(c.advised, m)
}

func (c *Controller) recordThrash(acts []Action, now time.Time) {
	c.evictions = append(c.evictions, c.stepEvictions...)
	c.returns = append(c.returns, c.stepReturns...)
	c.recordCuts(now)
	c.low = c.stepLow
	if c.stepLowNext != nil {
		c.lowNext = c.stepLowNext
	}
	for k, t := range c.lowNext {
		if now.After(t.next(min(lowerShare, beAmpleShare))) {
			delete(c.lowNext, k)
		}
	}
	for _, a := range acts {
		switch a.Kind {
		case ActSerialize:
			c.serialized[pairOf(a.Model, a.Peer)] = now.Add(c.cfg.SerializeFor)
		}
	}
	for i, k := range c.stepProtects {
		c.protected[k] = c.stepKeep[i]
	}
	// Forget what fell out of the window.
	c.evictions = c.evictions[:copy(c.evictions, c.evictions[inWindow(c.evictions, now, c.cfg.ThrashWindow):])]
	c.returns = c.returns[:copy(c.returns, c.returns[inWindow(c.returns, now, c.cfg.ThrashWindow):])]
	for k, until := range c.serialized {
		if now.After(until) {
			delete(c.serialized, k)
		}
	}
	for k, p := range c.protected {
		if now.After(p.until) {
			delete(c.protected, k)
		}
	}
}

// inWindow is the index of the first of es (oldest first) within window of
// now.
func inWindow(es []eviction, now time.Time, window time.Duration) int {
	cut := 0
	for cut < len(es) && now.Sub(es[cut].at) > window {
		cut++
	}
	return cut
}
