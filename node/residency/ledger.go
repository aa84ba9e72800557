package residency

import (
	"fmt"
	"strings"
	"time"
)

// Figures the controller uses for a replica: the profiler's measurement once
// there is one, the deployment's prior before. Times are learned per
// variant; memory per variant and share, since an engine sizes its KV pool
// by its share: a larger replica's footprint must not make a smaller one
// claim more than was promised to it, nor a smaller one's understate a
// larger one's.

func (c *Controller) footprint(r *replica) int64 {
	if f := r.mem.footprint; f > 0 {
		return f
	}
	if r.dep.Footprint > 0 {
		return r.dep.Footprint
	}
	return r.dep.Share
}

// peak is the cost of a load in progress: never below the footprint.
// Before any load of the model was seen and with no prior, a load is
// taken to hold its whole share: an engine is sized to its share, and
// nothing yet says what its load holds.
func (c *Controller) peak(r *replica) int64 {
	if r.dep.Peak == 0 && r.mem.peak == 0 && r.dep.Footprint == 0 && r.mem.footprint == 0 {
		return max(c.footprint(r), r.dep.Share)
	}
	return max(r.dep.Peak, c.footprint(r), r.mem.peak)
}

func (c *Controller) residual(r *replica) int64 {
	if v := r.mem.residual; v > 0 {
		return v
	}
	return r.dep.Residual
}

func (c *Controller) loadTime(r *replica) time.Duration {
	if r.prof.Loads > 0 {
		return r.prof.LoadTime
	}
	if r.dep.LoadTime > 0 {
		return r.dep.LoadTime
	}
	return c.unmeasuredLoadTime(r)
}

// unmeasuredLoadPerGiB is what a load is assumed to take per GiB of its
// footprint when neither a prior nor any load on the card says more: a
// slow disk's read and an engine's start (200 MiB/s).
const unmeasuredLoadPerGiB = 5 * time.Second

// unmeasuredLoadTime is a load's expected time before it was ever
// measured or given: its footprint at the slowest rate measured on the
// card (unmeasuredLoadPerGiB when none is slower), so that an unknown
// load is never taken to be instant (a load into lent memory is only
// started where it finishes before the owner may want the memory back).
func (c *Controller) unmeasuredLoadTime(r *replica) time.Duration {
	per := unmeasuredLoadPerGiB
	for i := range c.reps {
		o := &c.reps[i]
		if o.prof != nil && o.prof.Loads > 0 {
			if f := c.footprint(o); f > 0 {
				per = max(per, time.Duration(float64(o.prof.LoadTime)*float64(1<<30)/float64(f)))
			}
		}
	}
	return time.Duration(float64(per) * float64(c.footprint(r)) / float64(1<<30))
}

func (c *Controller) wakeTime(r *replica) time.Duration {
	if !r.dep.CanSleep {
		return c.loadTime(r)
	}
	if r.prof.Wakes > 0 {
		return r.prof.WakeTime
	}
	if r.dep.WakeTime > 0 {
		return r.dep.WakeTime
	}
	// No prior and no wake measured yet: a wake is assumed to cost what a
	// load does (an upper bound) until one is measured, so an unmeasured
	// model is neither valued at nothing nor lent as if free to wake.
	return c.loadTime(r)
}

// reload is what bringing r to the card costs from its current tier.
func (c *Controller) reload(r *replica) time.Duration {
	if r.state == Sleeping {
		return c.wakeTime(r)
	}
	return c.loadTime(r)
}

// hostBytes is what r's sleep moves to host RAM: nothing when its sleep
// discards the weights.
func (c *Controller) hostBytes(r *replica) int64 {
	if r.dep.SleepDiscards {
		return 0
	}
	return max(c.footprint(r)-c.residual(r), 0)
}

// cost is what r holds on the card now (docs/residency.md): a load in progress its
// peak, a resident (or draining, or waking) engine its footprint, a sleeping
// one its residual, and never less than the last measured sample.
func (c *Controller) cost(r *replica) int64 {
	var v int64
	switch r.state {
	case Cold, Failed:
		return 0
	case Loading:
		v = c.peak(r)
	case Resident, Draining, Waking:
		v = c.footprint(r) + c.adapterBytes(r)
	case Sleeping:
		v = c.residual(r)
	}
	return max(v, r.measured)
}

// committedCost is r's cost once the operation pending on it completes.
func (c *Controller) committedCost(r *replica) int64 {
	switch r.pending {
	case ActSleep:
		return c.residual(r)
	case ActEvict, ActUnload:
		return 0
	}
	return c.cost(r)
}

// lent reports whether a warm model's share is lent to others: only while
// it sleeps (or, committed, is being put to sleep) and nobody asks for it.
// An engine that crashed or was unloaded while asleep keeps its share lent
// until it is asked for.
func lent(r *replica, committed bool) bool {
	if r.active > 0 && !r.yielding || r.prewarm {
		return false
	}
	switch r.state {
	case Sleeping:
		return true
	case Cold, Failed:
		return r.wasLent
	}
	return committed && r.pending == ActSleep
}

// claim is what r keeps others from using: a pinned model its share (or
// more, if it measures more), a warm model the same unless its share is lent,
// an onDemand model what it holds. With committed, pending operations count
// as done.
func (c *Controller) claim(r *replica, committed bool) int64 {
	v := c.cost(r)
	if committed {
		v = c.committedCost(r)
	}
	if r.removed {
		return v
	}
	switch r.dep.Residency {
	case Pinned:
		return max(r.dep.Share, v)
	case Warm:
		if lent(r, committed) {
			return v
		}
		return max(r.dep.Share, v)
	}
	return v
}

// LedgerEntry is one replica in the ledger.
type LedgerEntry struct {
	Model     ModelID
	Residency Residency
	Priority  Priority
	State     State
	Share     int64
	Cost      int64
	Claim     int64
	Active    int
	Pending   ActionKind
}

// Ledger is the card's memory account at one moment.
type Ledger struct {
	Card     string
	Memory   int64
	Usable   int64
	Reserved int64 // Σ shares of pinned and warm models
	Resident int64 // Σ cost of loading, resident, draining and waking engines
	Sleeping int64 // Σ cost of sleeping engines
	Claimed  int64 // Σ claims (promises included)
	Free     int64 // Usable − Σ cost
	Entries  []LedgerEntry
}

// Ledger returns the card's memory account now.
func (c *Controller) Ledger() Ledger { return c.ledger(c.reps) }

func (c *Controller) ledger(reps []replica) Ledger {
	l := Ledger{Card: c.cfg.Card, Memory: c.cfg.Memory, Usable: c.usable, Entries: make([]LedgerEntry, 0, len(reps))}
	var used int64
	for i := range reps {
		r := &reps[i]
		cost, claim := c.cost(r), c.claim(r, false)
		used += cost
		l.Claimed += claim
		if r.dep.Residency.Reserves() && !r.removed {
			l.Reserved += r.dep.Share
		}
		if r.state == Sleeping {
			l.Sleeping += cost
		} else {
			l.Resident += cost
		}
		l.Entries = append(l.Entries, LedgerEntry{Model: r.dep.Model, Residency: r.dep.Residency, Priority: r.dep.Priority,
			State: r.state, Share: r.dep.Share, Cost: cost, Claim: claim, Active: r.active, Pending: r.pending})
	}
	l.Free = l.Usable - used
	return l
}

func (l Ledger) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "card %s usable %s reserved %s resident %s sleeping %s claimed %s free %s",
		l.Card, gib(l.Usable), gib(l.Reserved), gib(l.Resident), gib(l.Sleeping), gib(l.Claimed), gib(l.Free))
	for _, e := range l.Entries {
		fmt.Fprintf(&b, "; %s %s %s cost %s claim %s active %d", e.Model, e.Residency, e.State, gib(e.Cost), gib(e.Claim), e.Active)
		if e.Pending != 0 {
			fmt.Fprintf(&b, " pending %s", e.Pending)
		}
	}
	return b.String()
}

// Violation is a broken ledger invariant: a bug in the controller or an
// engine holding more than it may. It carries the ledger at that moment.
type Violation struct {
	Time      time.Time
	Card      string
	Invariant string // I1, I2 or I3
	Detail    string
	Ledger    Ledger
}

func (v Violation) Error() string {
	return fmt.Sprintf("card %s: ledger invariant %s violated: %s (%s)", v.Card, v.Invariant, v.Detail, v.Ledger)
}

const maxViolationsKept = 16

// violated counts and keeps vs. A violation already reported while it
// persists (the same invariants broken as in the previous step) is returned
// again but counted once.
func (c *Controller) violated(vs []Violation, now time.Time) []Violation {
	var key strings.Builder
	for _, v := range vs {
		key.WriteString(v.Invariant)
		key.WriteString(v.Detail)
	}
	if key.String() == c.lastBroken {
		return vs
	}
	c.lastBroken = key.String()
	c.violationCount += len(vs)
	c.violations = append(c.violations, vs...)
	if n := len(c.violations); n > maxViolationsKept {
		c.violations = append(c.violations[:0], c.violations[n-maxViolationsKept:]...)
	}
	return vs
}

// check verifies the invariants of docs/residency.md after a step: I1 and I2 on the
// ledger the step leaves, I2 and I3 on the actions it took from the state
// before it.
func (c *Controller) check(before []replica, acts []Action, now time.Time) []Violation {
	var vs []Violation
	add := func(inv, format string, args ...any) {
		vs = append(vs, Violation{Time: now, Card: c.cfg.Card, Invariant: inv, Detail: fmt.Sprintf(format, args...)})
	}
	var used, claimed, committed int64
	for i := range c.reps {
		r := &c.reps[i]
		used += c.cost(r)
		claimed += c.claim(r, false)
		committed += c.claim(r, true)
	}
	// I1: physical.
	if used > c.usable {
		add("I1", "costs %s exceed usable %s", gib(used), gib(c.usable))
	}
	// I2: promises, counting the memory being returned.
	if committed > c.usable {
		add("I2", "claims after pending operations %s exceed usable %s: a reserved share is used by others", gib(committed), gib(c.usable))
	}
	// A step neither adds nor removes replicas: before[i] is c.reps[i]
	// before the step.
	for i := range c.reps {
		r, b := &c.reps[i], &before[i]
		if r.dep.Residency.Reserves() {
			continue
		}
		started := (r.state == Loading || r.state == Waking) && b.state != Loading && b.state != Waking
		if started && claimed > c.usable {
			add("I2", "%s started %s while promises are being returned (claims %s > usable %s)",
				r.dep.Model, strings.ToLower(r.state.String()), gib(claimed), gib(c.usable))
		}
	}
	for _, a := range acts {
		i, ok := c.index[a.Model]
		if !ok || i >= len(before) {
			continue
		}
		b := &before[i]
		d := a.Decision
		stops := a.Kind == ActSleep || a.Kind == ActEvict || a.Kind == ActUnload
		switch {
		case b.dep.Residency == Pinned && !b.removed && (stops || a.Kind == ActDrain) && !d.Trigger.entitles():
			add("I2", "%s of pinned %s (trigger %s)", a.Kind, a.Model, d.Trigger)
		case b.dep.Residency == Warm && !b.removed && (a.Kind == ActEvict || a.Kind == ActUnload) && !d.Trigger.entitles():
			add("I2", "%s of warm %s (trigger %s): a warm model is never sent cold by others", a.Kind, a.Model, d.Trigger)
		case (a.Kind == ActLoad || a.Kind == ActPrewarm) && b.state != Cold && b.state != Failed:
			add("I2", "cold %s of %s from %s", a.Kind, a.Model, b.state)
		case a.Kind == ActWake && b.state != Sleeping:
			add("I2", "wake of %s from %s", a.Model, b.state)
		}
		// Requests that came while b drained (held) wait at the gateway
		// for its return: they are not work the engine has.
		if skipI3 || b.active-b.held <= 0 || b.state == Sleeping {
			continue
		}
		// I3: active work. Requests run on a resident or draining engine;
		// those waiting for a sleeping, loading or waking one wait at the
		// gateway, and only an owner or a higher priority may make them
		// wait longer by cancelling that load.
		serving := b.state == Resident || b.state == Draining
		entitled := d.Trigger.entitles() && (b.removed || c.owner(d.For)) ||
			d.Trigger.demand() && c.outranks(d.For, b, now)
		switch {
		case stops && serving && (b.pending == 0 || now.Before(b.drainBy)):
			add("I3", "%s of %s with %d requests active and no expired drain", a.Kind, a.Model, b.active)
		case stops && !serving && !entitled:
			add("I3", "%s cancels the %s of %s, which %d requests wait for, by %s for %q, which does not outrank it",
				a.Kind, strings.ToLower(b.state.String()), a.Model, b.active, d.Trigger, d.For)
		case a.Kind == ActDrain && !entitled:
			add("I3", "drain of %s (%s, %d requests active) by %s for %q, which does not outrank it",
				a.Model, b.dep.Priority, b.active, d.Trigger, d.For)
		}
	}
	for i := range vs {
		vs[i].Ledger = c.ledger(c.reps)
	}
	return vs
}

// owner reports whether m holds a reserved share the operator placed.
func (c *Controller) owner(m ModelID) bool {
	r := c.rep(m)
	return r != nil && r.dep.Residency.Reserves() && !r.removed
}

// outranks reports whether demand for m may drain the busy engine x: a
// higher priority, a reserved owner taking its share back from an
// onDemand borrower, or (at now; zero: not asked) a model of x's class
// whose turn is due (turns.go).
func (c *Controller) outranks(m ModelID, x *replica, now time.Time) bool {
	r := c.rep(m)
	if r == nil {
		return false
	}
	if r.dep.Priority > x.dep.Priority {
		return true
	}
	if r.dep.Residency.Reserves() && x.dep.Residency == OnDemand {
		return true
	}
	// A protected model outranks a best-effort one (besteffort.go).
	if c.beOutranks(r, x) {
		return true
	}
	// A lower-class turn takes memory as a higher class would (lowturn.go).
	if c.lowHolds(r) && x.dep.Residency != Pinned {
		return true
	}
	return !now.IsZero() && c.slotDue(r, x, now)
}

func gib(b int64) string {
	const gi, mi = 1 << 30, 1 << 20
	if b >= gi || b <= -gi {
		return fmt.Sprintf("%.1fGi", float64(b)/gi)
	}
	return fmt.Sprintf("%.0fMi", float64(b)/mi)
}
