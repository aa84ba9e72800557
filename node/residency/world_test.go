package residency_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/node/residency"
)

// The world is the card the controller manages, simulated in virtual time:
// engines that take time to load, wake, sleep and stop, hold memory, and run
// requests. It executes the controller's actions and reports their outcomes
// as events, like the agent will. It keeps its own account of memory and
// requests, and checks docs/residency.md's invariants from that account alone,
// independently of the controller's bookkeeping.

const gi = int64(1) << 30

var debugModel = ""

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// truth is what an engine really does; the controller learns it only from
// events.
type truth struct {
	foot, peak, residual       int64
	load, wake, sleep, stopDur time.Duration
	failLoad                   bool // the next load fails
}

type engState uint8

const (
	off engState = iota
	loading
	up
	waking
	goingToSleep
	asleep
	stopping
)

var engStateNames = [...]string{"off", "loading", "up", "waking", "goingToSleep", "asleep", "stopping"}

func (s engState) String() string { return engStateNames[s] }

type request struct {
	id   int
	done time.Time
	// adapter is the adapter it uses ("" for the base).
	adapter string
}

type engine struct {
	dep      residency.Deployment
	tr       truth
	state    engState
	mem      int64
	inflight []request
	queued   []time.Duration // service times of requests waiting for the engine
	draining bool
	drainAt  time.Time
	drainOK  bool
	// drainFor is how long the drain lets requests run: the deadline, or
	// nothing when background work gives way to interactive demand (docs/gateway.md: an interactive request never waits behind background work).
	drainFor time.Duration
	removed  bool
	// lent is true from a warm engine's sleep until it loads or wakes.
	lent bool
	// wantedAt is when a request found this warm engine asleep.
	wantedAt time.Time
	// epoch invalidates timers of an operation that a crash cut short.
	epoch  int
	served int
	// ads are the engine's adapters (world_adapters_test.go); nil for a
	// model without any.
	ads *engAdapters
	// waitStart is when the model's current wait for the card began
	// (zero while up); upAt when the engine last came up (the turn rule,
	// outranks).
	waitStart, upAt time.Time
	// yieldTo is the borrower this warm owner yields its turn to, after a
	// serialize decision (docs/residency.md, "No starvation"): its share
	// stays lent while its requests wait, for at most yieldBound; or the
	// model in a lower-class or best-effort turn it yields to (yieldTurn),
	// for at most turnBound.
	yieldTo   residency.ModelID
	yieldTurn bool
}

type timer struct {
	at  time.Time
	seq int
	fn  func()
}

type world struct {
	t      testing.TB
	clk    *residency.ManualClock
	c      *residency.Controller
	cfg    residency.Config
	usable int64
	eng    map[residency.ModelID]*engine
	names  []residency.ModelID
	timers []timer
	seq    int
	queue  []residency.Event
	acts   []residency.Action
	// violations found by the world's own checks; ctrlViolations reported
	// by the controller.
	violations     []string
	ctrlViolations []residency.Violation
	nextReq        int
	// onStep, when set, runs after every event the controller handled.
	onStep func()
	// maxNonPinned is the most memory non-pinned engines held at once.
	maxNonPinned int64
}

func newWorld(t testing.TB, cfg residency.Config) *world {
	t.Helper()
	clk := residency.NewManualClock(epoch)
	c, err := residency.New(cfg, clk)
	if err != nil {
		t.Fatal(err)
	}
	return &world{t: t, clk: clk, c: c, cfg: cfg, usable: c.Usable(), eng: map[residency.ModelID]*engine{}}
}

func (w *world) now() time.Time { return w.clk.Now() }

func (w *world) violate(format string, args ...any) {
	w.violations = append(w.violations, fmt.Sprintf("%v: ", w.now().Sub(epoch))+fmt.Sprintf(format, args...))
}

func (w *world) add(d residency.Deployment, tr truth) {
	if _, ok := w.eng[d.Model]; !ok {
		w.names = append(w.names, d.Model)
	}
	w.eng[d.Model] = &engine{dep: d, tr: tr}
	w.send(residency.DeploymentAdded{Deployment: d})
}

func (w *world) change(d residency.Deployment) {
	w.eng[d.Model].dep = d
	w.send(residency.DeploymentChanged{Deployment: d})
}

func (w *world) removeModel(m residency.ModelID) {
	e := w.eng[m]
	e.removed = true
	w.send(residency.DeploymentRemoved{Model: m})
	// Requests waiting for a removed model fail at once.
	for range e.queued {
		w.send(residency.RequestFinished{Model: m})
	}
	e.queued = nil
}

// request sends one request for m that takes service once dispatched.
func (w *world) request(m residency.ModelID, service time.Duration) {
	e := w.eng[m]
	if e.removed {
		return
	}
	if e.dep.Residency == residency.Warm && (e.state == asleep || e.state == goingToSleep) && len(e.queued) == 0 && len(e.inflight) == 0 {
		e.wantedAt = w.now()
	}
	w.wants(e)
	e.queued = append(e.queued, service)
	// The node's loop tells the controller before it dispatches, so an
	// eviction decided earlier never races a request onto the engine.
	w.send(residency.RequestArrived{Model: m})
	w.flush()
	w.dispatch(m)
}

// wants notes a request for e: its wait for the card starts with the
// first request since it was last up (the world's reading is the most
// lenient one: the controller may start counting later, never earlier).
func (w *world) wants(e *engine) {
	if e.state != up && e.waitStart.IsZero() {
		e.waitStart = w.now()
	}
}

// dispatch starts queued requests on an engine that serves.
func (w *world) dispatch(m residency.ModelID) {
	e := w.eng[m]
	if e.state != up || e.draining {
		return
	}
	for _, s := range e.queued {
		w.nextReq++
		r := request{id: w.nextReq, done: w.now().Add(s)}
		e.inflight = append(e.inflight, r)
		ep := e.epoch
		w.after(s, func() {
			if e.epoch != ep {
				return
			}
			i := slices.IndexFunc(e.inflight, func(x request) bool { return x.id == r.id })
			if i < 0 {
				return
			}
			e.inflight = slices.Delete(e.inflight, i, i+1)
			e.served++
			w.send(residency.RequestFinished{Model: m, Tokens: 100, Elapsed: s, Answered: true})
		})
	}
	e.queued = e.queued[:0]
	e.wantedAt = time.Time{}
	w.dispatchAdapters(m)
}

func (w *world) send(ev residency.Event) { w.queue = append(w.queue, ev) }

func (w *world) after(d time.Duration, fn func()) {
	w.seq++
	t := timer{at: w.now().Add(d), seq: w.seq, fn: fn}
	i, _ := slices.BinarySearchFunc(w.timers, t, func(a, b timer) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return a.seq - b.seq
	})
	w.timers = slices.Insert(w.timers, i, t)
}

// flush hands queued events to the controller, executing its actions.
func (w *world) flush() {
	for len(w.queue) > 0 {
		ev := w.queue[0]
		w.queue = w.queue[1:]
		out := w.c.Handle(ev)
		if debugModel != "" {
			if fmt.Sprint(ev) != "{}" && strings.Contains(fmt.Sprintf("%+v", ev), debugModel) {
				st, _ := w.c.Replica(residency.ModelID(debugModel))
				e := w.eng[residency.ModelID(debugModel)]
				w.t.Logf("%v %T %+v -> ctrl %s active %d; world %s inflight %d queued %d", w.now().Sub(epoch), ev, ev, st.State, st.Active, e.state, len(e.inflight), len(e.queued))
			}
		}
		w.ctrlViolations = append(w.ctrlViolations, out.Violations...)
		for _, a := range out.Actions {
			w.acts = append(w.acts, a)
			w.exec(a)
		}
		w.checkState()
		if w.onStep != nil {
			w.onStep()
		}
	}
}

// run advances virtual time to end, firing timers and a Tick every second.
func (w *world) run(d time.Duration) {
	end := w.now().Add(d)
	w.flush()
	for {
		next := w.now().Truncate(time.Second).Add(time.Second)
		if len(w.timers) > 0 && w.timers[0].at.Before(next) {
			next = w.timers[0].at
		}
		if next.After(end) {
			w.clk.Set(end)
			return
		}
		w.clk.Set(next)
		tick := next.Equal(next.Truncate(time.Second))
		for len(w.timers) > 0 && !w.timers[0].at.After(next) {
			t := w.timers[0]
			w.timers = w.timers[1:]
			t.fn()
			w.flush()
		}
		if tick {
			w.send(residency.Tick{})
			w.flush()
		}
	}
}

func (w *world) cutOff(m residency.ModelID) {
	e := w.eng[m]
	for _, r := range e.inflight {
		if r.adapter != "" {
			w.send(residency.AdapterFinished{Model: m, Adapter: r.adapter})
		}
		w.send(residency.RequestFinished{Model: m})
	}
	e.inflight = nil
	w.dropAdapters(e)
}

// outranks is the world's own reading of who may drain a busy engine.
func (w *world) outranks(by residency.ModelID, victim *engine, reason string) bool {
	b := w.eng[by]
	if b == nil {
		return false
	}
	if b.dep.Priority > victim.dep.Priority {
		return true
	}
	reserved := b.dep.Residency == residency.Pinned || b.dep.Residency == residency.Warm
	if reserved && victim.dep.Residency == residency.OnDemand {
		return true
	}
	// With the protected set on (docs/residency.md, "Best effort"), a
	// protected model's demand outranks a best-effort onDemand model as a
	// higher class does; the set is the one the controller has in force
	// (and states in its best-effort decisions).
	if w.cfg.BestEffort && w.c.Protected(by) && !w.c.Protected(victim.dep.Model) && victim.dep.Residency == residency.OnDemand {
		return true
	}
	// A lower class's bounded turn (docs/residency.md, "No starvation")
	// takes memory as a higher class would; the decision names it.
	if strings.Contains(reason, "'s turn as a") && victim.dep.Residency != residency.Pinned {
		return true
	}
	// The turn rule (docs/residency.md, "No starvation"): a model that has
	// waited the minimum residency may drain one of its class that has
	// been up at least that long.
	min := w.minResidency()
	// The world checks the class and the victim's time up; how long the
	// waiter waited it reads from the decision (the controller counts a
	// wait across requests the gateway gave up on).
	waited := !b.waitStart.IsZero() && w.now().Sub(b.waitStart) >= min || strings.Contains(reason, "had its turn")
	return b.dep.Priority == victim.dep.Priority && waited && victim.state == up && w.now().Sub(victim.upAt) >= min
}

func (w *world) minResidency() time.Duration {
	if w.cfg.MinResidency > 0 {
		return w.cfg.MinResidency
	}
	return 30 * time.Second
}

func (w *world) exec(a residency.Action) {
	e := w.eng[a.Model]
	if e == nil {
		w.violate("%s for unknown model %s", a.Kind, a.Model)
		return
	}
	d := a.Decision
	if d.Reason == "" || d.Card != w.cfg.Card || !d.Time.Equal(w.now()) {
		w.violate("%s %s: incomplete decision %+v", a.Kind, a.Model, d)
	}
	// A reason tells the truth about the numbers it compares.
	if strings.Contains(d.Reason, fmt.Sprintf(": value %.2f < ", d.Inputs.Value)) && d.Inputs.Value >= d.Inputs.ForValue {
		w.violate("%s %s: reason %q states value %.2f < %.2f", a.Kind, a.Model, d.Reason, d.Inputs.Value, d.Inputs.ForValue)
	}
	// Requests run on an engine that is up; those queued for a loading or
	// waking one wait for it, and only an owner or a higher priority may
	// cancel that load.
	busy := len(e.inflight) > 0 || e.state == up && len(e.queued) > 0
	waited := (e.state == loading || e.state == waking) && len(e.queued) > 0
	forOwner := w.eng[d.For] != nil && w.eng[d.For].dep.Residency != residency.OnDemand && !w.eng[d.For].removed
	// Who acts for a share or the desired state (an operator's call, a
	// placement or removal, an owner's return, a restart), and who for
	// waiting requests (their own, or their turn come due).
	var forShare, forDemand bool
	switch d.Trigger {
	case residency.TriggerOperator, residency.TriggerScheduler, residency.TriggerFailover,
		residency.TriggerOwnerReturn, residency.TriggerWatchdog:
		forShare = true
	case residency.TriggerRequest, residency.TriggerTurn:
		forDemand = true
	}
	// An operator's own unload (`gpuplane models unload`) may take a warm
	// model off; it names who asked and is for no other model.
	asked := d.Trigger == residency.TriggerOperator && d.For == "" && strings.Contains(d.Reason, "asked by the operator")
	operator := forShare && (e.removed || forOwner) || asked
	entitled := operator || forDemand && w.outranks(d.For, e, d.Reason)
	switch a.Kind {
	case residency.ActSleep, residency.ActEvict, residency.ActUnload, residency.ActDrain:
		// I2: pinned never demoted; warm never sent cold by others. A
		// removed deployment has no promise left: its drain may be cut
		// short by another's demand as any model's of its class.
		if e.dep.Residency == residency.Pinned && !operator && !e.removed {
			w.violate("I2: %s of pinned %s", a.Kind, a.Model)
		}
		if e.dep.Residency == residency.Warm && (a.Kind == residency.ActEvict || a.Kind == residency.ActUnload) && !operator && !e.removed {
			w.violate("I2: %s of warm %s", a.Kind, a.Model)
		}
	}
	switch a.Kind {
	case residency.ActLoad, residency.ActPrewarm:
		if e.state != off {
			w.violate("load of %s in state %s", a.Model, e.state)
			return
		}
		w.admitCheck(a.Model, e, e.tr.peak)
		e.state, e.mem, e.lent = loading, e.tr.peak, false
		e.epoch++
		ep := e.epoch
		w.after(e.tr.load, func() {
			if e.epoch != ep {
				return
			}
			if e.tr.failLoad {
				e.tr.failLoad = false
				e.state, e.mem = off, 0
				w.send(residency.LoadFailed{Model: a.Model, Err: "simulated load failure"})
				return
			}
			e.state, e.mem = up, e.tr.foot
			e.upAt, e.waitStart, e.yieldTo, e.yieldTurn = w.now(), time.Time{}, "", false
			w.send(residency.LoadDone{Model: a.Model})
			w.send(residency.MemorySample{Model: a.Model, Bytes: e.mem + e.adMem()})
			w.dispatch(a.Model)
		})
	case residency.ActWake:
		if e.state != asleep {
			w.violate("wake of %s in state %s", a.Model, e.state)
			return
		}
		w.admitCheck(a.Model, e, e.tr.foot)
		e.state, e.mem, e.lent = waking, e.tr.foot, false
		e.epoch++
		ep := e.epoch
		w.after(e.tr.wake, func() {
			if e.epoch != ep {
				return
			}
			e.state = up
			e.upAt, e.waitStart, e.yieldTo, e.yieldTurn = w.now(), time.Time{}, "", false
			w.send(residency.WakeDone{Model: a.Model})
			w.send(residency.MemorySample{Model: a.Model, Bytes: e.mem + e.adMem()})
			w.dispatch(a.Model)
		})
	case residency.ActDrain:
		if busy && !entitled {
			w.violate("I3: drain of busy %s (%s) for %s by %s", a.Model, e.dep.Priority, d.For, d.Trigger)
		}
		e.draining, e.drainAt, e.drainOK, e.drainFor = true, w.now(), true, w.drainDeadline()
		if f := w.eng[d.For]; f != nil && f.dep.Priority > residency.Background && e.dep.Priority == residency.Background {
			e.drainFor = 0
		}
	case residency.ActSleep, residency.ActEvict, residency.ActUnload:
		// Background work does not hold up a higher class: a drain for
		// background demand ends at once for it.
		hurried := e.dep.Priority == residency.Background && w.eng[d.For] != nil && w.eng[d.For].dep.Priority > residency.Background
		// A drain ends once its in-flight requests finish (I3); the ones
		// queued meanwhile were never dispatched to the draining engine
		// and wait for its return.
		done := len(e.inflight) == 0
		if busy && !operator && !(e.draining && e.drainOK && (w.now().Sub(e.drainAt) >= e.drainFor || hurried || done)) {
			w.violate("I3: %s of %s with %d in flight, %d queued, without an expired drain", a.Kind, a.Model, len(e.inflight), len(e.queued))
		}
		if waited && !entitled {
			w.violate("I3: %s cancels the %s of %s, %d requests waiting, for %q by %s", a.Kind, e.state, a.Model, len(e.queued), d.For, d.Trigger)
		}
		w.cutOff(a.Model)
		if len(e.queued) > 0 && e.waitStart.IsZero() {
			e.waitStart = w.now()
		}
		e.draining = false
		e.epoch++
		ep := e.epoch
		if a.Kind == residency.ActSleep {
			if e.state != up {
				w.violate("sleep of %s in state %s", a.Model, e.state)
				return
			}
			e.state = goingToSleep
			w.after(e.tr.sleep, func() {
				if e.epoch != ep {
					return
				}
				e.state, e.mem, e.lent = asleep, e.tr.residual, true
				w.send(residency.SleepDone{Model: a.Model})
				w.send(residency.MemorySample{Model: a.Model, Bytes: e.mem + e.adMem()})
			})
			return
		}
		if e.state != up && e.state != asleep && e.state != loading && e.state != waking {
			w.violate("%s of %s in state %s", a.Kind, a.Model, e.state)
			return
		}
		e.state = stopping
		w.after(e.tr.stopDur, func() {
			if e.epoch != ep {
				return
			}
			e.state, e.mem = off, 0
			w.send(residency.Unloaded{Model: a.Model})
		})
	case residency.ActReject:
		for range e.queued {
			w.send(residency.RequestFinished{Model: a.Model})
		}
		e.queued = nil
		e.wantedAt = time.Time{}
	case residency.ActSerialize, residency.ActProtect:
		if a.Peer == "" || w.eng[a.Peer] == nil {
			w.violate("%s %s with unknown peer %q", a.Kind, a.Model, a.Peer)
		}
		// A lower-class or best-effort turn's holder may be of any
		// residency but pinned.
		turn := strings.Contains(d.Reason, "'s turn as a ")
		if a.Kind == residency.ActSerialize && e.dep.Residency == residency.Warm && e.state != up && w.eng[a.Peer] != nil &&
			(w.eng[a.Peer].dep.Residency == residency.OnDemand || turn) {
			e.yieldTo, e.yieldTurn = a.Peer, turn
		}
	case residency.ActLoadAdapter, residency.ActUnloadAdapter, residency.ActDropAdapter:
		w.execAdapter(a, e)
	}
}

func (w *world) drainDeadline() time.Duration {
	if w.cfg.DrainDeadline > 0 {
		return w.cfg.DrainDeadline
	}
	return 30 * time.Second
}

// claims is what every engine keeps others from using, by the world's
// account: a pinned engine its share, a warm one its share unless it sleeps
// and nobody asks for it.
func (w *world) claims() (claims, mem int64) {
	for _, m := range w.names {
		e := w.eng[m]
		// An engine holds its adapters on the card beside its weights.
		em := e.mem + e.adMem()
		mem += em
		switch {
		case e.removed:
			claims += em
		case e.dep.Residency == residency.Pinned:
			claims += max(e.dep.Share, em)
		case e.dep.Residency == residency.Warm && (e.state == asleep || e.state == off && e.lent) &&
			(len(e.queued) == 0 && len(e.inflight) == 0 || e.yieldTo != "" && (e.wantedAt.IsZero() || w.now().Sub(e.wantedAt) <= w.ownerBound(e))):
			claims += em
		case e.dep.Residency == residency.Warm:
			claims += max(e.dep.Share, em)
		default:
			claims += em
		}
	}
	return claims, mem
}

// admitCheck: a borrower (onDemand) starts taking memory only where no
// promise is outstanding (I2), and nothing starts beyond usable (I1).
func (w *world) admitCheck(m residency.ModelID, e *engine, bytes int64) {
	claims, mem := w.claims()
	if mem-e.mem+bytes > w.usable {
		w.violate("I1: %s starts with %d MiB, card would hold %d MiB > usable %d MiB", m, bytes>>20, (mem-e.mem+bytes)>>20, w.usable>>20)
	}
	if e.dep.Residency == residency.OnDemand && claims-e.mem+bytes > w.usable {
		w.violate("I2: onDemand %s starts with %d MiB while claims are %d MiB of usable %d MiB", m, bytes>>20, (claims-e.mem+bytes)>>20, w.usable>>20)
	}
}

// checkState checks the card after every step.
func (w *world) checkState() {
	_, mem := w.claims()
	if mem > w.usable {
		w.violate("I1: engines hold %d MiB > usable %d MiB", mem>>20, w.usable>>20)
	}
	var nonPinned int64
	for _, m := range w.names {
		e := w.eng[m]
		if e.dep.Residency != residency.Pinned {
			nonPinned += e.mem
		}
		// I2: a warm owner asked for gets its memory back in bounded time.
		if bound := w.ownerBound(e); !e.wantedAt.IsZero() && w.now().Sub(e.wantedAt) > bound && e.state == asleep {
			w.violate("I2: warm %s asked for %v ago and still asleep", m, w.now().Sub(e.wantedAt))
			e.wantedAt = time.Time{}
		}
	}
	w.maxNonPinned = max(w.maxNonPinned, nonPinned)
}

// returnBound is how long a warm owner may wait: a borrower may finish its
// load, drain to the deadline and stop, then the owner wakes.
// yieldBound is how much longer a warm owner that yields its turn waits:
// the borrower's load, its turn on the card (the minimum residency, or four
// wakes: an engine that cannot sleep comes back by a cold load), and the
// owner's drain before it.
func (w *world) yieldBound(b residency.ModelID) time.Duration {
	var load, wake time.Duration
	for _, e := range w.eng {
		load = max(load, e.tr.load)
		wake = max(wake, e.tr.wake)
	}
	if e := w.eng[b]; e != nil && !e.dep.CanSleep {
		wake = max(wake, e.dep.LoadTime, e.tr.load)
	}
	return 2*load + max(w.minResidency(), 4*wake) + w.drainDeadline()
}

// turnBound is how much longer a warm owner that yields to a lower-class
// or best-effort turn waits (docs/residency.md, "No starvation": warm
// owners that would not fit beside the turn's holder yield until the turn
// ends, and take their share back then): the owner's return may have begun
// before the turn was granted (returnBound), then the turn at its longest
// — the drain of what it takes memory from, a stop, the holder's reload
// twice and its slot, max(3 min, 2 × its load). One turn per wait: an
// owner kept asleep by two turns in a row exceeds it.
func (w *world) turnBound(h residency.ModelID) time.Duration {
	e := w.eng[h]
	load := max(e.dep.LoadTime, e.tr.load)
	return w.returnBound() + w.drainDeadline() + 10*time.Second + 2*load + max(3*time.Minute, 2*load)
}

// ownerBound is how long warm owner e, asked for, may stay asleep.
func (w *world) ownerBound(e *engine) time.Duration {
	switch {
	case e.yieldTurn:
		return w.returnBound() + w.turnBound(e.yieldTo)
	case e.yieldTo != "":
		return w.returnBound() + w.yieldBound(e.yieldTo)
	}
	return w.returnBound()
}

func (w *world) returnBound() time.Duration {
	var load, stop time.Duration
	for _, e := range w.eng {
		load = max(load, e.tr.load, e.tr.wake)
		stop = max(stop, e.tr.stopDur, e.tr.sleep)
	}
	return load + w.drainDeadline() + stop + 5*time.Second
}

func (w *world) assertClean() {
	w.t.Helper()
	if len(w.violations) > 0 {
		w.t.Fatalf("%d invariant violations seen by the world, first: %s", len(w.violations), strings.Join(w.violations[:min(5, len(w.violations))], "\n"))
	}
	if len(w.ctrlViolations) > 0 {
		w.t.Fatalf("controller reported %d violations, first at %v: %v", len(w.ctrlViolations), w.ctrlViolations[0].Time.Sub(epoch), w.ctrlViolations[0])
	}
}

// actions returns the actions for m (any model when m is empty) of the
// given kinds.
func (w *world) actions(m residency.ModelID, kinds ...residency.ActionKind) []residency.Action {
	var out []residency.Action
	for _, a := range w.acts {
		if (m == "" || a.Model == m) && (len(kinds) == 0 || slices.Contains(kinds, a.Kind)) {
			out = append(out, a)
		}
	}
	return out
}

func (w *world) state(m residency.ModelID) residency.State {
	s, _ := w.c.Replica(m)
	return s.State
}

func (w *world) dump() string {
	var b strings.Builder
	for _, d := range w.c.Decisions() {
		fmt.Fprintf(&b, "%8v %-9s %-8s %-9s %s\n", d.Time.Sub(epoch), d.Action, d.Model, d.Trigger, d.Reason)
	}
	return b.String()
}

// rnd is a seeded source for the tests.
func rnd(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)) }
