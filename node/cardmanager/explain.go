package cardmanager

import (
	"time"

	"github.com/gpuplane/gpuplane/node/residency"
)

// rejectEvery is how often a reject decision is recorded for one replica:
// requests that waited together and expire together share one.
const rejectEvery = 5 * time.Second

// WaitExpired says why a request that waited wait for the replica at the
// gateway was not served, in one cause with its numbers, and records it
// as the card's reject decision (at most one per replica every few
// seconds: the requests that expire together share it). "": the replica is
// not one this node's controllers hold.
func (m *Manager) WaitExpired(model string, index uint32, waited time.Duration) string {
	k := rkey{model, index}
	ans := make(chan string, 1)
	m.post(func() {
		r := m.reps[k]
		if r == nil {
			ans <- ""
			return
		}
		if !r.rejected.IsZero() && time.Since(r.rejected) < rejectEvery {
			ans <- r.rejectReason
			return
		}
		c := m.ctrls[r.card]
		if c == nil {
			ans <- ""
			return
		}
		reason, ok := c.ctrl.WaitExpired(k.id(), waited)
		if !ok {
			ans <- ""
			return
		}
		r.rejected, r.rejectReason = time.Now(), reason
		if j := m.opts.Journal; j != nil {
			c.seen = j.Sync(c.ctrl, c.seen)
		}
		m.log.Info("residency decision", "card", c.index, "action", "reject", "model", k.id(), "trigger", "request", "reason", reason)
		ans <- reason
	})
	select {
	case s := <-ans:
		return s
	case <-time.After(5 * time.Second):
		return "" // the node's loop is stopping or stuck: the plain answer
	}
}

// CardBy is when the replica, its requests waiting for the card, gets it
// at the latest, as its controller promises (residency.Controller.CardBy,
// what `residency plan` shows); ok is false where it promises nothing.
// The gateway keeps background requests waiting until then.
func (m *Manager) CardBy(model string, index uint32) (by time.Time, ok bool) {
	k := rkey{model, index}
	type answer struct {
		by time.Time
		ok bool
	}
	ans := make(chan answer, 1)
	m.post(func() {
		r := m.reps[k]
		if r == nil || m.ctrls[r.card] == nil {
			ans <- answer{}
			return
		}
		by, ok := m.ctrls[r.card].ctrl.CardBy(k.id())
		ans <- answer{by, ok}
	})
	select {
	case a := <-ans:
		return a.by, a.ok
	case <-time.After(5 * time.Second):
		return time.Time{}, false // the node's loop is stopping or stuck
	}
}

// KeepAlive passes a request's keep_alive (Ollama's meaning: how long to
// keep the model loaded after it; 0 unloads once idle, negative keeps) to
// the replica's controller as the request's hint (residency.KeepAlive).
// The gateway calls it after Demand for the same request.
func (m *Manager) KeepAlive(model string, index uint32, d time.Duration) {
	k := rkey{model, index}
	m.post(func() { m.request(k, residency.KeepAlive{Model: k.id(), For: d}) })
}
