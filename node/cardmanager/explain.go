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
	// The node's loop stopping or stuck: "", the plain answer.
	reason, _ := askLoop(m, func() string {
		r := m.reps[k]
		if r == nil {
			return ""
		}
		if !r.rejected.IsZero() && time.Since(r.rejected) < rejectEvery {
			return r.rejectReason
		}
		c := m.ctrls[r.card]
		if c == nil {
			return ""
		}
		reason, ok := c.ctrl.WaitExpired(k.id(), waited)
		if !ok {
			return ""
		}
		r.rejected, r.rejectReason = time.Now(), reason
		if j := m.opts.Journal; j != nil {
			c.seen = j.Sync(c.ctrl, c.seen)
		}
		m.log.Info("residency decision", "card", c.index, "action", "reject", "model", k.id(), "trigger", "request", "reason", reason)
		return reason
	})
	return reason
}

// askLoop runs fn on the manager's loop, which owns the controllers, and
// returns its answer; ok is false when the loop did not answer within 5 s
// (stopping or stuck).
func askLoop[T any](m *Manager, fn func() T) (v T, ok bool) {
	ans := make(chan T, 1)
	m.post(func() { ans <- fn() })
	select {
	case v = <-ans:
		return v, true
	case <-time.After(5 * time.Second):
		return v, false
	}
}

// CardBy is when the replica, its requests waiting for the card, gets it
// at the latest, as its controller promises (residency.Controller.CardBy,
// what `residency plan` shows); ok is false where it promises nothing.
// The gateway keeps background requests waiting until then, and those of
// every class of a best-effort or yielding replica (BestEffort, Yielding).
func (m *Manager) CardBy(model string, index uint32) (by time.Time, ok bool) {
	k := rkey{model, index}
	type answer struct {
		by time.Time
		ok bool
	}
	a, _ := askLoop(m, func() answer {
		r := m.reps[k]
		if r == nil || m.ctrls[r.card] == nil {
			return answer{}
		}
		by, ok := m.ctrls[r.card].ctrl.CardBy(k.id())
		return answer{by, ok}
	})
	return a.by, a.ok
}

// BestEffort reports whether the replica's controller serves it
// best-effort now: its card cannot hold every model with demand and the
// replica is not in the protected set (residency.Controller.Protected).
// The gateway has its requests wait for the turn promised.
func (m *Manager) BestEffort(model string, index uint32) bool {
	k := rkey{model, index}
	be, _ := askLoop(m, func() bool {
		r := m.reps[k]
		if r == nil || m.ctrls[r.card] == nil {
			return false
		}
		return !m.ctrls[r.card].ctrl.Protected(k.id())
	})
	return be
}

// Yielding reports whether the replica waits because its controller has
// it yield its share of the card to another model's turn
// (residency.Controller.Yielding): the `serialize` decision promises its
// requests the card back by CardBy, and the gateway has them wait for it
// whatever their class.
func (m *Manager) Yielding(model string, index uint32) bool {
	k := rkey{model, index}
	y, _ := askLoop(m, func() bool {
		r := m.reps[k]
		if r == nil || m.ctrls[r.card] == nil {
			return false
		}
		return m.ctrls[r.card].ctrl.Yielding(k.id())
	})
	return y
}

// KeepAlive passes a request's keep_alive (Ollama's meaning: how long to
// keep the model loaded after it; 0 unloads once idle, negative keeps) to
// the replica's controller as the request's hint (residency.KeepAlive).
// The gateway calls it after Demand for the same request.
func (m *Manager) KeepAlive(model string, index uint32, d time.Duration) {
	k := rkey{model, index}
	m.post(func() { m.request(k, residency.KeepAlive{Model: k.id(), For: d}) })
}
