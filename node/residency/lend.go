package residency

import "time"

// Memory across classes: when demand of one class may take memory that a
// model of another class holds (DESIGN.md, "Across classes").

// drainDeadline is how long r's requests may run once r is drained for
// forM. Interactive demand does not wait behind background work (SPEC
// §8.4): a background engine whose memory an interactive model needs is cut
// off at once, its requests ending with an error the gateway returns or
// re-queues. Any other drain lets requests finish for up to DrainDeadline.
func (c *Controller) drainDeadline(r *replica, forM ModelID) time.Duration {
	if b := c.rep(forM); b != nil && b.dep.Priority == Interactive && r.dep.Priority == Background {
		return 0
	}
	return c.cfg.DrainDeadline
}

// turn is how long lower-class demand b expects to hold memory it is given:
// the time to bring it in plus the minimum residency the controller grants
// a model it brings in.
func (c *Controller) turn(b *replica) time.Duration { return c.reload(b) + c.cfg.MinResidency }

// mayDisplace reports whether b, of a lower class than x, may take the
// memory x holds, where the action would leave x reload away from serving.
// A request of b is here and x's are only expected, but x's count more, so
// b may take it only when the expected cost to x is no more than what b
// expects to gain:
//
//	w(x) · p · reload · (1 + λx · reload)  ≤  w(b) · (1 − p) · turn(b)
//
// p is the chance that x is asked for within b's turn, given how long x has
// been idle (its idle-gap histogram, gaps.go); the left side is the
// class-weighted request-seconds x's requests then wait (the first, and
// those arriving meanwhile), the right side the class-weighted seconds of
// card time b gets before x is back. A model of a busy service is rarely
// taken; the same model in one of its quiet spells is.
func (c *Controller) mayDisplace(b, x *replica, reload time.Duration, now time.Time) bool {
	t := c.turn(b)
	p := x.fc.backWithin(now, t, x.rate)
	rl := reload.Seconds()
	cost := x.dep.Priority.weight() * p * rl * (1 + x.rate/60*rl)
	gain := b.dep.Priority.weight() * (1 - p) * t.Seconds()
	return cost <= gain
}

// protectIfReturning runs when r is loaded or woken for a request. If a
// lower class's demand displaced r within ThrashWindow and r has not come
// back since, r is returning: mayDisplace guessed that r would stay quiet
// and it did not, and r's requests paid the reload. When r has returned
// ThrashCount times within the window after displacements by the same
// lower-class model b, the controller protects r from b for SerializeFor:
// b no longer takes r's memory (victims), whatever the guess says. This is
// the interference matrix's remedy for a pair where background work breaks
// an interactive target by swapping it out (give the interactive model its
// memory), applied where it is observed. A recorded decision, no engine
// operation.
func (c *Controller) protectIfReturning(r *replica, now time.Time) {
	var by *replica
	var at time.Time
	for i := len(c.evictions) - 1; i >= 0; i-- {
		e := c.evictions[i]
		if e.victim != r.dep.Model || now.Sub(e.at) > c.cfg.ThrashWindow {
			continue
		}
		if b := c.rep(e.by); b != nil && b.dep.Priority < r.dep.Priority {
			by, at = b, e.at
		}
		break
	}
	if by == nil {
		return
	}
	n := 1
	for _, e := range c.returns {
		if e.victim != r.dep.Model || now.Sub(e.at) > c.cfg.ThrashWindow {
			continue
		}
		if !e.at.Before(at) {
			// r already came back since that displacement.
			return
		}
		if e.by == by.dep.Model {
			n++
		}
	}
	c.stepReturns = append(c.stepReturns, eviction{victim: r.dep.Model, by: by.dep.Model, at: now})
	key := eviction{victim: r.dep.Model, by: by.dep.Model}
	if _, ok := c.protected[key]; ok || n < c.cfg.ThrashCount {
		return
	}
	c.emit(ActProtect, r, by.dep.Model, TriggerPressure, by.dep.Model, Inputs{Reload: c.reload(r)}, now,
		"protect %s from %s: %s's demand displaced %s and %s was asked for again %d times in %v (reload %v each); %s %s no longer takes %s %s's memory for %v",
		r.dep.Model, by.dep.Model, by.dep.Model, r.dep.Model, r.dep.Model, n, c.cfg.ThrashWindow, c.reload(r).Round(time.Millisecond),
		by.dep.Priority, by.dep.Model, r.dep.Priority, r.dep.Model, c.cfg.SerializeFor)
}

// isProtected reports whether x is protected from b's demand (see
// protectIfReturning).
func (c *Controller) isProtected(x, b *replica) bool {
	if len(c.protected) == 0 {
		return false
	}
	_, ok := c.protected[eviction{victim: x.dep.Model, by: b.dep.Model}]
	return ok
}
