package residency

import "time"

// Turns: no model with waiting requests is kept off the card for ever by
// a model of its own class (docs/residency.md, "No starvation").
//
// Two loops starve a model without this:
//
//   - A warm owner lends its share to an onDemand borrower by going to
//     sleep, and a request for the owner takes it back before the
//     borrower's load finishes (or starts): the load is cut short, the
//     owner is protected as newly resident, the borrower's requests expire
//     at the gateway, and the next lend ends the same way (issue 32: a
//     coder served 20 of 8,819 requests beside a busy warm chat). An
//     owner's return may cut a borrower's turn short once per
//     ThrashWindow; after that the owner yields: its requests wait (its
//     share stays lent) until the borrower's load finished and it kept
//     the card for its turn, or until the owner fits beside it.
//   - An onDemand model that never goes idle keeps an equal-class model
//     that does not fit beside it waiting: busy engines are drained only
//     for a higher class. A model that has waited starveAfter for the
//     card may drain an equal-class onDemand model that has had its
//     protection (the minimum residency, at least twice its load time,
//     or its time slot once the pair is serialized); the pair is
//     serialized from then on, so each keeps the card for a slot per
//     turn. A busy warm model is not drained for a turn (its promise is
//     to be served); its share is lent in its idle spells, and the first
//     rule keeps that lend from being cut short twice.
//
// A lower class waits while a higher class's demand holds the card (I3)
// and takes memory in the quiet spells mayDisplace finds, or in a bounded
// turn once it has waited long (lowturn.go).

// starveAfter is how long a model waits for the card before it may take
// an equal-class model's turn: the minimum residency.
func (c *Controller) starveAfter() time.Duration { return c.cfg.MinResidency }

// turnSlot is how long a borrower keeps the card once loaded before a
// yielding owner takes its share back.
func (c *Controller) turnSlot(b *replica) time.Duration { return max(c.cfg.MinResidency, c.slot(b)) }

// cut records that an owner's return cut a borrower's turn short.
type cut struct {
	model ModelID
	at    time.Time
}

// turns runs first in a step: it keeps each model's waiting time, and
// decides for every warm owner asked for while its share is lent to a
// borrower whether it takes it back now or yields.
func (c *Controller) turns(now time.Time) {
	for i := range c.reps {
		r := &c.reps[i]
		r.slotBy = time.Time{}
		if r.state == Resident || r.state == Draining || r.active == 0 {
			// The wait is over: a later one may yield to a turn again.
			r.lowYielded = lowTurn{}
		}
		switch {
		case r.state == Resident || r.state == Draining:
			r.waitSince = time.Time{}
		case r.active > 0:
			// Demand after a long quiet spell starts a new wait; requests
			// the gateway rejected after its cold wait do not end one.
			if r.waitSince.IsZero() || now.Sub(r.demandAt) > 2*c.cfg.MinResidency {
				r.waitSince = now
			}
			r.demandAt = now
		}
	}
	c.lowTurns(now)
	for i := range c.reps {
		c.yieldTurn(&c.reps[i], now)
	}
	for i := range c.reps {
		r := &c.reps[i]
		if r.yielding {
			r.slotBy = r.yieldCap
		} else if r.active > 0 && r.state != Resident && !r.waitSince.IsZero() {
			if b := c.waitBound(r, now); b > 0 {
				r.slotBy = r.waitSince.Add(b)
			} else if c.outrankedOnCard(r) {
				r.slotBy = c.lowBound(r, now)
			}
		}
	}
	c.lowYield(now)
}

// inTurn reports whether borrower x is in a turn an owner may not cut
// short: its load or wake was cut short by an owner's return within
// ThrashWindow, and it is loading or waking again, or resident for less
// than its slot. until is when that turn ends at the latest.
func (c *Controller) inTurn(x *replica, now time.Time) (until time.Time, ok bool) {
	at, cut := c.cuts[x.dep.Model]
	if !cut || now.Sub(at) > c.cfg.ThrashWindow || x.dep.Residency != OnDemand || x.removed || x.pending != 0 {
		return time.Time{}, false
	}
	switch x.state {
	case Loading, Waking:
		return x.opStart.Add(c.reload(x) + c.turnSlot(x)), true
	case Resident:
		until = x.resident.Add(c.turnSlot(x))
		return until, now.Before(until)
	}
	return time.Time{}, false
}

// yieldTurn decides for a warm owner r asked for while its share is lent
// whether it takes it back now or yields to a borrower's turn.
func (c *Controller) yieldTurn(r *replica, now time.Time) {
	was := r.yielding
	r.yielding = false
	if was {
		c.sumsOK = false
	}
	// An owner whose share is not lent (cold, and never lent: an onDemand
	// model that just became warm) has nothing to yield: it takes its
	// share now.
	notLent := (r.state == Cold || r.state == Failed) && !r.wasLent
	if r.dep.Residency != Warm || r.removed || c.pinnedOnly || r.active == 0 || r.pending != 0 || notLent ||
		r.state != Sleeping && r.state != Cold && r.state != Failed {
		if r.state == Resident || r.state == Loading || r.state == Waking || r.removed {
			r.lentTo, r.yieldCap = "", time.Time{}
		}
		if was {
			c.sumsOK = false
		}
		return
	}
	// The borrower the owner went to sleep for, still waiting to come in,
	// counts as in: the owner fits only beside it too.
	var extra int64
	b := c.rep(r.lentTo)
	waiting := b != nil && !b.removed && b.active > 0 && (b.state == Cold || b.state == Sleeping)
	if b != nil && (b.dep.Priority < r.dep.Priority || c.bestEffort(b)) {
		// A lower class, or a best-effort model (the owner is protected),
		// gets no turn an owner waits for: its work takes memory only in
		// the owner's quiet spells.
		r.lentTo = ""
		waiting = false
	}
	if waiting {
		_, _, extra = c.target(b)
	}
	if _, committed := c.others(r); committed+extra+max(r.dep.Share, c.footprint(r)) <= c.usable {
		r.lentTo = ""
		return
	}
	// Borrowers in a turn the owner may not cut short.
	var until time.Time
	var peer *replica
	for i := range c.reps {
		x := &c.reps[i]
		if x.dep.Priority < r.dep.Priority || c.bestEffort(x) {
			continue
		}
		if u, ok := c.inTurn(x, now); ok && u.After(until) {
			until, peer = u, x
		}
	}
	// The borrower the owner went to sleep for, not yet in: the owner's
	// return cuts its turn short once per window.
	if waiting {
		if at, ok := c.cuts[b.dep.Model]; ok && now.Sub(at) <= c.cfg.ThrashWindow {
			if u := now.Add(c.reload(b) + c.turnSlot(b)); u.After(until) {
				until, peer = u, b
			}
		} else if !was {
			c.stepCuts = append(c.stepCuts, cut{model: b.dep.Model, at: now})
			r.lentTo = ""
		}
	} else {
		r.lentTo = ""
	}
	// One turn per wait: an owner that yielded to a lower-class or
	// best-effort turn in this wait (lowturn.go) waits for no borrower's.
	if peer == nil || r.lowYielded.model != "" {
		if was {
			c.sumsOK = false
		}
		return
	}
	if !was {
		// One cap per wait: the owner yields once, however many turns
		// follow.
		if r.yieldCap.IsZero() {
			r.yieldCap = until.Add(c.cfg.DrainDeadline + c.reload(peer))
		}
		if !now.Before(r.yieldCap) {
			return
		}
		c.emit(ActSerialize, r, peer.dep.Model, TriggerPressure, peer.dep.Model, Inputs{}, now,
			"serialize %s and %s: an owner's return cut %s's turn short %v ago (once per %v); %s's %d requests wait for %s's turn (to come in, then %v on the card) or until %s fits beside it; back by %s at the latest",
			r.dep.Model, peer.dep.Model, peer.dep.Model, now.Sub(c.cuts[peer.dep.Model]).Round(time.Second), c.cfg.ThrashWindow,
			r.dep.Model, r.active, peer.dep.Model, c.turnSlot(peer), r.dep.Model, r.yieldCap.Format(time.TimeOnly))
	}
	r.yieldUntil = minTime(until, r.yieldCap)
	if now.Before(r.yieldUntil) {
		r.yielding = true
		r.yieldTo, r.yieldEnd = peer.dep.Model, r.yieldUntil
	}
	c.sumsOK = false
}

// slotDue reports whether b, waiting for the card, may take its turn from
// x, an equal-class model that has had its protection.
func (c *Controller) slotDue(b, x *replica, now time.Time) bool {
	return b.dep.Priority == x.dep.Priority && x.dep.Residency == OnDemand && !b.waitSince.IsZero() &&
		now.Sub(b.waitSince) >= c.starveAfter() && x.state == Resident && now.Sub(x.resident) >= c.protection(x, b) &&
		!c.burstHolds(x, b, now)
}

// serializeForTurn records that b takes its turn from x, once per pair
// while they are serialized.
func (c *Controller) serializeForTurn(b, x *replica, now time.Time) {
	if _, ok := c.serialized[pairOf(b.dep.Model, x.dep.Model)]; ok {
		return
	}
	for _, a := range c.out {
		if a.Kind == ActSerialize && pairOf(a.Model, a.Peer) == pairOf(b.dep.Model, x.dep.Model) {
			return
		}
	}
	c.emit(ActSerialize, b, x.dep.Model, TriggerPressure, x.dep.Model, Inputs{}, now,
		"serialize %s and %s: %s waited %v for the card while %s (%s too) kept it; each keeps the card at least %v per turn",
		b.dep.Model, x.dep.Model, b.dep.Model, now.Sub(b.waitSince).Round(time.Second), x.dep.Model, x.dep.Priority,
		max(c.protection(x, b), c.turnSlot(b)))
}

// waitBound is how long r, waiting for the card, waits at most for its
// turn when nothing of a higher class needs the card: starveAfter, then
// the longest protection an equal-class model on the card has left, its
// drain and its stop (bounded by stopAllowance), and r's own reload
// twice (a first estimate may be short, and loads share the copy
// bandwidth). Lower classes have none (zero).
func (c *Controller) waitBound(r *replica, now time.Time) time.Duration {
	var prot time.Duration
	for i := range c.reps {
		x := &c.reps[i]
		if x == r || x.removed || x.dep.Priority < r.dep.Priority {
			continue
		}
		if x.dep.Priority > r.dep.Priority {
			if x.active > 0 {
				return 0
			}
			continue
		}
		if x.state == Resident {
			prot = max(prot, c.protection(x, r)-now.Sub(x.resident), c.burstHoldLeft(x, now))
		}
	}
	return c.starveAfter() + prot + c.cfg.DrainDeadline + stopAllowance + 2*c.reload(r)
}

// stopAllowance is what waitBound allows for an engine's sleep or stop.
const stopAllowance = 10 * time.Second

// cutWithin reports whether x's load or wake was cut short within
// ThrashWindow.
func (c *Controller) cutWithin(x *replica, now time.Time) bool {
	at, ok := c.cuts[x.dep.Model]
	for _, k := range c.stepCuts {
		if k.model == x.dep.Model {
			at, ok = k.at, true
		}
	}
	return ok && now.Sub(at) <= c.cfg.ThrashWindow
}

func (c *Controller) recordCuts(now time.Time) {
	for _, k := range c.stepCuts {
		c.cuts[k.model] = k.at
	}
	for k, at := range c.cuts {
		if now.Sub(at) > c.cfg.ThrashWindow {
			delete(c.cuts, k)
		}
	}
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
