package cardmanager

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/gpuplane/gpuplane/node/residency"
)

// Operate loads (load) or unloads the replicas of model (a deployment name,
// or one replica "chat/0") that this node's controllers hold, as the
// operator asked (residency.OperatorLoad, residency.OperatorUnload). A
// refusal (a pinned model's unload, a card that cannot hold the model)
// names its reason and changes nothing on that replica's card.
func (m *Manager) Operate(ctx context.Context, model string, load bool, by string) ([]residency.OperatorResult, error) {
	type answer struct {
		res []residency.OperatorResult
		err error
	}
	ans := make(chan answer, 1)
	m.post(func() {
		var a answer
		for _, k := range sortedKeys(m.reps) {
			if k.model != model && string(k.id()) != model {
				continue
			}
			r := m.reps[k]
			c := m.ctrls[r.card]
			if c == nil {
				continue
			}
			id := k.id()
			before, _ := c.ctrl.Replica(id)
			var ev residency.Event = residency.OperatorUnload{Model: id, By: by}
			if load {
				ev = residency.OperatorLoad{Model: id, By: by}
			}
			out := m.handle(c, ev, "")
			if out.Err != nil {
				a.err = errors.Join(a.err, out.Err)
				continue
			}
			res := residency.OperatorResult{Replica: id, Card: c.uuid}
			var room []residency.OperatorResult
			for _, act := range out.Actions {
				switch {
				case act.Adapter != "":
				case act.Model == id:
					res.Action, res.Reason = act.Kind, act.Decision.Reason
				case act.Decision.For == id && act.Decision.Trigger == residency.TriggerOperator:
					// Idle models unloaded to make room for it.
					room = append(room, residency.OperatorResult{Replica: act.Model, Card: c.uuid, Action: act.Kind, Reason: act.Decision.Reason})
				}
			}
			if res.Action == 0 {
				res.Reason = noActionReason(before, load)
				if len(room) > 0 {
					res.Reason = fmt.Sprintf("loads once the room made for it is free (%d idle onDemand %s unloaded)", len(room), plural(len(room), "model"))
				}
			}
			a.res = append(append(a.res, res), room...)
		}
		ans <- a
	})
	select {
	case a := <-ans:
		return a.res, a.err
	case <-ctx.Done():
		return nil, fmt.Errorf("the node's residency loop did not answer: %w", ctx.Err())
	}
}

// Protect puts the operator's choice of the protected set in force
// (residency.ProtectModels) on every card that holds a replica of one of
// models, or, with none, gives the choice back to every card's
// controller. One result per card, its reason the best-effort models
// there and why. A card that refuses (run without the protected set)
// returns its reason and changes nothing.
func (m *Manager) Protect(ctx context.Context, models []string, by string) ([]residency.OperatorResult, error) {
	type answer struct {
		res []residency.OperatorResult
		err error
	}
	ans := make(chan answer, 1)
	m.post(func() {
		var a answer
		on := map[uint32][]residency.ModelID{}
		for _, k := range sortedKeys(m.reps) {
			if slices.Contains(models, k.model) {
				on[m.reps[k].card] = append(on[m.reps[k].card], k.id())
			}
		}
		for _, c := range m.sortedCards() {
			ids, ok := on[c.index]
			if len(models) > 0 && !ok {
				continue
			}
			out := m.handle(c, residency.ProtectModels{Models: ids, By: by}, "")
			if out.Err != nil {
				a.err = errors.Join(a.err, out.Err)
				continue
			}
			m.publishCard(c)
			res := residency.OperatorResult{Card: c.uuid, Action: residency.ActBestEffort}
			var whys []string
			for _, e := range c.ctrl.BestEffort() {
				whys = append(whys, e.Reason)
			}
			var names []string
			for _, id := range ids {
				names = append(names, string(id))
			}
			switch {
			case len(models) == 0:
				res.Reason = "the controller chooses the protected set again"
			default:
				res.Reason = "protects " + strings.Join(names, ", ") + " (and the pinned and warm models)"
			}
			if len(whys) > 0 {
				res.Reason += "; best-effort: " + strings.Join(whys, "; ")
			} else {
				res.Reason += "; none is best-effort now"
			}
			a.res = append(a.res, res)
		}
		ans <- a
	})
	select {
	case a := <-ans:
		return a.res, a.err
	case <-ctx.Done():
		return nil, fmt.Errorf("the node's residency loop did not answer: %w", ctx.Err())
	}
}

func noActionReason(st residency.Status, load bool) string {
	switch {
	case load && (st.State == residency.Resident || st.State == residency.Loading || st.State == residency.Waking):
		return fmt.Sprintf("already %s", strings.ToLower(st.State.String()))
	case load && st.State == residency.Failed:
		return "its last start failed: it loads once its retry backoff ends"
	case load:
		return "waits for memory already being freed"
	case st.State == residency.Cold || st.State == residency.Failed:
		return "already off the card"
	case st.State == residency.Sleeping:
		return "already asleep (a warm model's share stays reserved)"
	}
	return "already being taken off the card"
}

func plural(n int, word string) string {
	if n == 1 {
		return word
	}
	return word + "s"
}
