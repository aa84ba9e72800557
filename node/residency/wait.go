package residency

import (
	"fmt"
	"time"
)

// Waits: every model whose requests wait for the card says why, in one
// cause with its numbers and, where the controller can promise one, the
// time it gets the card by (docs/residency.md, "Why a request waits").
// The plan shows it (PlanEntry.Wait), the gateway's 503 after the cold
// wait quotes it (WaitExpired), and a wait that lasts past WaitNoted is
// recorded once per wait as a `wait` decision with the oldest request's
// age.

// WaitNoted is how long a model's requests wait for the card before the
// wait is explained in the plan and recorded as a `wait` decision.
const WaitNoted = time.Second

// Wait is why a model's requests wait for the card.
type Wait struct {
	// Waiting is the requests waiting for the card (queued at the gateway
	// for an engine that is not serving).
	Waiting int
	// Since is when the wait began: the oldest waiting request's arrival
	// as the controller saw it.
	Since time.Time
	// Cause is the one reason, in words and numbers ("loading, 12s of
	// 35s", "waits for its background turn: …").
	Cause string
	// By is when the model gets the card at the latest; zero where no
	// bound can be given (a full card, a load past its expected time).
	By time.Time
	// Text is all of it in one line as of the plan (text(now)), and Age
	// the oldest request's wait then; set in PlanEntry.Wait.
	Text string
	Age  time.Duration
}

// waiting reports whether r has requests waiting for the card, and how
// many: requests for an engine that is not serving, or that came while
// it drains.
func waiting(r *replica) int {
	switch r.state {
	case Resident:
		return 0
	case Draining:
		return r.held
	}
	return r.active
}

// waitOf explains r's wait at now from the state the last step left (its
// slotBy, its drains, its turn). ok is false when r has no requests
// waiting.
func (c *Controller) waitOf(r *replica, now time.Time) (w Wait, ok bool) {
	n := waiting(r)
	if n == 0 || r.removed {
		return Wait{}, false
	}
	w = Wait{Waiting: n, Since: waitStart(r, now)}
	card := c.cfg.Card
	switch r.state {
	case Loading, Waking:
		took, what := c.loadTime(r), "loading"
		if r.state == Waking {
			took, what = c.wakeTime(r), "waking"
		}
		spent := now.Sub(r.opStart)
		if took > 0 && spent < took {
			w.Cause = fmt.Sprintf("%s on card %s, %s of %s", what, card, dur(spent), dur(took))
			w.By = r.opStart.Add(took)
		} else {
			w.Cause = fmt.Sprintf("%s on card %s for %s, past its expected %s", what, card, dur(spent), dur(took))
		}
		return w, true
	case Draining:
		w.Cause = fmt.Sprintf("waits for its return: its engine on card %s is being taken off (%s), its %s finish first",
			card, r.pending, count(r.active-r.held, "running request"))
		return w, true
	case Failed:
		if now.Before(r.retryAt) {
			w.Cause = fmt.Sprintf("its last load on card %s failed (%s); it is tried again at %s, in %s",
				card, count(r.failures, "failure"), r.retryAt.Format(time.TimeOnly), dur(r.retryAt.Sub(now)))
			w.By = r.retryAt.Add(2 * c.reload(r))
			return w, true
		}
	}
	switch {
	case c.pinnedOnly && r.dep.Residency == OnDemand:
		w.Cause = fmt.Sprintf("card %s is pinned-only after a ledger violation: onDemand models are not loaded until the operator clears it", card)
		return w, true
	case r.rejected:
		_, _, claim := c.target(r)
		w.Cause = fmt.Sprintf("card %s can never hold it: it needs %s, at most %s can be made free (usable %s)",
			card, gib(claim), gib(max(c.mostFree(r), 0)), gib(c.usable))
		return w, true
	case r.yielding:
		w.Cause, w.By = fmt.Sprintf("yields to %s's turn on card %s, which ends by %s (its share stays lent meanwhile)",
			r.yieldTo, card, r.yieldEnd.Format(time.TimeOnly)), r.slotBy
		return w, true
	}
	if x := c.drainingFor(r); x != nil {
		w.Cause = fmt.Sprintf("waits for memory: %s is being taken off card %s for it (%s", x.dep.Model, card, x.pending)
		if x.state == Draining && !x.issued && x.active > 0 {
			w.Cause += fmt.Sprintf(" once its %s finish, by %s at the latest", count(x.active, "request"), x.drainBy.Format(time.TimeOnly))
		}
		w.Cause += ")"
		w.By = maxTime(x.drainBy, now).Add(stopAllowance + 2*c.reload(r))
		return w, true
	}
	if !r.slotBy.IsZero() {
		w.By = r.slotBy
		if c.outrankedOnCard(r) && c.waitBound(r, now) == 0 {
			holder := fmt.Sprintf("card %s is busy", card)
			if h := c.outranking(r); h != nil {
				holder = fmt.Sprintf("%s %s holds card %s with %s", h.dep.Priority, h.dep.Model, card, count(h.active, "request"))
			} else if h := c.sameClassHolder(r); h != nil {
				holder = fmt.Sprintf("protected %s holds card %s with %s", h.dep.Model, card, count(h.active, "request"))
			}
			w.Cause = fmt.Sprintf("waits for its %s turn: %s (a turn is due after %s of waiting, at most %.0f%% of the card's time)",
				c.turnKind(r), holder, dur(c.turnWait(r)), c.turnShare(r)*100)
			if c.lowHolds(r) {
				w.Cause = fmt.Sprintf("in its %s turn: memory on card %s is being freed for it", c.turnKind(r), card)
			}
			return w, true
		}
		if x, until := c.serializedHolder(r); x != nil {
			w.Cause = fmt.Sprintf("serialized with %s until %s: each keeps card %s for its turn", x.dep.Model, until.Format(time.TimeOnly), card)
			return w, true
		}
		if x := c.sameClassHolder(r); x != nil {
			w.Cause = fmt.Sprintf("waits for its turn after %s (%s too), on card %s for %s", x.dep.Model, x.dep.Priority, card, dur(now.Sub(x.resident)))
			return w, true
		}
		w.Cause = fmt.Sprintf("waits for its turn on card %s", card)
		return w, true
	}
	op, _, claim := c.target(r)
	othersNow, _ := c.others(r)
	free := c.usable - othersNow - c.earmark
	if claim > free {
		w.Cause = fmt.Sprintf("card %s is full: %s needs %s for its %s, %s free; held by %s", card, r.dep.Model, gib(claim), op, gib(max(free, 0)), c.holders(r))
	} else {
		w.Cause = fmt.Sprintf("cold on card %s: %s fits (%s needed, %s free); its %s starts at the next step", card, r.dep.Model, gib(claim), gib(free), op)
	}
	return w, true
}

// waitStart is when r's wait began: the controller's record of it, else
// (requests that came while it drains) when its state began.
func waitStart(r *replica, now time.Time) time.Time {
	if r.waitSince.IsZero() || r.waitSince.After(now) {
		return r.since
	}
	return r.waitSince
}

// drainingFor is a model being taken off the card to make room for r, or
// nil.
func (c *Controller) drainingFor(r *replica) *replica {
	for i := range c.reps {
		x := &c.reps[i]
		if x != r && x.drainFor == r.dep.Model && x.pending != 0 {
			return x
		}
	}
	return nil
}

// outranking is the busiest model of a higher class than r on the card,
// or nil.
func (c *Controller) outranking(r *replica) *replica {
	var h *replica
	for i := range c.reps {
		x := &c.reps[i]
		if x.removed || x.dep.Priority <= r.dep.Priority {
			continue
		}
		if h == nil || x.active > h.active {
			h = x
		}
	}
	return h
}

// serializedHolder is the resident model r is serialized with, and when
// its turn ends at the least; nil when none holds the card.
func (c *Controller) serializedHolder(r *replica) (*replica, time.Time) {
	for i := range c.reps {
		x := &c.reps[i]
		if x == r || x.state != Resident {
			continue
		}
		if _, ok := c.serialized[pairOf(r.dep.Model, x.dep.Model)]; ok {
			return x, x.resident.Add(c.protection(x, r))
		}
	}
	return nil, time.Time{}
}

// sameClassHolder is the resident model of r's class that has been on the
// card the shortest time (the one whose protection runs longest), or nil.
func (c *Controller) sameClassHolder(r *replica) *replica {
	var h *replica
	for i := range c.reps {
		x := &c.reps[i]
		if x == r || x.state != Resident || x.dep.Priority != r.dep.Priority {
			continue
		}
		if h == nil || x.resident.After(h.resident) {
			h = x
		}
	}
	return h
}

// noteWaits records a `wait` decision for each model whose requests have
// waited WaitNoted, once per wait.
func (c *Controller) noteWaits(now time.Time) {
	for i := range c.reps {
		r := &c.reps[i]
		// Most steps have nothing to record: no words are made for them.
		if waiting(r) == 0 || r.removed || now.Sub(waitStart(r, now)) < WaitNoted || r.waitNoted.Equal(waitStart(r, now)) {
			continue
		}
		w, ok := c.waitOf(r, now)
		if !ok || now.Sub(w.Since) < WaitNoted || r.waitNoted.Equal(w.Since) {
			continue
		}
		r.waitNoted = w.Since
		c.record(Decision{Time: now, Card: c.cfg.Card, Action: ActWait, Model: r.dep.Model, Trigger: TriggerRequest,
			Inputs: Inputs{Rate: r.rate, Active: r.active, Reload: c.reload(r)},
			Reason: fmt.Sprintf("wait %s: %s", r.dep.Model, w.text(now))})
	}
}

// text is the wait as the plan, `models get` and the dashboard show it:
// "4 requests waiting, the oldest for 1m2s: waits for its background
// turn: …; gets the card by 14:32:10 at the latest (in 3m0s)".
func (w Wait) text(now time.Time) string {
	s := fmt.Sprintf("%s waiting, the oldest for %s: %s", count(w.Waiting, "request"), dur(now.Sub(w.Since)), w.Cause)
	if !w.By.IsZero() {
		s += fmt.Sprintf("; gets the card by %s at the latest (in %s)", w.By.Format(time.TimeOnly), dur(w.By.Sub(now)))
	}
	return s
}
