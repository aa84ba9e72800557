package residency

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"
)

// WaitExpired says why requests for m waited past the gateway's wait for
// it, in the one cause the plan shows for the wait (waitOf: loading, with
// the time spent of the time expected; a turn, with its bound; the card
// full, with the shares that hold it; ...), and records it as a reject
// decision (trigger request). ok is false for a model this controller
// does not hold.
func (c *Controller) WaitExpired(m ModelID, waited time.Duration) (reason string, ok bool) {
	r := c.rep(m)
	if r == nil {
		return "", false
	}
	now := c.clock.Now()
	c.sumsOK = false
	_, _, claim := c.target(r)
	othersNow, _ := c.others(r)
	free := c.usable - othersNow - c.earmark
	in := Inputs{Bytes: claim, Free: free, Reload: c.reload(r), Active: r.active, Rate: r.rate}
	cause := fmt.Sprintf("resident on card %s with %s running; the wait was for its engine to answer", c.cfg.Card, count(r.active, "request"))
	if w, ok := c.waitOf(r, now); ok {
		cause = w.Cause
		if !w.By.IsZero() {
			cause += fmt.Sprintf("; gets the card by %s", w.By.Format(time.TimeOnly))
		}
	}
	reason = fmt.Sprintf("reject %s: waited %s for it: %s", m, dur(waited), cause)
	c.record(Decision{Time: now, Card: c.cfg.Card, Action: ActReject, Model: m, Trigger: TriggerRequest, Inputs: in,
		Reason: reason, Advised: c.cfg.Mode == Advise})
	return reason, true
}

// holders names the models that hold the card's memory, besides r, the
// largest first, each with its class, state and claim: "chat/0 (onDemand,
// Resident, 8.0Gi), embed/0 (warm, reserved, 2.0Gi)". A 503's cause and an
// operator's refused load both quote it.
func (c *Controller) holders(r *replica) string {
	type held struct {
		m     ModelID
		what  string
		bytes int64
	}
	var hs []held
	for i := range c.reps {
		x := &c.reps[i]
		if x == r {
			continue
		}
		if b := c.claim(x, false); b > 0 {
			what := x.dep.Residency.String() + ", " + x.state.String()
			if x.state == Cold && x.dep.Residency.Reserves() {
				what = x.dep.Residency.String() + ", reserved"
			}
			hs = append(hs, held{x.dep.Model, what, b})
		}
	}
	if len(hs) == 0 {
		return "nothing"
	}
	slices.SortFunc(hs, func(a, b held) int { return cmp.Or(cmp.Compare(b.bytes, a.bytes), cmp.Compare(a.m, b.m)) })
	parts := make([]string, len(hs))
	for i, h := range hs {
		parts[i] = fmt.Sprintf("%s (%s, %s)", h.m, h.what, gib(h.bytes))
	}
	return strings.Join(parts, ", ")
}
