package residency

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// OperatorLoad asks for Model on its card now, as `ollama run` preloads a
// model: it is loaded (or woken) at once where the card can hold it beside
// what it promised the others; otherwise the event is refused, naming what
// holds the card, and nothing changes. Once loaded it follows the card's
// idle timeouts like a model whose last request just finished.
type OperatorLoad struct{ Model ModelID }

// OperatorUnload takes Model off its card now, as `ollama stop` does: an
// onDemand model is unloaded, a warm one put to sleep (unloaded where its
// engine cannot sleep; its share stays reserved). A pinned model is
// refused. Requests running on it are drained first; a later request loads
// it again as usual.
type OperatorUnload struct{ Model ModelID }

func (OperatorLoad) isEvent()   {}
func (OperatorUnload) isEvent() {}

// operatorCheck returns m's replica, or why an operator's load or unload
// of m cannot be done on this card.
func (c *Controller) operatorCheck(m ModelID, load bool) (*replica, error) {
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
	if free := c.usable - othersNow; claim > free {
		return nil, fmt.Errorf("card %s cannot hold %s now: it needs %s, %s is free of %s usable; held by %s",
			c.cfg.Card, m, gib(claim), gib(max(free, 0)), gib(c.usable), c.cardHolders(r))
	}
	return r, nil
}

// cardHolders names what claims the card's memory besides r, largest first.
func (c *Controller) cardHolders(r *replica) string {
	type held struct {
		m     ModelID
		bytes int64
		what  string
	}
	var hs []held
	for i := range c.reps {
		x := &c.reps[i]
		if x == r {
			continue
		}
		if b := c.claim(x, false); b > 0 {
			hs = append(hs, held{x.dep.Model, b, x.dep.Residency.String() + ", " + x.state.String()})
		}
	}
	if len(hs) == 0 {
		return "nothing else"
	}
	slices.SortFunc(hs, func(a, b held) int { return int(b.bytes>>20 - a.bytes>>20) })
	parts := make([]string, len(hs))
	for i, h := range hs {
		parts[i] = fmt.Sprintf("%s %s (%s)", h.m, gib(h.bytes), h.what)
	}
	return strings.Join(parts, ", ")
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
		op := ActUnload
		if r.dep.Residency == Warm && r.dep.CanSleep {
			op = ActSleep
		}
		switch {
		case r.state == Cold || r.state == Failed:
			continue
		case r.state == Sleeping && (op == ActSleep || r.dep.Residency == Warm):
			continue
		}
		freed := c.cost(r)
		if op == ActSleep {
			freed = c.claim(r, false) - c.residual(r)
		}
		c.stop(r, op, TriggerOperator, "", Inputs{Bytes: freed, Reload: c.reload(r)}, now,
			"%s %s: asked by the operator; frees %s", op, r.dep.Model, gib(freed))
	}
}
