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
	cost := priorityWeight(x.dep.Priority) * p * rl * (1 + x.rate/60*rl)
	gain := priorityWeight(b.dep.Priority) * (1 - p) * t.Seconds()
	return cost <= gain
}
