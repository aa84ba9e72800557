package residency

import (
	"cmp"
	"fmt"
	"slices"
	"time"
)

// step runs the policy once at now: operator removals, drains that are
// done, demand (waiting requests and reserved models not yet loaded),
// prewarm from forecasts, idle demotion. It changes the replicas as if its
// actions were executed at once (costs of pending operations stay until the
// node reports them done) and returns the actions in order.
func (c *Controller) step(now time.Time) []Action {
	c.out = c.out[:0]
	c.stepEvictions = c.stepEvictions[:0]
	c.stepReturns = c.stepReturns[:0]
	c.stepProtects, c.stepKeep = c.stepProtects[:0], c.stepKeep[:0]
	c.stepCuts = c.stepCuts[:0]
	c.stepLow, c.stepLowNext = c.low, nil
	c.earmark = 0
	c.sumsOK = false
	for i := range c.reps {
		c.reps[i].rate = c.reps[i].fc.rate(now, c.cfg.RateHalfLife)
	}
	c.chooseProtected(now)
	c.turns(now)
	c.removals(now)
	c.drains(now)
	c.operatorStops(now)
	c.keepPromises(now)
	c.demand(now)
	if !c.pinnedOnly {
		c.prewarms(now)
	}
	c.idle(now)
	return c.out
}

func (c *Controller) emit(kind ActionKind, r *replica, peer ModelID, trig Trigger, forM ModelID, in Inputs, now time.Time, format string, args ...any) {
	in.Rate = r.rate
	in.Active = r.active
	// Every change to a replica in a step comes with an action.
	c.sumsOK = false
	by := ""
	if trig == TriggerOperator {
		by = r.opBy
	}
	c.out = append(c.out, Action{Kind: kind, Model: r.dep.Model, Peer: peer, Decision: Decision{
		Time: now, Card: c.cfg.Card, Action: kind, Model: r.dep.Model, Trigger: trig, For: forM,
		Inputs: in, Reason: fmt.Sprintf(format, args...), By: by, Advised: c.cfg.Mode == Advise,
	}})
}

// stop starts taking r off the card (or to sleep) with op: at once when
// nothing runs on it (a load or wake in progress is cancelled), after a
// drain when requests run on it.
func (c *Controller) stop(r *replica, op ActionKind, trig Trigger, forM ModelID, in Inputs, now time.Time, format string, args ...any) {
	if forM != "" && trig.demand() {
		c.stepEvictions = append(c.stepEvictions, eviction{victim: r.dep.Model, by: forM, at: now, gap: now.Sub(r.lastUse)})
	}
	if (r.state == Loading || r.state == Waking) && r.dep.Residency == OnDemand && forM != "" {
		// An owner's return, or a higher class's request, cuts a
		// borrower's turn short (turns.go).
		c.stepCuts = append(c.stepCuts, cut{model: r.dep.Model, at: now})
	}
	r.pending, r.drainFor, r.drainTrig = op, forM, trig
	deadline := c.drainDeadline(r, forM)
	r.drainBy = now.Add(deadline)
	switch {
	case r.state == Loading || r.state == Waking || r.state == Sleeping:
		// Nothing runs on the engine: a load or wake in progress is
		// cancelled; requests waiting for it wait at the gateway for the
		// next load.
		r.issued = true
		c.emit(op, r, "", trig, forM, in, now, format, args...)
	case r.active > 0 && !skipI3:
		r.issued = false
		c.setState(r, Draining, now)
		if deadline == 0 {
			c.emit(ActDrain, r, "", trig, forM, in, now, "drain %s, then %s at once: %s %s does not wait behind its %d active background requests, which are cut off: "+format,
				append([]any{r.dep.Model, op, c.priorityOf(forM), forM, r.active}, args...)...)
			break
		}
		c.emit(ActDrain, r, "", trig, forM, in, now, "drain %s, then %s once its %s finish or after %s: "+format,
			append([]any{r.dep.Model, op, count(r.active, "active request"), dur(deadline)}, args...)...)
	default:
		r.issued = true
		c.setState(r, Draining, now)
		c.emit(op, r, "", trig, forM, in, now, format, args...)
	}
}

func (c *Controller) removals(now time.Time) {
	for i := range c.reps {
		r := &c.reps[i]
		if !r.removed || r.pending == ActUnload || r.pending == ActEvict {
			continue
		}
		switch r.state {
		case Resident, Sleeping, Loading, Waking:
			c.stop(r, ActUnload, TriggerScheduler, "", Inputs{Bytes: c.cost(r)}, now,
				"unload %s: deployment removed from card %s; frees %s", r.dep.Model, c.cfg.Card, gib(c.cost(r)))
		case Draining:
			// A sleep in progress becomes an unload once it is asleep; one not
			// yet issued becomes the unload.
			if !r.issued {
				r.pending, r.drainTrig = ActUnload, TriggerScheduler
				c.sumsOK = false
			}
		}
	}
	for i := range c.reps {
		r := &c.reps[i]
		if r.removed && r.state == Sleeping && r.pending == 0 {
			c.stop(r, ActUnload, TriggerScheduler, "", Inputs{Bytes: c.cost(r)}, now,
				"unload %s: deployment removed from card %s; frees %s", r.dep.Model, c.cfg.Card, gib(c.cost(r)))
		}
	}
}

// hurryDrains ends at once the drain of a background engine drained for
// background demand, whose work could run up to the drain deadline, when a
// request of a higher class needs memory: it does not wait behind
// background work (drainDeadline). The next step issues the stop.
func (c *Controller) hurryDrains(b *replica, now time.Time) {
	if b.dep.Priority == Background {
		return
	}
	for i := range c.reps {
		x := &c.reps[i]
		if x.state != Draining || x.issued || x.pending == 0 || x.dep.Priority != Background || !now.Before(x.drainBy) {
			continue
		}
		x.drainBy, x.drainFor, x.drainTrig = now, b.dep.Model, TriggerRequest
	}
}

// drains issues the operation a drained engine waits for once its requests
// are done or its deadline passed.
func (c *Controller) drains(now time.Time) {
	for i := range c.reps {
		r := &c.reps[i]
		// The requests that came during the drain (held) wait at the
		// gateway for r's return: only those before it are waited for.
		if r.state != Draining || r.pending == 0 || r.issued || r.active > r.held && now.Before(r.drainBy) {
			continue
		}
		in := Inputs{Bytes: c.cost(r) - c.committedCost(r)}
		r.issued = true
		if r.active == 0 {
			c.emit(r.pending, r, "", r.drainTrig, r.drainFor, in, now, "%s %s: drained, no requests active; frees %s",
				r.pending, r.dep.Model, gib(in.Bytes))
		} else if r.active <= r.held {
			c.emit(r.pending, r, "", r.drainTrig, r.drainFor, in, now, "%s %s: drained, the requests it had are done; the %s since wait at the gateway for its return; frees %s",
				r.pending, r.dep.Model, count(r.active, "request"), gib(in.Bytes))
		} else if d := c.drainDeadline(r, r.drainFor); d == 0 {
			c.emit(r.pending, r, "", r.drainTrig, r.drainFor, in, now,
				"%s %s: %s %s does not wait behind background work, %d requests are cut off%s; frees %s",
				r.pending, r.dep.Model, c.priorityOf(r.drainFor), r.drainFor, r.active, c.cutFate(r), gib(in.Bytes))
		} else {
			c.emit(r.pending, r, "", r.drainTrig, r.drainFor, in, now,
				"%s %s: drain deadline %v passed, %d requests are cut off%s; frees %s",
				r.pending, r.dep.Model, d, r.active, c.cutFate(r), gib(in.Bytes))
		}
	}
}

// cutFate says what becomes of r's requests cut off by a drain deadline:
// the gateway runs a background model's unstreamed ones again when the
// model is back (queue.Scheduler.Requeue), and answers the rest with an
// error.
func (c *Controller) cutFate(r *replica) string {
	if r.dep.Priority == Background {
		return " (those not streamed run again in its next turn, the rest end with an error)"
	}
	return " with an error"
}

// keepPromises returns shares that onDemand models hold when a promise
// grows under them: a model placed or changed to pinned or warm while
// borrowers fill the card, or a resident model whose reserved share
// exceeds what it holds.
func (c *Controller) keepPromises(now time.Time) {
	var committed int64
	for i := range c.reps {
		committed += c.claim(&c.reps[i], true)
	}
	deficit := committed - c.usable
	if deficit <= 0 {
		return
	}
	// The owner whose share is least covered by what it holds.
	var owner *replica
	var gap int64 = -1
	for i := range c.reps {
		r := &c.reps[i]
		if !r.dep.Residency.Reserves() || r.removed || lent(r, true) {
			continue
		}
		if g := r.dep.Share - c.committedCost(r); g > gap {
			owner, gap = r, g
		}
	}
	if owner == nil {
		return
	}
	chosen, ok := c.victims(owner, TriggerOwnerReturn, deficit, 0, now)
	if !ok {
		return
	}
	for _, k := range chosen {
		x := &c.cands[k]
		v := &c.reps[x.idx]
		c.stop(v, x.op, TriggerOwnerReturn, owner.dep.Model, Inputs{Bytes: x.freed, Value: x.value, Need: deficit, Reload: x.reload}, now,
			"%s %s: returns %s of %s's reserved share; frees %s", x.op, v.dep.Model, gib(deficit), owner.dep.Model, gib(x.freed))
	}
}

// wants reports whether r should be brought onto the card now, and why;
// hold is true when it must first wait out a retry backoff (a reserved
// owner asked for still has its share returned meanwhile).
func (c *Controller) wants(r *replica, now time.Time) (trig Trigger, want, hold bool) {
	if r.removed || r.pending != 0 || r.yielding {
		return 0, false, false
	}
	switch r.state {
	case Failed:
		if now.Before(r.retryAt) {
			asked := r.active > 0 && r.dep.Residency == Warm
			return TriggerRequest, asked, asked
		}
		fallthrough
	case Cold:
		if r.active > 0 {
			return TriggerRequest, true, false
		}
		// A warm model an operator unloaded keeps its share reserved
		// but stays off the card until asked for.
		kept := r.dep.Residency == Pinned || r.dep.Residency == Warm && !r.opHeld
		return c.keeper(r), kept || r.opLoad || c.keeps(r), false
	case Sleeping:
		if r.active > 0 {
			return TriggerRequest, true, false
		}
		return c.keeper(r), r.opLoad || r.dep.Residency == Pinned || c.pinnedOnly && r.dep.Residency == Warm, false
	}
	return 0, false, false
}

// keeper is the trigger of a load or wake nobody's requests asked for: an
// operator's load, a restart after a crash or a failed start, the first
// load of a replica placed here by a failover, else the scheduler's
// placement (a reserved model is kept on its card).
func (c *Controller) keeper(r *replica) Trigger {
	switch {
	case r.opLoad:
		return TriggerOperator
	case r.state == Failed || r.failures > 0:
		return TriggerWatchdog
	case c.keeps(r):
		// A protected model the best-effort policy keeps on the card.
		return TriggerPressure
	case r.dep.Failover && r.resident.IsZero():
		return TriggerFailover
	}
	return TriggerScheduler
}

// demand brings waiting and reserved models onto the card, most important
// first: reserved owners (their shares are promised), then priority, then
// the longest waiting.
func (c *Controller) demand(now time.Time) {
	var want []int
	for i := range c.reps {
		r := &c.reps[i]
		if _, ok, _ := c.wants(r, now); !ok {
			continue
		}
		if c.pinnedOnly && r.dep.Residency == OnDemand {
			if !r.rejected {
				r.rejected = true
				c.emit(ActReject, r, "", TriggerRequest, "", Inputs{}, now,
					"reject %s: card %s is pinned-only after a ledger violation until the operator clears it", r.dep.Model, c.cfg.Card)
			}
			continue
		}
		want = append(want, i)
	}
	slices.SortFunc(want, func(a, b int) int {
		x, y := &c.reps[a], &c.reps[b]
		// A lower-class turn's holder goes first: what it frees is
		// its own (lowturn.go).
		return cmp.Or(-cmp.Compare(b2i(c.lowHolds(x)), b2i(c.lowHolds(y))), cmp.Compare(x.dep.Residency, y.dep.Residency),
			-cmp.Compare(x.dep.Priority, y.dep.Priority),
			waitedSince(x, now).Compare(waitedSince(y, now)),
			x.lastUse.Compare(y.lastUse),
			cmp.Compare(x.dep.Model, y.dep.Model))
	})
	for _, i := range want {
		r := &c.reps[i]
		trig, _, hold := c.wants(r, now)
		c.admit(r, trig, !hold, now)
	}
}

// waitedSince is when r's wait for the card began (now for a model not
// waiting): memory freed for a model that waits goes to it before a model
// whose requests came after.
func waitedSince(r *replica, now time.Time) time.Time {
	if r.waitSince.IsZero() {
		return now
	}
	return r.waitSince
}

// target is what r will hold once loaded or woken and what it will claim.
func (c *Controller) target(r *replica) (op ActionKind, cost, claim int64) {
	op, cost = ActLoad, c.peak(r)
	if r.state == Sleeping {
		op, cost = ActWake, c.footprint(r)
	}
	claim = cost
	if r.dep.Residency.Reserves() && !r.removed {
		claim = max(r.dep.Share, cost)
	}
	return op, cost, claim
}

// others sums the claims of every replica but r, now and once pending
// operations complete. The totals are kept until the next action changes a
// replica: most attempts in a step change nothing.
func (c *Controller) others(r *replica) (now, committed int64) {
	if !c.sumsOK {
		c.sumNow, c.sumCommitted = 0, 0
		for i := range c.reps {
			x := &c.reps[i]
			c.sumNow += c.claim(x, false)
			c.sumCommitted += c.claim(x, true)
		}
		c.sumsOK = true
	}
	return c.sumNow - c.claim(r, false), c.sumCommitted - c.claim(r, true)
}

// value is what keeping r costs per GiB it holds: class weight × arrival
// rate (per minute) × seconds to bring it back from where the action leaves
// it, divided by the GiB the action frees. Low value goes first.
func (c *Controller) value(r *replica, reload time.Duration, bytes int64) float64 {
	if bytes <= 0 {
		return 0
	}
	return priorityWeight(r.dep.Priority) * r.rate * reload.Seconds() / (float64(bytes) / (1 << 30))
}

// admit starts r's load or wake if it fits, or frees memory for it, or
// rejects it if it can never fit. trig is TriggerForecast for a prewarm.
// It reports whether the load or wake started.
func (c *Controller) admit(r *replica, trig Trigger, start bool, now time.Time) bool {
	op, cost, claim := c.target(r)
	othersNow, othersCommitted := c.others(r)
	free := c.usable - othersNow - c.earmark
	myValue := c.value(r, c.reload(r), claim)
	// What r's target adds to what it already claims (a warm owner asked
	// for already claims its share): memory later beneficiaries must leave.
	extra := claim - c.claim(r, false)
	if start && claim <= free {
		in := Inputs{Bytes: cost, Free: free, Value: myValue, Reload: c.reload(r)}
		switch {
		case op == ActWake:
			c.emit(ActWake, r, "", trig, "", in, now, "wake %s: %s; wake %s instead of a cold load of %s; needs %s, %s free",
				r.dep.Model, why(trig, r), dur(c.wakeTime(r)), dur(c.loadTime(r)), gib(claim), gib(free))
			c.setState(r, Waking, now)
		case trig == TriggerForecast:
			at, _, _ := r.fc.next()
			c.emit(ActPrewarm, r, "", trig, "", in, now, "prewarm %s: next request predicted in %s (rate %.2f/min); load takes %s; needs %s, %s free",
				r.dep.Model, dur(at.Sub(now)), r.rate, dur(c.loadTime(r)), gib(claim), gib(free))
			c.setState(r, Loading, now)
		default:
			c.emit(ActLoad, r, "", trig, "", in, now, "load %s: %s; needs %s, %s free", r.dep.Model, why(trig, r), gib(claim), gib(free))
			c.setState(r, Loading, now)
		}
		r.opStart = now
		r.rejected = false
		if trig == TriggerForecast {
			r.prewarm = true
		}
		if trig == TriggerRequest && op == ActLoad {
			c.protectIfReturning(r, now)
		}
		return true
	}
	if r.wasLent && r.active == 0 {
		// A warm model that crashed while its share was lent comes back
		// into free memory only, until someone asks for it.
		return false
	}
	need := othersCommitted + c.earmark + claim - c.usable
	if need > 0 && trig == TriggerRequest {
		c.hurryDrains(r, now)
	}
	if need <= 0 {
		// Enough is already being freed; wait for it.
		c.earmark += extra
		return false
	}
	chosen, ok := c.victims(r, trig, need, myValue, now)
	if ok {
		for _, k := range chosen {
			x := &c.cands[k]
			v := &c.reps[x.idx]
			in := Inputs{Bytes: x.freed, Value: x.value, ForValue: myValue, Need: need, Free: free, Reload: x.reload}
			verb := "evict"
			if x.op == ActSleep {
				verb = "sleep"
			}
			// A request may displace a model worth more than it when nothing
			// worth less is left; the reason says so instead of a false "<".
			why := fmt.Sprintf("value %.2f < %s %.2f", x.value, r.dep.Model, myValue)
			if x.value >= myValue {
				why = fmt.Sprintf("lowest value left on the card %.2f (%s %.2f has a request waiting)", x.value, r.dep.Model, myValue)
			}
			due := trig == TriggerRequest && v.active > 0 && !c.outranks(r.dep.Model, v, time.Time{}) && c.slotDue(r, v, now)
			if c.lowHolds(r) {
				why = fmt.Sprintf("%s's turn as a %s model that waited %v for the card (due after %v); it keeps the card %v, then %s's share goes back",
					r.dep.Model, c.turnKind(r), now.Sub(r.waitSince).Round(time.Second), c.turnWait(r), c.lowerSlot(r), v.dep.Model)
			} else if due {
				why = fmt.Sprintf("%s waited %v for the card, %s had its turn (%v)", r.dep.Model, now.Sub(r.waitSince).Round(time.Second),
					v.dep.Model, now.Sub(v.resident).Round(time.Second))
				c.serializeForTurn(r, v, now)
			}
			// A turn that came due is what takes the card, not the
			// request alone.
			stopTrig := trig
			if trig == TriggerRequest && (c.lowHolds(r) || due) {
				stopTrig = TriggerTurn
			}
			c.stop(v, x.op, stopTrig, r.dep.Model, in, now, "%s %s: %s; frees %s, %s needs %s (%s short)",
				verb, v.dep.Model, why, gib(x.freed), r.dep.Model, gib(claim), gib(need))
			if v.dep.Residency == Warm && x.op == ActSleep && trig == TriggerRequest && r.dep.Residency == OnDemand {
				v.lentTo = r.dep.Model
			}
			if trig == TriggerRequest {
				c.serializeIfThrashing(r, v, now)
			}
		}
		c.earmark += extra
		return false
	}
	if trig == TriggerForecast || r.rejected || r.active == 0 {
		return false
	}
	if most := c.mostFree(r); claim > most {
		r.rejected = true
		c.emit(ActReject, r, "", trig, "", Inputs{Bytes: claim, Free: most}, now,
			"reject %s: needs %s, at most %s of card %s can be made free for it (usable %s)",
			r.dep.Model, gib(claim), gib(most), c.cfg.Card, gib(c.usable))
	}
	return false
}

func why(trig Trigger, r *replica) string {
	switch trig {
	case TriggerRequest:
		return count(r.active, "request") + " waiting"
	case TriggerForecast:
		return "arrival predicted"
	}
	switch {
	case r.opLoad:
		return askedBy(r.opBy)
	case trig == TriggerWatchdog:
		return fmt.Sprintf("%s model is started again after its engine failed (%s)", r.dep.Residency, count(r.failures, "failure"))
	case trig == TriggerFailover:
		return fmt.Sprintf("%s model placed here after its node or card was lost", r.dep.Residency)
	}
	return fmt.Sprintf("%s model is kept on the card", r.dep.Residency)
}

// mostFree is the most memory that could ever be made free for r: usable
// minus what others keep whatever happens (pinned shares, warm shares for an
// owner, warm residuals for a borrower).
func (c *Controller) mostFree(r *replica) int64 {
	var keep int64
	for i := range c.reps {
		x := &c.reps[i]
		if x == r || x.removed {
			continue
		}
		switch x.dep.Residency {
		case Pinned:
			keep += max(x.dep.Share, c.cost(x))
		case Warm:
			if r.dep.Residency == OnDemand && x.dep.CanSleep {
				keep += c.residual(x)
			} else {
				keep += max(x.dep.Share, c.cost(x))
			}
		}
	}
	return c.usable - keep
}

type candidate struct {
	idx    int
	op     ActionKind
	freed  int64
	reload time.Duration
	value  float64
}

// protection is how long a newly resident x is kept from equal or lower
// priority demand by b: the minimum residency (at least twice its load
// time), or a time slot when x and b are serialized.
func (c *Controller) protection(x, b *replica) time.Duration {
	p := max(c.cfg.MinResidency, 2*c.loadTime(x))
	if len(c.serialized) == 0 {
		return p
	}
	if _, ok := c.serialized[pairOf(x.dep.Model, b.dep.Model)]; ok {
		p = max(p, c.slot(x))
	}
	return p
}

// protectionFrom is protection against op: a sleep costs x a wake, not a
// load, so against it x is kept the minimum residency (or its slot once
// serialized with b), not twice its load time.
func (c *Controller) protectionFrom(x, b *replica, op ActionKind) time.Duration {
	p := c.protection(x, b)
	if op != ActSleep || x.dep.Residency != OnDemand {
		return p
	}
	q := min(c.cfg.MinResidency, max(sleepProtectFloor, c.slot(x)))
	if len(c.serialized) > 0 {
		if _, ok := c.serialized[pairOf(x.dep.Model, b.dep.Model)]; ok {
			q = max(q, c.slot(x))
		}
	}
	return min(p, q)
}

// sleepProtectFloor is the least an onDemand model is kept from a sleep.
const sleepProtectFloor = 5 * time.Second

// slot is a serialized model's turn on the card: SlotFactor swaps, where a
// swap brings it back from where it is sent (asleep or cold).
func (c *Controller) slot(x *replica) time.Duration {
	return time.Duration(c.cfg.SlotFactor * float64(c.wakeTime(x)))
}

func (c *Controller) hostUsed() int64 {
	var used int64
	for i := range c.reps {
		r := &c.reps[i]
		if r.state == Sleeping || r.pending == ActSleep {
			used += c.hostBytes(r)
		}
	}
	return used
}

// victims picks what to sleep or evict to free need bytes for b, lowest
// value per GiB first: onDemand models (asleep before unloaded, where the
// engine sleeps and host RAM allows), idle warm models put to sleep to lend
// their share (for an onDemand b), and, for a reserved owner taking its
// share back, every borrower. Busy engines are drained only for a request
// that outranks them (I3); a prewarm takes only idle models of lower value.
// It returns the chosen candidates (indices into c.cands) when they free
// enough, and nothing otherwise.
func (c *Controller) victims(b *replica, trig Trigger, need int64, bValue float64, now time.Time) ([]int, bool) {
	c.cands = c.cands[:0]
	reclaim := b.dep.Residency.Reserves() && !b.removed
	// b in its lower-class turn takes memory as a higher class would,
	// but cancels no load or wake (lowturn.go).
	turn := c.lowHolds(b) && trig == TriggerRequest
	var host int64
	if c.cfg.HostMemory > 0 {
		host = c.hostUsed()
	}
	for i := range c.reps {
		x := &c.reps[i]
		// Nothing takes a turn's holder's memory, but a reserved owner
		// asked for that does not yield to the turn (it yielded to one
		// already in this wait, lowturn.go) takes its share back: no turn
		// makes the card promise more than it holds. A forecast does not.
		if x == b || x.removed || x.pending != 0 || x.state == Cold || x.state == Failed || x.state == Draining ||
			c.lowHolds(x) && !(reclaim && (b.active > 0 || trig == TriggerOwnerReturn)) {
			continue
		}
		// A best-effort model's demand never takes a protected model's
		// memory (besteffort.go).
		if c.shields(b, x) {
			continue
		}
		// Requests waiting for a sleeping engine wait at the gateway, not on
		// the engine: only a reserved owner taking its share back evicts it.
		busy := x.active > 0 && !skipI3
		// A request, or a reserved model placed by the operator, may drain;
		// a forecast never.
		entitled := trig == TriggerRequest || reclaim && trig.entitles()
		outranked := b.dep.Priority > x.dep.Priority || turn || c.beOutranks(b, x)
		// A sleeping engine's waiting requests wait at the gateway: a
		// reserved owner or a request of a higher class may unload it
		// (they then wait for its load instead of its wake).
		if busy && (x.state == Sleeping && !reclaim && !(outranked && trig == TriggerRequest) || !entitled) {
			continue
		}
		// b's turn is due: it may drain x, of its own class (turns.go).
		due := busy && trig == TriggerRequest && (c.slotDue(b, x, now) || turn)
		switch x.dep.Residency {
		case Pinned:
			continue
		case Warm:
			if reclaim || c.pinnedOnly || x.state != Resident || !x.dep.CanSleep || x.active > 0 && !due {
				continue
			}
		case OnDemand:
			// A load or wake in progress is cancelled only for a reserved
			// owner's return or for a request of a higher class.
			// Once per ThrashWindow: a load cut short before is left to
			// finish (turns.go).
			if (x.state == Loading || x.state == Waking) && !reclaim && (turn || !(outranked && trig == TriggerRequest && !c.cutWithin(x, now))) {
				continue
			}
			// A turn holds against an owner of x's class or lower that
			// yields to it; a lower class gets none, and an owner past
			// its cap yields no more (turns.go).
			if _, ok := c.inTurn(x, now); ok && reclaim && x.dep.Priority >= b.dep.Priority && b.yielding {
				continue
			}
		}
		if busy && !outranked && !reclaim && !due {
			continue
		}
		cand := candidate{idx: i}
		switch {
		case x.state == Sleeping:
			cand.op, cand.freed, cand.reload = ActEvict, c.cost(x), c.loadTime(x)
		case x.dep.Residency == Warm:
			cand.op, cand.freed, cand.reload = ActSleep, c.claim(x, false)-c.residual(x), c.wakeTime(x)
		case x.state == Resident && x.dep.CanSleep && (c.cfg.HostMemory == 0 || host+c.hostBytes(x) <= c.cfg.HostMemory):
			cand.op, cand.freed, cand.reload = ActSleep, c.cost(x)-c.residual(x), c.wakeTime(x)
		default:
			cand.op, cand.freed, cand.reload = ActEvict, c.cost(x), c.loadTime(x)
		}
		// A newly resident x is kept from lower-class demand for its
		// protection too (a sleep costs it a wake): without it, batch work
		// put the onDemand models of home at 32 GiB to sleep between their
		// requests and shared the card's compute with the chat (89.9% →
		// 90.2% within SLO with it; examples/serve/README.md).
		if x.state == Resident && now.Sub(x.resident) < c.protectionFrom(x, b, cand.op) && !outranked && !reclaim {
			continue
		}
		if cand.freed <= 0 {
			continue
		}
		// An onDemand model in the first burstHold of a spell keeps the
		// card against its class while its requests keep arriving
		// (burst.go).
		if !outranked && !reclaim && c.burstHolds(x, b, now) {
			continue
		}
		// Lower-class demand takes a higher class's memory only when x is
		// not expected back during its turn, and does not send x cold while
		// x is protected from b (lend.go).
		// A protect decision holds against a turn too (lend.go).
		if turn && cand.op == ActEvict && c.isProtected(x, b, now) {
			continue
		}
		if b.dep.Priority < x.dep.Priority && !reclaim && !turn &&
			(cand.op == ActEvict && c.isProtected(x, b, now) || !c.mayDisplace(b, x, cand.reload, now)) {
			continue
		}
		cand.value = c.value(x, cand.reload, cand.freed)
		if busy {
			// Draining x cuts its running work short or makes b wait for
			// it: idle models that only pay a reload go first. Cancelling
			// x's load or wake makes its waiting requests wait its whole
			// reload again.
			cut := c.drainDeadline(x, b.dep.Model)
			if x.state == Loading || x.state == Waking {
				cut = cand.reload
			}
			cand.value += priorityWeight(x.dep.Priority) * float64(x.active) * cut.Seconds() / (float64(cand.freed) / (1 << 30))
		}
		if trig == TriggerForecast && cand.value >= bValue {
			continue
		}
		c.cands = append(c.cands, cand)
	}
	order := make([]int, len(c.cands))
	for i := range order {
		order[i] = i
	}
	// For a protected model, best-effort models make room first
	// (besteffort.go): the card keeps the protected set whole.
	beFirst := c.be.on && c.protects(b)
	slices.SortFunc(order, func(p, q int) int {
		x, y := &c.cands[p], &c.cands[q]
		if beFirst {
			if d := cmp.Compare(b2i(c.protects(&c.reps[x.idx])), b2i(c.protects(&c.reps[y.idx]))); d != 0 {
				return d
			}
		}
		return cmp.Or(cmp.Compare(x.value, y.value),
			c.reps[x.idx].lastUse.Compare(c.reps[y.idx].lastUse),
			cmp.Compare(c.reps[x.idx].dep.Model, c.reps[y.idx].dep.Model))
	})
	var freed int64
	for n, k := range order {
		freed += c.cands[k].freed
		if freed >= need {
			return c.trim(order[:n+1], freed, need), true
		}
	}
	return nil, false
}

// trim drops from a chosen set the candidates it does not need: the last
// one chosen made it enough, which can leave cheaper ones taken before it
// unnecessary (a small sleep taken, then a large one that alone frees
// enough). The most valuable of those go back first.
func (c *Controller) trim(chosen []int, freed, need int64) []int {
	for i := len(chosen) - 2; i >= 0; i-- {
		if f := c.cands[chosen[i]].freed; freed-f >= need {
			freed -= f
			chosen = append(chosen[:i], chosen[i+1:]...)
		}
	}
	return chosen
}

// serializeIfThrashing records a Serialize decision when b and x have
// evicted each other ThrashCount times within the window: from then on each
// keeps the card for a time slot (see protection).
func (c *Controller) serializeIfThrashing(b, x *replica, now time.Time) {
	key := pairOf(b.dep.Model, x.dep.Model)
	if _, ok := c.serialized[key]; ok {
		return
	}
	// This eviction (x for b) plus those in the window, in both directions.
	n, back := 1, 0
	for _, e := range c.evictions {
		if pairOf(e.victim, e.by) == key && now.Sub(e.at) <= c.cfg.ThrashWindow {
			n++
			if e.victim == b.dep.Model {
				back++
			}
		}
	}
	if n < c.cfg.ThrashCount || back == 0 {
		return
	}
	slot := max(c.slot(x), c.cfg.MinResidency)
	c.emit(ActSerialize, b, x.dep.Model, TriggerPressure, x.dep.Model, Inputs{}, now,
		"serialize %s and %s: evicted each other %d times in %v; each keeps the card at least %v per turn",
		b.dep.Model, x.dep.Model, n, c.cfg.ThrashWindow, slot)
}

// prewarms loads or wakes models whose next request is predicted within
// their reload time, into free memory or memory of lower value; never a
// model an operator unloaded, until a request for it arrives.
func (c *Controller) prewarms(now time.Time) {
	for i := range c.reps {
		r := &c.reps[i]
		if r.removed || r.pending != 0 || r.active > 0 || r.dep.Residency == Pinned || r.opHeld {
			continue
		}
		if r.state != Cold && r.state != Sleeping {
			continue
		}
		at, tol, ok := r.fc.next()
		if !ok {
			continue
		}
		lead := c.reload(r) + c.cfg.PrewarmMargin
		if now.Before(at.Add(-lead)) || now.After(at.Add(tol)) {
			continue
		}
		c.admit(r, TriggerForecast, true, now)
	}
}

// idle demotes models nobody used for a while: an onDemand or warm model to
// sleep (or an onDemand one unloaded where its engine cannot sleep), an
// onDemand model asleep too long unloaded. A model predicted back soon
// stays. On a pinned-only card, idle onDemand models leave.
func (c *Controller) idle(now time.Time) {
	for i := range c.reps {
		r := &c.reps[i]
		if r.removed || r.pending != 0 || r.active > 0 || r.dep.Residency == Pinned || c.keeps(r) || c.holdsAll(r) {
			continue
		}
		if c.pinnedOnly {
			if r.dep.Residency == OnDemand && (r.state == Resident || r.state == Sleeping) {
				c.stop(r, ActEvict, TriggerPressure, "", Inputs{Bytes: c.cost(r)}, now,
					"evict %s: card %s is pinned-only after a ledger violation; frees %s", r.dep.Model, c.cfg.Card, gib(c.cost(r)))
			}
			continue
		}
		since := r.lastUse
		idleSleep, idleUnload, limit, keep := c.idleLimits(r)
		if keep {
			continue
		}
		switch r.state {
		case Resident:
			if r.resident.After(since) {
				since = r.resident
			}
			if now.Sub(since) < idleSleep || !r.keepSet && (now.Sub(r.resident) < max(c.cfg.MinResidency, 2*c.loadTime(r)) ||
				r.fc.expectedWithin(now, idleSleep)) {
				continue
			}
			idle := now.Sub(since)
			switch {
			case r.dep.CanSleep && (c.cfg.HostMemory == 0 || c.hostUsed()+c.hostBytes(r) <= c.cfg.HostMemory):
				freed := c.claim(r, false) - c.residual(r)
				c.stop(r, ActSleep, TriggerIdle, "", Inputs{Bytes: freed, Reload: c.wakeTime(r)}, now,
					"sleep %s: idle %s ≥ %s%s; frees %s, %s", r.dep.Model, dur(idle), dur(idleSleep), limit, gib(freed), wakeIn(c.wakeTime(r)))
			case r.dep.Residency == OnDemand:
				c.stop(r, ActUnload, TriggerIdle, "", Inputs{Bytes: c.cost(r), Reload: c.loadTime(r)}, now,
					"unload %s: idle %s ≥ %s%s and its engine cannot sleep; frees %s", r.dep.Model, dur(idle), dur(idleSleep), limit, gib(c.cost(r)))
			}
		case Sleeping:
			if r.dep.Residency != OnDemand || now.Sub(r.since) < idleUnload || !r.keepSet && r.fc.expectedWithin(now, idleUnload) {
				continue
			}
			c.stop(r, ActUnload, TriggerIdle, "", Inputs{Bytes: c.cost(r), Reload: c.loadTime(r)}, now,
				"unload %s: asleep %s ≥ %s%s; frees %s", r.dep.Model, dur(now.Sub(r.since)), dur(idleUnload), limit, gib(c.cost(r)))
		}
	}
}

// idleLimits are r's idle timeouts and what sets them (for the reasons):
// the card's, its deployment's spec.idle, or its last request's
// keep_alive, which replaces both (keepalive.go): keep is true for a
// negative keep_alive, which keeps the model, and the controller's own
// guards (least residency, a forecast arrival) give way to what the
// request asked.
func (c *Controller) idleLimits(r *replica) (idleSleep, idleUnload time.Duration, limit string, keep bool) {
	idleSleep, idleUnload = c.cfg.IdleSleep, c.cfg.IdleUnload
	if r.dep.IdleSleep > 0 {
		idleSleep, limit = r.dep.IdleSleep, " (its deployment's spec.idle)"
	}
	if r.dep.IdleUnload > 0 {
		idleUnload, limit = r.dep.IdleUnload, " (its deployment's spec.idle)"
	}
	if r.keepSet {
		if r.keep < 0 {
			return 0, 0, "", true
		}
		idleSleep, idleUnload, limit = r.keep, r.keep, " (its last request's keep_alive)"
	}
	return idleSleep, idleUnload, limit, false
}

// next is what the controller does to r next without new requests, and
// when at the earliest: the end of its lower-class turn, an idle sleep or
// unload (as idle decides it, less a forecast arrival that may delay it).
// 0: nothing due (a pinned model, one with requests, a keep_alive < 0).
func (c *Controller) next(r *replica, now time.Time) (ActionKind, time.Time, string) {
	if c.lowHolds(r) && r.state == Resident {
		return ActEvict, c.lowEnd(r), "turn ends"
	}
	if r.removed || r.pending != 0 || r.active > 0 || r.dep.Residency == Pinned || c.holdsAll(r) {
		return 0, time.Time{}, ""
	}
	idleSleep, idleUnload, _, keep := c.idleLimits(r)
	if keep {
		return 0, time.Time{}, ""
	}
	switch r.state {
	case Resident:
		at := maxTime(r.lastUse, r.resident).Add(idleSleep)
		what := "idle"
		if r.keepSet {
			what = "keep_alive expires"
		} else {
			at = maxTime(at, r.resident.Add(max(c.cfg.MinResidency, 2*c.loadTime(r))))
		}
		switch {
		case r.dep.CanSleep:
			return ActSleep, maxTime(at, now), what
		case r.dep.Residency == OnDemand:
			return ActUnload, maxTime(at, now), what
		}
	case Sleeping:
		if r.dep.Residency == OnDemand {
			what := "idle"
			if r.keepSet {
				what = "keep_alive expires"
			}
			return ActUnload, maxTime(r.since.Add(idleUnload), now), what
		}
	}
	return 0, time.Time{}, ""
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
