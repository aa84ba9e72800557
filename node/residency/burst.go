package residency

import "time"

// Short spells: an onDemand model whose requests come in short spells (a
// vision model asked for documents for a minute or two, then quiet for
// many) keeps the card for its spell, while its requests keep arriving,
// against the demand of a busier model of its class (docs/residency.md,
// "No starvation").
//
// Without it, two models of one class that do not fit together swap on
// every gap between the spell's requests: the busier model takes the card
// in a gap of a few seconds, the next request of the spell waits for a
// wake and for the busier model's protection, and each swap costs it most
// of its SLO. Serving the short spell through first (the shortest job
// first), the other model waits at most burstHold, once per spell.
//
// A spell starts with a request that follows at least burstHold of quiet
// (a model's first request starts one too) and ends with the last request
// before the next such quiet. A model's spells are short when the EWMA of
// the lengths of those it has had so far is at most burstHold; a model
// asked for without such pauses, or in long spells, holds nothing by this
// rule. For burstHold from its spell's start, a model whose spells are
// short keeps the card while its requests keep arriving: it has requests
// running or queued, or its last request came less than the other model's
// turn ago (that one's reload plus the minimum residency: had it taken the
// card, its turn would not have ended before this one's next request).
//
// A spell that runs on longer than the model's spells usually do holds
// no longer than its usual length (the EWMA) and the other model's turn:
// the hold is for a short spell, not for one that has stopped being one.
//
// It holds only against a busier model: one whose decayed arrival rate is
// above the spell's model's. A rarer model (a few long answers an hour)
// takes its turn as before, after the minimum residency: waiting a whole
// spell would cost it a large share of its few requests (they expire at
// the gateway), where the busier model's wait costs a small share of its
// many. The rates are read from the forecasts, not from the step's cached
// rates, so that the ledger's check of a drain (outranks, ledger.go) sees
// what the step saw.

// burstHold is the longest a spell keeps the card: as long as a
// lower-class turn keeps it once in (max(3 min, 2 × its load time)).
func (c *Controller) burstHold(x *replica) time.Duration { return c.lowerSlot(x) }

// arrived records a request of r for its spells: one after burstHold of
// quiet ends the last spell and starts a new one.
func (c *Controller) arrived(r *replica, now time.Time) {
	if !r.fc.last.IsZero() && now.Sub(r.fc.last) < c.burstHold(r) {
		return
	}
	if !r.spellStart.IsZero() {
		l := r.fc.last.Sub(r.spellStart).Seconds()
		if r.spells == 0 {
			r.spellLen = l
		} else {
			r.spellLen = (1-gapAlpha)*r.spellLen + gapAlpha*l
		}
		r.spells++
	}
	r.spellStart = now
}

// shortSpells reports whether x's spells have been short so far.
func (c *Controller) shortSpells(x *replica) bool {
	return x.spells > 0 && x.spellLen <= c.burstHold(x).Seconds()
}

// burstHoldLeft is how much longer x's spell may keep the card (0: none):
// x onDemand with short spells, resident for requests, within burstHold
// of its spell's start.
func (c *Controller) burstHoldLeft(x *replica, now time.Time) time.Duration {
	if x.dep.Residency != OnDemand || x.state != Resident || x.prewarm || x.spellStart.IsZero() || !c.shortSpells(x) {
		return 0
	}
	return max(0, c.burstHold(x)-now.Sub(x.spellStart))
}

// burstHolds reports whether x, in its short spell, keeps the card against
// b's demand, of x's class and busier: x's requests keep arriving.
func (c *Controller) burstHolds(x, b *replica, now time.Time) bool {
	if b.dep.Priority != x.dep.Priority || c.burstHoldLeft(x, now) == 0 ||
		b.fc.rate(now, c.cfg.RateHalfLife) <= x.fc.rate(now, c.cfg.RateHalfLife) {
		return false
	}
	if now.Sub(x.spellStart) > time.Duration(x.spellLen*float64(time.Second))+c.turn(b) {
		return false // longer than its spells usually are
	}
	return x.active > 0 || now.Sub(x.fc.last) < c.turn(b)
}
