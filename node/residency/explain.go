package residency

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"
)

// WaitExpired says why requests for m waited past the gateway's wait for
// it, in one cause with its numbers (loading, with the time left; asleep
// or draining; its last load failed, with the retry; or the card full,
// with the shares that hold it), and records it as a reject decision
// (trigger request). ok is false for a model this controller does not
// hold.
func (c *Controller) WaitExpired(m ModelID, waited time.Duration) (reason string, ok bool) {
	r := c.rep(m)
	if r == nil {
		return "", false
	}
	now := c.clock.Now()
	c.sumsOK = false
	op, _, claim := c.target(r)
	othersNow, _ := c.others(r)
	free := c.usable - othersNow - c.earmark
	in := Inputs{Bytes: claim, Free: free, Reload: c.reload(r), Active: r.active, Rate: r.rate}
	var cause string
	switch r.state {
	case Loading, Waking:
		took := c.loadTime(r)
		what := "loading"
		if r.state == Waking {
			took, what = c.wakeTime(r), "waking"
		}
		left := took - now.Sub(r.opStart)
		if took > 0 && left > 0 {
			cause = fmt.Sprintf("%s on card %s, about %s left of %s", what, c.cfg.Card, dur(left), dur(took))
		} else {
			cause = fmt.Sprintf("%s on card %s for %s, past its expected %s", what, c.cfg.Card, dur(now.Sub(r.opStart)), dur(took))
		}
	case Draining:
		cause = fmt.Sprintf("being taken off card %s (%s)", c.cfg.Card, r.pending)
	case Failed:
		cause = fmt.Sprintf("its last load on card %s failed; it is tried again in %s", c.cfg.Card, dur(r.retryAt.Sub(now)))
	case Resident:
		cause = fmt.Sprintf("resident on card %s with %s running; the wait was for its engine to answer", c.cfg.Card, count(r.active, "request"))
	default:
		holders := c.holders(r)
		switch {
		case claim > free:
			cause = fmt.Sprintf("card %s is full: %s needs %s for its %s, %s free; held by %s", c.cfg.Card, m, gib(claim), op, gib(max(free, 0)), holders)
		default:
			cause = fmt.Sprintf("cold on card %s, %s fits (%s needed, %s free) but no load was started; held by %s", c.cfg.Card, m, gib(claim), gib(free), holders)
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
