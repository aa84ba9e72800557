package cardmanager

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/gpuplane/gpuplane/node/engine"
	"github.com/gpuplane/gpuplane/node/residency"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// A vLLM engine measures its card's free memory while it starts: it
// charges every change to itself until its KV cache is allocated, so a
// neighbour that frees memory meanwhile fails its start ("Error in memory
// profiling") and one that takes memory shrinks its KV cache or fails it
// ("No available memory for the cache blocks"); its sleep asserts that
// free memory did not fall while it offloaded ("Memory usage increased
// after sleeping."). So no action of the card's controller changes the
// card's memory (a load, prewarm, wake, sleep or unload of another
// replica) while a vLLM engine on it starts (awaitSettled). Its sleeps
// run on the card's worker (cardCtrl.work), one operation at a time, so
// nothing of the controller's runs beside them either.

// awaitSettled waits, on c's worker, until no vLLM engine on c other than
// k's is starting, before action a of k changes the card's memory. While
// it waits the plan says why on k's line and the decision log has the
// wait, once.
func (m *Manager) awaitSettled(c *cardCtrl, k rkey, a residency.Action) error {
	poll := time.NewTicker(50 * time.Millisecond)
	defer poll.Stop()
	said := false
	defer func() {
		if said {
			m.post(func() {
				delete(c.holds, a.Model)
				m.publishCard(c)
			})
		}
	}()
	for {
		ans := make(chan []string, 1)
		m.post(func() { ans <- m.settling(c, k) })
		var starting []string
		select {
		case starting = <-ans:
		case <-m.ctx.Done():
			return m.ctx.Err()
		}
		if len(starting) == 0 {
			return nil
		}
		if !said {
			said = true
			why := fmt.Sprintf("waits: %s of %s would change card %d's memory while %s profiles it at start (vLLM charges every change of free memory to itself until its KV cache is allocated)",
				a.Kind, a.Model, c.index, strings.Join(starting, ", "))
			m.log.Info("residency: action waits for a vLLM start on its card", "replica", k.id(), "card", c.index,
				"action", a.Kind, "starting", strings.Join(starting, ", "))
			m.post(func() {
				c.holds[a.Model] = why
				if j := m.opts.Journal; j != nil {
					d := a.Decision
					d.Time, d.Card, d.Action, d.Model, d.Reason = m.clock.Now(), c.ctrl.Ledger().Card, a.Kind, a.Model, why
					j.Record(d)
				}
				m.publishCard(c)
			})
		}
		select {
		case <-poll.C:
		case <-m.ctx.Done():
			return m.ctx.Err()
		}
	}
}

// settling names the vLLM engines on c, other than k's, that are starting:
// one its executor reports Starting, or one this manager started whose
// start the executor has not reported done.
func (m *Manager) settling(c *cardCtrl, k rkey) []string {
	if m.ctrls[c.index] != c {
		return nil // the card's controller is gone, and its work with it
	}
	var out []string
	for _, ok := range sortedKeys(m.reps) {
		r := m.reps[ok]
		if ok == k || r.card != c.index || r.kind != engine.KindVLLM {
			continue
		}
		if r.profiling || m.engines[ok].state == pb.ReplicaState_REPLICA_STATE_STARTING {
			out = append(out, string(ok.id()))
		}
	}
	return out
}

// sleepHolding puts k's engine to sleep; a vLLM engine's sleep holds the
// card against engine starts (the executor's, a pinned replica's
// included) until it is done: vLLM asserts that the card's free memory did
// not fall while it offloaded.
func (m *Manager) sleepHolding(ctx context.Context, c *cardCtrl, k rkey, r *rep, ctl engine.Controls, level int) error {
	if r.kind != engine.KindVLLM {
		return ctl.Sleep(ctx, level)
	}
	release, err := m.ex.HoldCard(ctx, k.model, k.index, c.index, "going to sleep", 5*time.Minute)
	if err != nil {
		return err
	}
	defer release()
	return ctl.Sleep(ctx, level)
}
