package residency

import (
	"cmp"
	"slices"
	"time"
)

// PlanEntry is one model in the controller's plan.
type PlanEntry struct {
	Model     ModelID
	Residency Residency
	Priority  Priority
	State     State
	// Tier is gpu, host (asleep) or disk (cold).
	Tier string
	// Rate is the decayed arrival rate, requests per minute.
	Rate float64
	// NextRequest is the predicted time of the next request (zero until
	// two inter-arrival gaps were seen).
	NextRequest time.Time
	// Value is what keeping the model costs per GiB if it left the card
	// now (see DESIGN.md); Cost what it holds.
	Value float64
	Cost  int64
	// Action is what the controller would do now (ActionKind 0: nothing),
	// with its trigger and reason.
	Action  ActionKind
	Trigger Trigger
	Reason  string
	// SlotBy is, for a model with requests waiting for the card, when it
	// gets its turn at the latest (docs/residency.md, "No starvation");
	// zero when it is on the card, has no waiting requests, or a higher
	// class holds the card.
	SlotBy time.Time
	// BestEffort says why the model is best-effort, in numbers (empty: it
	// is protected, or the card holds every model; besteffort.go).
	BestEffort string
	// Wait is why the model's requests wait for the card, once they have
	// waited WaitNoted (wait.go); zero otherwise.
	Wait Wait
	// Active is the requests queued or running for it; HostBytes what it
	// keeps in host RAM while asleep.
	Active    int
	HostBytes int64
	// Next is what the controller does to it next without new requests
	// (a sleep or unload once idle, the end of a turn), at NextAt at the
	// earliest, because of NextWhy ("idle", "keep_alive expires", "turn
	// ends"); 0: nothing due.
	Next    ActionKind
	NextAt  time.Time
	NextWhy string
}

// Plan returns, per model, the controller's estimates and the action it
// would take now. It changes nothing, and works in advise mode.
func (c *Controller) Plan() []PlanEntry {
	now := c.clock.Now()
	c.snapshot = append(c.snapshot[:0], c.reps...)
	be := c.be
	acts := c.step(now)
	c.be = be
	slotBy := make(map[ModelID]time.Time)
	waits := make(map[ModelID]Wait)
	for i := range c.reps {
		r := &c.reps[i]
		if !r.slotBy.IsZero() {
			slotBy[r.dep.Model] = r.slotBy
		}
		if w, ok := c.waitOf(r, now); ok {
			waits[r.dep.Model] = w
		}
	}
	c.reps = append(c.reps[:0], c.snapshot...)
	for i := range c.reps {
		c.reps[i].rate = c.reps[i].fc.rate(now, c.cfg.RateHalfLife)
	}
	first := make(map[ModelID]Action, len(acts))
	for _, a := range acts {
		if _, ok := first[a.Model]; !ok {
			first[a.Model] = a
		}
	}
	out := make([]PlanEntry, 0, len(c.reps))
	for i := range c.reps {
		r := &c.reps[i]
		reload := c.loadTime(r)
		// A pinned model never sleeps: leaving the card would cost it a load.
		if r.dep.CanSleep && r.dep.Residency != Pinned && r.state != Cold && r.state != Failed {
			reload = c.wakeTime(r)
		}
		bytes := c.cost(r)
		if bytes == 0 {
			bytes = c.footprint(r)
		}
		e := PlanEntry{Model: r.dep.Model, Residency: r.dep.Residency, Priority: r.dep.Priority, State: r.state,
			Tier: c.tier(r), Rate: r.fc.rate(now, c.cfg.RateHalfLife), Value: c.value(r, reload, bytes), Cost: c.cost(r)}
		e.NextRequest, _, _ = r.fc.next()
		e.Active = r.active
		if r.state == Sleeping {
			e.HostBytes = c.hostBytes(r)
		}
		e.Next, e.NextAt, e.NextWhy = c.next(r, now)
		e.SlotBy = slotBy[r.dep.Model]
		if c.bestEffort(r) {
			e.BestEffort = c.be.why[r.dep.Model]
		}
		if w, ok := waits[r.dep.Model]; ok {
			w.Text, w.Age = w.text(now), now.Sub(w.Since)
			if now.Sub(w.Since) >= WaitNoted {
				e.Wait = w
			}
			// What a waiting model waits for, with its bound, where the
			// plan has no action for it (docs/residency.md, "Why a
			// request waits").
			e.Reason = w.Text
		}
		if a, ok := first[r.dep.Model]; ok {
			e.Action, e.Trigger, e.Reason = a.Kind, a.Decision.Trigger, a.Decision.Reason
		}
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b PlanEntry) int { return cmp.Compare(a.Model, b.Model) })
	return out
}

// tier is where r's weights are: a sleep that discards them (vLLM's level
// 2, Ollama's keep_alive unload) leaves them on disk, not in host RAM.
func (c *Controller) tier(r *replica) string {
	if r.state == Sleeping && r.dep.SleepDiscards {
		return "disk"
	}
	return r.state.Tier()
}
