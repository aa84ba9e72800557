package residency

import "time"

// Lower-class turns: a model of a lower class than others on its card,
// whose requests have waited lowerWait for the card, gets one bounded
// turn on it (docs/residency.md, "No starvation"). Without this a
// background model that fits alone never runs while interactive models
// keep busy: it takes memory only in their quiet spells (mayDisplace), and
// a busy card has none.
//
// One turn runs at a time on a card, the longest-waiting model first. The
// holder may take memory from any model that is not pinned, busy or not,
// lowest value per GiB first (busy ones after idle ones: a drain cuts
// their work short); a load or wake in progress is not cancelled for it.
// From the grant until the turn ends, nothing takes the holder's memory,
// and warm owners that would not fit beside it yield, whatever their class
// (their requests wait at the gateway, their share counted as lent; each
// wait that yields is a serialize decision). An owner yields to one turn
// per wait: one that already yielded to another turn, or to a borrower's
// turn (turns.go), in this wait takes its share back instead, from the
// holder too, so turns granted one after another never keep a warm model
// asleep past one turn and the card never promises more than it holds.
// The turn ends lowerSlot after the holder is on the card, when its
// requests are done and none came for lowerGrace, or, when it never got
// in, at lowerCap after the grant; owners then take their share back at
// once, as from any lower-class borrower.
//
// The card time a model's turns cost the higher classes (from the grant
// to the end) is at most lowerShare of the time: its next turn starts no
// earlier than its last turn's start plus that turn's length divided by
// lowerShare. The cap is per lower-class model, so that one model's turns
// do not push another's back by hours; k such models take at most
// k × lowerShare.

const (
	// lowerWait is how long a lower-class model waits for the card
	// before its turn is due.
	lowerWait = 10 * time.Minute
	// lowerSlotMin is the least a turn keeps the card once in: long
	// enough for a batch job to make progress past its load.
	lowerSlotMin = 3 * time.Minute
	// lowerShare is the most of the card's time turns take from the
	// higher classes (examples/serve/README.md measures the choice).
	lowerShare = 0.03
	// lowerGrace is how long a turn's holder stays with no requests
	// before its turn ends: a client that sends its next request as the
	// last one is answered (a batch loop) keeps its turn.
	lowerGrace = 5 * time.Second
)

// lowTurn is a lower-class model's turn on the card.
type lowTurn struct {
	model ModelID
	start time.Time // granted
	in    time.Time // the holder came on the card (zero: not yet)
}

// lowerSlot is how long h keeps the card in its turn once in: at least
// lowerSlotMin, and twice its load (a turn is worth its load).
func (c *Controller) lowerSlot(h *replica) time.Duration {
	return max(lowerSlotMin, 2*c.loadTime(h))
}

// lowerCap is the longest a turn of h lasts: the drain of what it takes
// the memory from, its stop, h's reload twice (a first estimate may be
// short), and its slot.
func (c *Controller) lowerCap(h *replica) time.Duration {
	return c.cfg.DrainDeadline + stopAllowance + 2*c.reload(h) + c.lowerSlot(h)
}

// lowHolder is the model in a lower-class turn this step, or nil.
func (c *Controller) lowHolder() *replica {
	if c.stepLow.model == "" {
		return nil
	}
	return c.rep(c.stepLow.model)
}

// lowHolds reports whether x is in its lower-class turn: nothing takes its
// memory, and it may take memory of higher classes.
func (c *Controller) lowHolds(x *replica) bool {
	return c.stepLow.model != "" && x.dep.Model == c.stepLow.model
}

// outrankedBy reports whether x is of a class below some model of the card.
func (c *Controller) outrankedOnCard(x *replica) bool {
	if c.bestEffort(x) {
		return true // best-effort below the protected set (besteffort.go)
	}
	for i := range c.reps {
		if y := &c.reps[i]; !y.removed && y.dep.Priority > x.dep.Priority {
			return true
		}
	}
	return false
}

// lowTurns runs in turns: it ends the turn in progress when it is over,
// and grants the next one when it is due. It runs after waitSince is
// updated.
func (c *Controller) lowTurns(now time.Time) {
	if h := c.lowHolder(); h != nil || c.stepLow.model != "" {
		end := h == nil || h.removed || c.pinnedOnly
		if !end {
			if h.state == Resident && c.stepLow.in.IsZero() {
				c.stepLow.in = now
			}
			if h.state == Draining || h.pending != 0 {
				end = true
			}
			switch {
			case h.active == 0 && h.state != Loading && h.state != Waking && now.Sub(h.lastUse) >= lowerGrace:
				end = true
			case !c.stepLow.in.IsZero() && !now.Before(c.stepLow.in.Add(c.lowerSlot(h))):
				end = true
			case c.stepLow.in.IsZero() && !now.Before(c.stepLow.start.Add(c.lowerCap(h))):
				end = true
			}
		}
		if !end {
			return
		}
		// The next turn starts no earlier than this one's length over
		// lowerShare after its start.
		c.stepLowNext = make(map[ModelID]lastTurn, len(c.lowNext)+1)
		for k, v := range c.lowNext {
			c.stepLowNext[k] = v
		}
		c.stepLowNext[c.stepLow.model] = lastTurn{start: c.stepLow.start, length: now.Sub(c.stepLow.start)}
		c.stepLow = lowTurn{}
	}
	if c.pinnedOnly {
		return
	}
	var pick *replica
	for i := range c.reps {
		r := &c.reps[i]
		if r.removed || r.pending != 0 || r.active == 0 || r.waitSince.IsZero() || now.Sub(r.waitSince) < c.turnWait(r) || now.Before(c.nextLow(r)) {
			continue
		}
		if r.state != Cold && r.state != Sleeping && !(r.state == Failed && !now.Before(r.retryAt)) {
			continue
		}
		if !c.outrankedOnCard(r) {
			continue
		}
		if _, _, claim := c.target(r); claim > c.mostFree(r) {
			continue
		}
		if pick == nil || r.waitSince.Before(pick.waitSince) {
			pick = r
		}
	}
	if pick != nil {
		c.stepLow = lowTurn{model: pick.dep.Model, start: now}
	}
}

// lowYield makes warm owners that would not fit beside the turn's holder
// yield until the turn ends: their requests wait, their share stays lent.
func (c *Controller) lowYield(now time.Time) {
	h := c.lowHolder()
	if h == nil {
		return
	}
	end := c.lowEnd(h)
	var extra int64
	if h.state == Cold || h.state == Sleeping || h.state == Failed {
		_, _, claim := c.target(h)
		extra = claim - c.claim(h, true)
	}
	for i := range c.reps {
		r := &c.reps[i]
		if r == h || r.removed || r.dep.Residency != Warm || r.active == 0 || r.pending != 0 {
			continue
		}
		if r.state != Sleeping && r.state != Cold && r.state != Failed {
			continue
		}
		// One turn per wait: an owner that yielded to an earlier turn in
		// this wait takes its share back now, from this turn's holder too.
		// So does one that yielded to a borrower's turn (turns.go).
		first := r.lowYielded.model == ""
		if !first && (r.lowYielded.model != h.dep.Model || !r.lowYielded.start.Equal(c.stepLow.start)) || first && !r.yieldCap.IsZero() {
			continue
		}
		if _, committed := c.others(r); committed+extra+max(r.dep.Share, c.footprint(r)) <= c.usable {
			continue
		}
		if !r.yielding {
			r.yielding = true
			c.sumsOK = false
		}
		r.lowYielded = lowTurn{model: h.dep.Model, start: c.stepLow.start}
		r.yieldTo, r.yieldEnd = h.dep.Model, end
		r.slotBy = maxTime(r.slotBy, end.Add(c.reload(r)))
		// Each wait that yields says so: the owner's requests wait for
		// this turn.
		if first {
			c.emit(ActSerialize, r, h.dep.Model, TriggerPressure, h.dep.Model, Inputs{}, now,
				"serialize %s and %s: %s's turn as a %s model that waited ≥ %v for the card; %s's %s wait for it, back by %s at the latest",
				r.dep.Model, h.dep.Model, h.dep.Model, c.turnKind(h), c.turnWait(h), r.dep.Model, count(r.active, "request"), r.slotBy.Format(time.TimeOnly))
		}
	}
}

// lowEnd is when the turn of h ends at the latest.
func (c *Controller) lowEnd(h *replica) time.Time {
	if !c.stepLow.in.IsZero() {
		return c.stepLow.in.Add(c.lowerSlot(h))
	}
	return c.stepLow.start.Add(c.lowerCap(h))
}

// lowBound is when r, of a lower class, waiting for the card, gets it at
// the latest: its turn is due lowerWait after its wait began and no sooner
// than lowerShare allows after its own last turn (nor before the end of
// another model's turn in progress, at its longest); then what frees
// memory for it and its own reload twice. With several lower-class models
// waiting, each turn served pushes the others' bound back by one turn.
func (c *Controller) lowBound(r *replica, now time.Time) time.Time {
	if c.lowHolds(r) {
		return c.stepLow.start.Add(c.cfg.DrainDeadline + stopAllowance + 2*c.reload(r))
	}
	due := maxTime(r.waitSince.Add(c.turnWait(r)), c.nextLow(r))
	if h := c.lowHolder(); h != nil {
		end := c.lowEnd(h)
		due = maxTime(due, end)
	}
	return maxTime(due, now).Add(c.cfg.DrainDeadline + stopAllowance + 2*c.reload(r))
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// lastTurn is a model's last turn: its start and length.
type lastTurn struct {
	start  time.Time
	length time.Duration
}

// next is the earliest start of the turn after t at share.
func (t lastTurn) next(share float64) time.Time {
	if t.start.IsZero() {
		return time.Time{}
	}
	return t.start.Add(time.Duration(float64(t.length) / share))
}

// nextLow is the earliest start of r's next turn: its last turn's length
// over its share now (turnShare: a best-effort model answering few of its
// requests has a larger share) after that turn's start.
func (c *Controller) nextLow(r *replica) time.Time {
	last := c.lowNext[r.dep.Model]
	if c.stepLowNext != nil {
		last = c.stepLowNext[r.dep.Model]
	}
	next := last.next(c.turnShare(r))
	if c.bestEffort(r) && !c.lowerClass(r) && !r.waitSince.IsZero() {
		// A best-effort model of the protected set's class waits at
		// most beLongWait past its turn's due time, whatever its share,
		// within beLongShare. One of a lower class keeps its share's
		// spacing: a batch loop answered most of the few it offers would
		// otherwise take a protected interactive model's memory every
		// half hour (examples/serve/home.yaml: coder 587 requests
		// rejected with it, 0 without).
		next = minTime(next, maxTime(r.waitSince.Add(c.turnWait(r)+beLongWait), last.next(beLongShare)))
	}
	return next
}
