package cardmanager

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gpuplane/gpuplane/node/residency"
)

// uncountedWait bounds how long a load, prewarm or wake waits for the
// memory its card's ledger does not count to be freed (awaitCounted).
const uncountedWait = 5 * time.Minute

// awaitCounted waits, on c's worker, until no engine on c holds memory
// that c's ledger does not count (uncounted), so that a load, prewarm or
// wake of k finds free the memory its controller counted on. Such memory
// is held while an engine stops behind the ledger's back: the engine a
// restarted agent adopted and the Manager stops, or that of a replica that
// left the card while the executor stops it. The ledger frees neither's
// memory until the engine is gone, but a load it decides meanwhile would
// put both on the card at once (I1).
func (m *Manager) awaitCounted(c *cardCtrl, k rkey) error {
	deadline := time.Now().Add(uncountedWait)
	poll := time.NewTicker(50 * time.Millisecond)
	defer poll.Stop()
	for said := false; ; said = true {
		ans := make(chan []string, 1)
		m.post(func() { ans <- m.uncounted(c, k) })
		var left []string
		select {
		case left = <-ans:
		case <-m.ctx.Done():
			return m.ctx.Err()
		}
		if len(left) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("card %d still holds memory its ledger does not count after %s: %s",
				c.index, uncountedWait, strings.Join(left, ", "))
		}
		if !said {
			m.log.Info("residency: waiting for engines the ledger does not count to stop", "replica", k.id(),
				"card", c.index, "engines", strings.Join(left, ", "))
		}
		select {
		case <-poll.C:
		case <-m.ctx.Done():
			return m.ctx.Err()
		}
	}
}

// uncounted names what a load, prewarm or wake of k on card c waits for
// (awaitCounted): a stop of k's own engine in progress, and the live
// engines on c whose memory c's ledger does not count: those of replicas
// it holds Cold or Failed, and of replicas that left the card. Engines of
// replicas no controller follows (several cards) are not its to count.
func (m *Manager) uncounted(c *cardCtrl, k rkey) []string {
	if m.ctrls[c.index] != c {
		return nil // the card's controller is gone, and its work with it
	}
	var out []string
	if r := m.reps[k]; r != nil && r.stopping {
		out = append(out, string(k.id())+" (stopping)")
	}
	live := map[rkey]bool{}
	for _, en := range m.ex.Engines() {
		ek := rkey{en.Model, en.Replica}
		live[ek] = true
		if ek == k || !slices.Contains(en.CardUUIDs, c.uuid) {
			continue
		}
		r := m.reps[ek]
		if r == nil && !m.departed[ek] {
			continue
		}
		if r != nil && r.card == c.index {
			if st, ok := c.ctrl.Replica(ek.id()); ok && st.State != residency.Cold && st.State != residency.Failed {
				continue
			}
		}
		out = append(out, fmt.Sprintf("%s (pid %d)", ek.id(), en.PID))
	}
	for dk := range m.departed {
		if !live[dk] {
			delete(m.departed, dk)
		}
	}
	return out
}
