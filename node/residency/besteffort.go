package residency

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// Best effort: when the card cannot hold every model that has demand, the
// controller chooses the largest set it can hold at once — the protected
// set — and protects it (docs/residency.md, "Best effort").
//
// The set: pinned and warm models first (their promises are kept), then
// the models with demand (a decayed arrival rate, or requests waiting) by
// class, then by value per GiB (class weight × arrival rate per GiB of
// footprint): each joins while the set's footprints, plus the largest
// load peak over a footprint among them, fit the usable memory. The
// others are best-effort:
//
//   - demand of a best-effort model never takes the memory of a
//     protected model in use (requests active, or asked for at least
//     beBusyRate): it runs in what the protected set leaves free, in
//     quiet protected models' memory, and in other best-effort models';
//   - a best-effort model whose requests waited beWait gets a bounded
//     turn as a lower class does (lowturn.go): at most beShare of the
//     card's time per model (a best-effort model of a class below another
//     on the card takes a lower class's wait and share), so that a
//     protected model keeps its SLO and the best-effort model is not
//     starved;
//   - a protected model's request outranks a best-effort model of its
//     class, as a higher class does;
//   - protected onDemand models are brought onto the card and kept there
//     (no idle demotion) while the set is in force.
//
// The set follows demand with hysteresis: it is chosen again at most every
// beEvery, and a new set replaces the old only when it holds more models,
// or as many with beGain more value, or when the old no longer fits. An
// operator may pin the set (ProtectModels); it then changes only when the
// operator says.

const (
	// beEvery is how often the protected set is chosen again.
	beEvery = time.Minute
	// beGain is how much more value per GiB a set of as many models needs
	// to replace the one in force.
	beGain = 1.25
	// beBusyRate is the arrival rate (per minute) from which a protected
	// model's memory is kept from best-effort demand.
	beBusyRate = 1.0
	// beWait is how long a best-effort model's requests wait before its
	// turn is due; beShare the most of the card's time its turns take.
	beWait  = 5 * time.Minute
	beShare = 0.05
	// A best-effort model that answers under beShort of its offered
	// requests (decayed over beDoneHalfLife, from beDoneMin offered) is
	// short: its turn is due after beShortWait and takes up to
	// beShortShare of the card's time, whatever its class, until it
	// answers more; one that answers over beAmple takes beAmpleShare.
	// Whatever its share, a best-effort model not of a lower class
	// (lowerClass) gets its turn at most beLongWait after it was due (a
	// client that sends one request at a time offers few, and answers
	// most of them, while it waits), as long as its turns take at most
	// beLongShare of the card's time.
	beShort        = 0.15
	beShortWait    = time.Minute
	beShortShare   = 0.15
	beAmple        = 0.5
	beAmpleShare   = 0.03
	beDoneHalfLife = 30 * time.Minute
	beDoneMin      = 1.0
	beLongWait     = 20 * time.Minute
	beLongShare    = 0.10
)

// doneCount is a decayed count of a model's requests offered and
// answered (half-life beDoneHalfLife).
type doneCount struct {
	offered, answered float64
	at                time.Time
}

func (d *doneCount) add(now time.Time, offered, answered float64) {
	if !d.at.IsZero() && now.After(d.at) {
		f := math.Exp2(-now.Sub(d.at).Seconds() / beDoneHalfLife.Seconds())
		d.offered *= f
		d.answered *= f
	}
	d.at = maxTime(d.at, now)
	d.offered += offered
	d.answered += answered
}

// beDone is the share of r's offered requests it answered (decayed), and
// whether enough were offered to judge.
func (r *replica) beDone() (float64, bool) {
	if r.done.offered < beDoneMin {
		return 1, false
	}
	return r.done.answered / r.done.offered, true
}

// short reports whether r is best-effort and answers under beShort of
// its requests: its turns come sooner, longer and more often.
func (c *Controller) short(r *replica) bool {
	f, ok := r.beDone()
	return ok && f < beShort && c.bestEffort(r)
}

// turnWait, turnShare: a bounded turn's wait and share for r, a lower
// class's or a best-effort model's.
// A best-effort model of a class below a model on the card takes the
// lower class's (it would wait for one anyway).
// A short best-effort model (short) takes beShortWait and beShortShare
// whatever its class; an ample one beAmpleShare.
func (c *Controller) turnWait(r *replica) time.Duration {
	switch {
	case c.short(r):
		return beShortWait
	case c.bestEffort(r) && !c.lowerClass(r):
		return beWait
	}
	return lowerWait
}

func (c *Controller) turnShare(r *replica) float64 {
	if c.short(r) {
		return beShortShare
	}
	if f, ok := r.beDone(); ok && f > beAmple && c.bestEffort(r) {
		return min(beAmpleShare, lowerShare)
	}
	if c.bestEffort(r) && !c.lowerClass(r) {
		return beShare
	}
	return lowerShare
}

// lowerClass reports whether a model of a higher class than x is on the
// card.
func (c *Controller) lowerClass(x *replica) bool {
	for i := range c.reps {
		if y := &c.reps[i]; !y.removed && y.dep.Priority > x.dep.Priority {
			return true
		}
	}
	return false
}

// turnKind names r's turn in decisions: its class, or best-effort.
func (c *Controller) turnKind(r *replica) string {
	if c.bestEffort(r) {
		return "best-effort"
	}
	return r.dep.Priority.String()
}

// beState is the protected set in force; Plan saves and restores it.
type beState struct {
	on        bool
	at        time.Time
	protected map[ModelID]bool
	// why says, per best-effort model, why in numbers.
	why map[ModelID]string
	// pinned: the operator chose the set (ProtectModels).
	pinned []ModelID
	by     string
	// byOperator: the set in force is the operator's choice.
	byOperator bool
}

// ProtectModels is the operator's choice of the protected set: those
// models are protected and every other model with demand is best-effort,
// until ProtectModels with no models gives the choice back to the
// controller. Reserved (pinned, warm) models are always protected.
type ProtectModels struct {
	Models []ModelID
	By     string
}

func (ProtectModels) isEvent() {}

// BestEffortEntry says why a model is best-effort, in numbers.
type BestEffortEntry struct {
	Model ModelID
	// Need is what the model needs on the card (its footprint, or its
	// load peak when larger); Lend what the protected set leaves free.
	Need, Lend int64
	// Rate is its decayed arrival rate, per minute; Value its value per
	// GiB, the order it lost on.
	Rate, Value float64
	Reason      string
	// Pinned: the operator chose the set.
	Pinned bool
}

// BestEffort returns the best-effort models with why, in numbers; empty
// while the card holds every model with demand.
func (c *Controller) BestEffort() []BestEffortEntry {
	if !c.be.on {
		return nil
	}
	var out []BestEffortEntry
	lend := c.beLend()
	for i := range c.reps {
		r := &c.reps[i]
		if r.removed || c.protects(r) || c.be.why[r.dep.Model] == "" {
			continue
		}
		out = append(out, BestEffortEntry{Model: r.dep.Model, Need: max(c.footprint(r), c.peak(r)), Lend: lend,
			Rate: r.rate, Value: c.beValue(r), Reason: c.be.why[r.dep.Model], Pinned: len(c.be.pinned) > 0})
	}
	slices.SortFunc(out, func(a, b BestEffortEntry) int { return cmp.Compare(a.Model, b.Model) })
	return out
}

// Protected reports whether m is in the protected set in force (every
// model is while the card holds them all).
func (c *Controller) Protected(m ModelID) bool {
	r := c.rep(m)
	return !c.be.on || c.be.protected[m] || r != nil && c.protects(r)
}

// protects reports whether r is in the protected set in force: chosen,
// or reserved (a pinned or warm promise is kept whatever the set, also
// for a model that became warm since the set was chosen).
func (c *Controller) protects(r *replica) bool {
	return c.be.protected[r.dep.Model] || r.dep.Residency.Reserves()
}

// bestEffort reports whether r is best-effort now.
func (c *Controller) bestEffort(r *replica) bool {
	return c.be.on && !c.protects(r) && !r.removed
}

// keeps reports whether r is a protected onDemand model with demand that
// the controller keeps on the card while the set is in force.
func (c *Controller) keeps(r *replica) bool {
	return c.be.on && c.protects(r) && !r.removed && r.dep.Residency == OnDemand && !c.pinnedOnly
}

// holdsAll reports whether r stays on the card when idle because the card
// holds every model with demand (the protected set is every model): with
// the best-effort policy on, sleeping or unloading an idle model on the
// card's idle timeouts frees memory nobody needs and costs its next
// request a wake or a load. A deployment's own spec.idle and a request's
// keep_alive still apply (the user asked for them).
func (c *Controller) holdsAll(r *replica) bool {
	return c.cfg.BestEffort && !c.be.on && !c.pinnedOnly && !r.removed && c.beDemand(r) &&
		!r.keepSet && r.dep.IdleSleep == 0 && r.dep.IdleUnload == 0
}

// shields reports whether b's demand may not take x's memory: b is
// best-effort (and not in its bounded turn) and x protected and in use
// (requests active, or asked for at least beBusyRate): a quiet protected
// model lends its memory as any model does, and pays a reload when next
// asked.
func (c *Controller) shields(b, x *replica) bool {
	return c.be.on && c.bestEffort(b) && !c.lowHolds(b) && c.protects(x) && (x.active > 0 || x.rate >= beBusyRate)
}

// beOutranks reports whether r, protected, outranks x, best-effort.
func (c *Controller) beOutranks(r, x *replica) bool {
	return c.be.on && c.protects(r) && c.bestEffort(x) && !x.dep.Residency.Reserves()
}

// beValue is r's value per GiB for the choice: class weight × rate per
// minute per GiB of footprint.
func (c *Controller) beValue(r *replica) float64 {
	f := max(c.footprint(r), 1)
	return priorityWeight(r.dep.Priority) * r.rate / (float64(f) / (1 << 30))
}

// beDemand reports whether r counts in the choice: reserved, or with a
// rate or requests waiting.
func (c *Controller) beDemand(r *replica) bool {
	return !r.removed && (r.dep.Residency.Reserves() || r.active > 0 || r.rate > 0.01)
}

// beFits reports whether the models fit the card together: their
// footprints and the largest peak over a footprint among them.
func (c *Controller) beFits(set []*replica) bool {
	var sum, extra int64
	for _, r := range set {
		f := c.footprint(r)
		sum += f
		extra = max(extra, c.peak(r)-f)
	}
	return sum+extra <= c.usable
}

// protectFits refuses an operator's choice the card cannot hold: the
// models named and the reserved ones, with the largest load peak among
// them, must fit the usable memory, or the choice protects nothing.
func (c *Controller) protectFits(models []ModelID) error {
	var set []*replica
	var names []string
	for i := range c.reps {
		r := &c.reps[i]
		if !r.removed && (r.dep.Residency.Reserves() || slices.Contains(models, r.dep.Model)) {
			set = append(set, r)
			names = append(names, fmt.Sprintf("%s (%s, %s)", r.dep.Model, r.dep.Residency, gib(c.footprint(r))))
		}
	}
	if c.beFits(set) {
		return nil
	}
	var sum, extra int64
	for _, r := range set {
		sum += c.footprint(r)
		extra = max(extra, c.peak(r)-c.footprint(r))
	}
	return fmt.Errorf("protect: card %s cannot hold %s together: they need %s (with the largest load peak), the card holds %s; pinned and warm models are always protected",
		c.cfg.Card, strings.Join(names, ", "), gib(sum+extra), gib(c.usable))
}

// beLend is what the protected set leaves free.
func (c *Controller) beLend() int64 {
	var sum, extra int64
	for i := range c.reps {
		r := &c.reps[i]
		if !r.removed && c.protects(r) {
			f := c.footprint(r)
			sum += f
			extra = max(extra, c.peak(r)-f)
		}
	}
	return max(c.usable-sum-extra, 0)
}

// chooseProtected runs first in a step: it chooses the protected set
// again when beEvery has passed (or never was), and records a decision
// when it changes.
func (c *Controller) chooseProtected(now time.Time) {
	if !c.cfg.BestEffort || !c.be.at.IsZero() && now.Sub(c.be.at) < beEvery {
		return
	}
	c.be.at = now
	var all, want []*replica
	for i := range c.reps {
		r := &c.reps[i]
		if r.removed {
			continue
		}
		all = append(all, r)
		if c.beDemand(r) {
			want = append(want, r)
		}
	}
	if len(c.be.pinned) > 0 {
		set := map[ModelID]bool{}
		for _, r := range all {
			if r.dep.Residency.Reserves() || slices.Contains(c.be.pinned, r.dep.Model) {
				set[r.dep.Model] = true
			}
		}
		c.beSet(set, true, now, fmt.Sprintf("the operator's choice (%s)", c.be.by))
		return
	}
	if c.beFits(want) {
		if c.be.on {
			c.beSet(nil, false, now, "")
		}
		return
	}
	order := slices.Clone(want)
	slices.SortStableFunc(order, func(x, y *replica) int {
		return cmp.Or(-cmp.Compare(b2i(x.dep.Residency.Reserves()), b2i(y.dep.Residency.Reserves())),
			-cmp.Compare(x.dep.Priority, y.dep.Priority), cmp.Compare(x.dep.Residency, y.dep.Residency),
			-cmp.Compare(c.beValue(x), c.beValue(y)), cmp.Compare(x.dep.Model, y.dep.Model))
	})
	var chosen []*replica
	for _, r := range order {
		if c.beFits(append(chosen, r)) || r.dep.Residency.Reserves() {
			chosen = append(chosen, r)
		}
	}
	set := map[ModelID]bool{}
	var value float64
	for _, r := range chosen {
		set[r.dep.Model] = true
		value += c.beValue(r)
	}
	// An operator's choice given back is replaced at once (its reasons
	// name the operator); the controller's own only with hysteresis.
	if c.be.on && !c.be.byOperator && !c.beReplaces(set, value) {
		return
	}
	c.beSet(set, true, now, "")
}

// beReplaces reports whether a new set (with its value) should replace
// the one in force: the old no longer fits, or the new holds more models,
// or as many with beGain more value.
func (c *Controller) beReplaces(set map[ModelID]bool, value float64) bool {
	var old []*replica
	var oldValue float64
	for i := range c.reps {
		r := &c.reps[i]
		if !r.removed && c.protects(r) {
			old = append(old, r)
			oldValue += c.beValue(r)
		}
	}
	switch {
	case !c.beFits(old):
		return true
	case len(set) != len(old):
		return len(set) > len(old)
	}
	return value > beGain*oldValue
}

// beSet puts a protected set in force and records why each other model
// is best-effort.
func (c *Controller) beSet(set map[ModelID]bool, on bool, now time.Time, pinned string) {
	was, wasWhy := c.be.protected, c.be.why
	c.be.on, c.be.protected = on, set
	c.be.why = map[ModelID]string{}
	defer c.emitChanged(wasWhy, c.be.byOperator, pinned != "", now)
	if !on {
		if was != nil {
			c.emitBestEffort(now, "the card holds every model with demand again: none is best-effort")
		}
		return
	}
	lend := c.beLend()
	var names []string
	for i := range c.reps {
		r := &c.reps[i]
		if r.removed || set[r.dep.Model] || !c.beDemand(r) {
			continue
		}
		need := max(c.footprint(r), c.peak(r))
		how := fmt.Sprintf("%s, %.2f req/min, value %.2f per GiB: did not fit after the models before it (reserved, then by class, then value per GiB)",
			r.dep.Priority, r.rate, c.beValue(r))
		if pinned != "" {
			how = "not in " + pinned
		}
		c.be.why[r.dep.Model] = fmt.Sprintf("%s: needs %s; with the protected set on the card it can lend %s; %s → best-effort",
			r.dep.Model, gib(need), gib(lend), how)
		names = append(names, string(r.dep.Model))
	}
	if !sameSet(was, set) {
		var kept []string
		for m := range set {
			kept = append(kept, string(m))
		}
		slices.Sort(kept)
		c.emitBestEffort(now, fmt.Sprintf("the card cannot hold every model with demand: protects %s; best-effort %s (bounded turns of at most %.0f%% of the card's time each)",
			strings.Join(kept, ", "), strings.Join(names, ", "), beShare*100))
	}
}

// emitChanged records, per model, a decision when it became best-effort
// (its why, in numbers) or was protected again, so that `residency
// decisions --model` shows each model's standing; the operator's choice
// has the operator trigger, the controller's the pressure one.
func (c *Controller) emitChanged(was map[ModelID]string, wasPinned, pinned bool, now time.Time) {
	c.be.byOperator = pinned
	trig := TriggerPressure
	if pinned {
		trig = TriggerOperator
	}
	for i := range c.reps {
		r := &c.reps[i]
		m := r.dep.Model
		var reason string
		switch why, before := c.be.why[m], was[m]; {
		case why != "" && (before == "" || wasPinned != pinned):
			reason = "best-effort: " + why
		case why == "" && before != "" && !r.removed:
			reason = fmt.Sprintf("best-effort: %s is protected again (%s)", m, c.protectedWhy())
		default:
			continue
		}
		d := Decision{Time: now, Card: c.cfg.Card, Action: ActBestEffort, Model: m, Trigger: trig, Reason: reason,
			Advised: c.cfg.Mode == Advise}
		if pinned {
			d.By = c.be.by
		}
		c.out = append(c.out, Action{Kind: ActBestEffort, Model: m, Decision: d})
	}
}

// protectedWhy says why a model left best-effort: the set in force.
func (c *Controller) protectedWhy() string {
	switch {
	case !c.be.on:
		return "the card holds every model with demand"
	case len(c.be.pinned) > 0:
		return "the operator's choice (" + c.be.by + ")"
	}
	return "it is in the largest set the card holds at once"
}

// emitBestEffort records a best-effort decision (no engine operation).
func (c *Controller) emitBestEffort(now time.Time, reason string) {
	trig, by := TriggerPressure, ""
	if len(c.be.pinned) > 0 {
		trig, by = TriggerOperator, c.be.by
	}
	d := Decision{Time: now, Card: c.cfg.Card, Action: ActBestEffort, Trigger: trig, Reason: "best-effort: " + reason,
		Advised: c.cfg.Mode == Advise, By: by}
	c.out = append(c.out, Action{Kind: ActBestEffort, Decision: d})
}

func sameSet(a, b map[ModelID]bool) bool {
	if len(a) != len(b) {
		return false
	}
	for k := range a {
		if !b[k] {
			return false
		}
	}
	return true
}
