package residency

import (
	"math"
	"time"
)

// Memory across classes: when demand of one class may take memory that a
// model of another class holds (DESIGN.md, "Across classes").

// drainDeadline is how long r's requests may run once r is drained for
// forM. Interactive and standard demand does not wait behind background
// work (docs/gateway.md): a background engine whose memory they need is cut
// off at once, its requests ending with an error the gateway returns or
// re-queues. Any other drain lets requests finish for up to DrainDeadline.
// priorityOf names m's class for a reason ("interactive").
func (c *Controller) priorityOf(m ModelID) string {
	if b := c.rep(m); b != nil {
		return b.dep.Priority.String()
	}
	return "higher-class"
}

func (c *Controller) drainDeadline(r *replica, forM ModelID) time.Duration {
	if b := c.rep(forM); b != nil && b.dep.Priority > Background && r.dep.Priority == Background {
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
// taken; the same model in one of its quiet spells is. Sending a sleeping
// x cold (evicting its residual) costs its next request the load beyond
// its wake whenever that request comes before x would be unloaded for
// idleness anyway, so there the cost is also counted with q, the chance
// that x is asked for before then:
//
//	cost ≥ w(x) · q · (load − wake) · (1 + λx · (load − wake))
func (c *Controller) mayDisplace(b, x *replica, reload time.Duration, now time.Time) bool {
	t := c.turn(b)
	p := x.fc.backWithin(now, t, x.rate)
	rl := reload.Seconds()
	cost := priorityWeight(x.dep.Priority) * p * rl * (1 + x.rate/60*rl)
	if x.state == Sleeping {
		// Sending a sleeping x cold costs it a load instead of a wake at
		// its next request, whenever that comes before x would be
		// unloaded anyway, not only within b's turn.
		if left := c.unloadAfter(x) - now.Sub(x.since); left > t {
			q := x.fc.backWithin(now, left, x.rate)
			extra := (reload - c.wakeTime(x)).Seconds()
			cost = max(cost, priorityWeight(x.dep.Priority)*q*extra*(1+x.rate/60*extra))
		}
	}
	gain := priorityWeight(b.dep.Priority) * (1 - p) * t.Seconds()
	// b's own loss: when x is back within the turn, b is cut short and
	// its reload and the work in flight are wasted.
	loss := priorityWeight(b.dep.Priority) * p * (c.reload(b).Seconds() + t.Seconds())
	return cost+loss <= gain
}

// protectKey names a model protected from a lower-class peer's demand.
type protectKey struct{ victim, by ModelID }

// protection is the keep-alive a protected model gets from its peer: the
// peer takes its memory only after it has been idle that long, until then.
type protection struct {
	idle  time.Duration
	until time.Time
}

// protectIfReturning runs when r is cold-loaded for a request. If a lower
// class's demand displaced r within ThrashWindow and r has not come back
// since, r is returning: mayDisplace guessed that r would stay quiet and
// it did not, and r's requests paid a cold load. When r has returned
// ThrashCount times within the window after displacements by the same
// lower-class model b, the controller raises r's keep-alive against b for
// SerializeFor: b no longer sends r cold (evicts it, or the residual of
// its sleep) until r has been idle twice the longest idle spell r came
// back after, whatever the guess says; b may still put r to sleep, which costs
// r a wake, not a load. This is the interference matrix's remedy for a
// pair where background work breaks an interactive target by forcing its
// reloads (raise the keep-alive, stop evicting the interactive model for
// background), applied where it is observed, and b still runs in r's
// memory when r sleeps and in r's longer quiet spells. A recorded
// decision, no engine operation; a later return after a longer spell
// raises it again.
func (c *Controller) protectIfReturning(r *replica, now time.Time) {
	var disp eviction
	var by *replica
	for i := len(c.evictions) - 1; i >= 0; i-- {
		e := c.evictions[i]
		if e.victim != r.dep.Model || now.Sub(e.at) > c.cfg.ThrashWindow {
			continue
		}
		if b := c.rep(e.by); b != nil && b.dep.Priority < r.dep.Priority {
			disp, by = e, b
		}
		break
	}
	if by == nil {
		return
	}
	gap := now.Sub(disp.at) + disp.gap
	n, longest := 1, gap
	for _, e := range c.returns {
		if e.victim != r.dep.Model || now.Sub(e.at) > c.cfg.ThrashWindow {
			continue
		}
		if !e.at.Before(disp.at) {
			// r already came back since that displacement.
			return
		}
		if e.by == by.dep.Model {
			n++
			longest = max(longest, e.gap)
		}
	}
	c.stepReturns = append(c.stepReturns, eviction{victim: r.dep.Model, by: by.dep.Model, at: now, gap: gap})
	key := protectKey{victim: r.dep.Model, by: by.dep.Model}
	keep := 2 * longest.Round(time.Second)
	if p, ok := c.protected[key]; ok && p.idle >= keep || n < c.cfg.ThrashCount {
		return
	}
	c.stepProtects = append(c.stepProtects, key)
	c.stepKeep = append(c.stepKeep, protection{idle: keep, until: now.Add(c.cfg.SerializeFor)})
	c.emit(ActProtect, r, by.dep.Model, TriggerPressure, by.dep.Model, Inputs{Reload: c.reload(r)}, now,
		"protect %s from %s: %s's demand displaced %s and %s was asked for again %d times in %v, after idle spells up to %v (a cold load of %v each); %s %s evicts %s %s only after %v idle, for %v",
		r.dep.Model, by.dep.Model, by.dep.Model, r.dep.Model, r.dep.Model, n, c.cfg.ThrashWindow, longest.Round(time.Second), c.reload(r).Round(time.Millisecond),
		by.dep.Priority, by.dep.Model, r.dep.Priority, r.dep.Model, keep, c.cfg.SerializeFor)
}

// isProtected reports whether x is protected from b's demand now: b
// sends x cold only after x has been idle the raised keep-alive (see
// protectIfReturning).
func (c *Controller) isProtected(x, b *replica, now time.Time) bool {
	if len(c.protected) == 0 {
		return false
	}
	p, ok := c.protected[protectKey{victim: x.dep.Model, by: b.dep.Model}]
	return ok && now.Sub(x.lastUse) < p.idle
}

// unloadAfter is how long x may stay asleep before it is unloaded for
// idleness: its last request's keep_alive, its deployment's spec.idle, or
// the card's IdleUnload (policy.go, idle); a negative keep_alive never.
func (c *Controller) unloadAfter(x *replica) time.Duration {
	switch {
	case x.keepSet && x.keep < 0:
		return time.Duration(math.MaxInt64)
	case x.keepSet:
		return x.keep
	case x.dep.IdleUnload > 0:
		return x.dep.IdleUnload
	}
	return c.cfg.IdleUnload
}
