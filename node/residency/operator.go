package residency

import (
	"cmp"
	"fmt"
	"slices"
	"time"
)

// OperatorLoad asks for Model on its card now, as `ollama run` preloads a
// model: it is loaded (or woken) at once where the card can hold it beside
// what it promised the others; otherwise the event is refused, naming what
// holds the card, and nothing changes. Once loaded it follows the card's
// idle timeouts like a model whose last request just finished. By is who
// asked (an API caller), named in the reasons; empty: not known.
type OperatorLoad struct {
	Model ModelID
	By    string
}

// OperatorUnload takes Model off its card now, as `ollama stop` does: an
// onDemand model is unloaded, a warm one put to sleep (unloaded where its
// engine cannot sleep; its share stays reserved). A pinned model is
// refused. Requests running on it are drained first; a later request loads
// it again as usual, but an arrival forecast does not (no prewarm or wake)
// until a request comes or an operator loads it. By is who asked, as in
// OperatorLoad.
type OperatorUnload struct {
	Model ModelID
	By    string
}

// askedBy is the reasons' "asked by the operator", naming who when known.
func askedBy(by string) string {
	if by == "" {
		return "asked by the operator"
	}
	return fmt.Sprintf("asked by the operator (%s)", by)
}

func (OperatorLoad) isEvent()   {}
func (OperatorUnload) isEvent() {}

// operatorCheck returns m's replica, or why an operator's load or unload
// of m cannot be done on this card.
func (c *Controller) operatorCheck(m ModelID, load bool, by string) (*replica, error) {
	r := c.rep(m)
	if r == nil || r.removed {
		return nil, fmt.Errorf("model %s is not on card %s", m, c.cfg.Card)
	}
	if c.cfg.Mode == Advise {
		return nil, fmt.Errorf("card %s runs its residency controller in advise mode: it only records advice, so %s is not loaded or unloaded by hand", c.cfg.Card, m)
	}
	if !load {
		if r.dep.Residency == Pinned {
			return nil, fmt.Errorf("model %s is pinned: it stays on card %s while deployed (change its spec.residency to warm or onDemand to unload it)", m, c.cfg.Card)
		}
		return r, nil
	}
	if c.pinnedOnly && r.dep.Residency == OnDemand {
		return nil, fmt.Errorf("card %s is pinned-only after a ledger violation until the operator clears it: onDemand %s is not loaded", c.cfg.Card, m)
	}
	switch r.state {
	case Resident, Loading, Waking:
		return r, nil
	}
	if r.pending != 0 || r.state == Draining {
		return nil, fmt.Errorf("model %s is being taken off card %s; ask again once it is %s", m, c.cfg.Card, Cold)
	}
	_, _, claim := c.target(r)
	othersNow, _ := c.others(r)
	free := c.usable - othersNow
	if claim <= free {
		return r, nil
	}
	// Idle onDemand models make room, as Ollama unloads idle models for
	// another: never a pinned or warm model, nor one with requests.
	vs, freed := c.operatorRoom(r, claim-free)
	if freed < claim-free {
		more := ""
		if freed > 0 {
			more = fmt.Sprintf("; unloading its idle onDemand models would free only %s", gib(freed))
		}
		return nil, fmt.Errorf("card %s cannot hold %s now: it needs %s, %s is free of %s usable; held by %s%s",
			c.cfg.Card, m, gib(claim), gib(max(free, 0)), gib(c.usable), c.holders(r), more)
	}
	for _, v := range vs {
		v.opUnload, v.opFor, v.opBy = true, m, by
	}
	return r, nil
}

// operatorRoom picks idle onDemand models whose unload frees need for r,
// the least valuable per GiB first (the largest among equals). It returns
// them and what they free.
func (c *Controller) operatorRoom(r *replica, need int64) ([]*replica, int64) {
	type cand struct {
		x     *replica
		freed int64
		value float64
	}
	var cs []cand
	for i := range c.reps {
		x := &c.reps[i]
		if x == r || x.removed || x.dep.Residency != OnDemand || x.active > 0 || x.pending != 0 || x.opUnload {
			continue
		}
		switch x.state {
		case Resident, Sleeping:
		default:
			continue
		}
		freed := c.cost(x)
		cs = append(cs, cand{x, freed, c.value(x, c.reload(x), freed)})
	}
	slices.SortFunc(cs, func(a, b cand) int {
		return cmp.Or(cmp.Compare(a.value, b.value), cmp.Compare(b.freed, a.freed), cmp.Compare(a.x.dep.Model, b.x.dep.Model))
	})
	var out []*replica
	var freed int64
	for _, k := range cs {
		if freed >= need {
			break
		}
		out = append(out, k.x)
		freed += k.freed
	}
	return out, freed
}

// operatorStops takes off the card the models an operator asked to unload.
func (c *Controller) operatorStops(now time.Time) {
	for i := range c.reps {
		r := &c.reps[i]
		if !r.opUnload {
			continue
		}
		r.opUnload = false
		if r.removed || r.pending != 0 || r.dep.Residency == Pinned {
			continue
		}
		forM := r.opFor
		r.opFor = ""
		op := ActUnload
		if r.dep.Residency == Warm && r.dep.CanSleep {
			op = ActSleep
		}
		if forM != "" {
			// Making room, the engine is stopped whole: a sleep would
			// keep its residual, which the room was counted without.
			op = ActEvict
		}
		switch {
		case r.state == Cold || r.state == Failed:
			continue
		case r.state == Sleeping && forM == "" && (op == ActSleep || r.dep.Residency == Warm):
			continue
		case forM != "" && r.active > 0:
			// A request arrived since: it is no longer idle.
			continue
		}
		freed := c.cost(r)
		if op == ActSleep {
			freed = c.claim(r, false) - c.residual(r)
		}
		in := Inputs{Bytes: freed, Reload: c.reload(r)}
		if forM != "" {
			in.Value = c.value(r, c.reload(r), freed)
			c.stop(r, op, TriggerOperator, forM, in, now,
				"%s %s: idle onDemand (value %.2f), makes room for %s, %s; frees %s",
				op, r.dep.Model, in.Value, forM, askedBy(r.opBy), gib(freed))
			continue
		}
		where := "unloaded"
		if op == ActSleep {
			where = "asleep"
		}
		c.stop(r, op, TriggerOperator, "", in, now,
			"%s %s: %s; frees %s; stays %s until a request for it arrives or the operator loads it (a forecast alone does not bring it back)",
			op, r.dep.Model, askedBy(r.opBy), gib(freed), where)
	}
}
