package residency

import "time"

// KeepAlive: the request that just arrived for Model (after its
// RequestArrived) asked to keep the model loaded For after it, Ollama's
// keep_alive: 0 takes it off the card once idle, negative keeps it. It
// replaces the card's idle timeouts for the model until a request without
// one arrives. It is a hint within the card's promises: a pinned model is
// never taken off, a warm one only sleeps (its share stays reserved), and
// a model kept alive is still evicted for a reserved owner's return or a
// model of higher value, as any idle one is.
type KeepAlive struct {
	Model ModelID
	For   time.Duration
}

func (KeepAlive) isEvent() {}

func (c *Controller) keepAlive(e KeepAlive) {
	if r := c.rep(e.Model); r != nil {
		r.keep, r.keepSet = e.For, true
	}
}
