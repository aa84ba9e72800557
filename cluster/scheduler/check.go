package scheduler

import (
	"errors"
	"fmt"
	"sort"
)

// Check verifies docs/descriptors.md rule 11 over a whole cluster view, independently of how
// the placements were chosen: on each card the reserved shares (pinned and
// warm) sum to at most 100 % and each onDemand share fits in the card minus
// its pinned shares (docs/residency.md), a shared card holds at most maxModels replicas, every share on a card
// belongs to the accelerator the card is bound to, a dedicated card holds
// exactly one whole-card replica, a dedicated replica holds
// devicesPerReplica cards of one node, a shared replica holds one card, and
// host reservations stay within capacity. It returns every violation found,
// joined, in a deterministic order, or nil.
//
// It is the oracle of the simulator and of the scheduler's tests: it shares
// no code with the placement it checks, so a policy bug shows up as a
// violation. The state machine does not run it (the fsm imports nothing from
// this package); it enforces rule 11 with its own per-card arithmetic when it
// applies a placement (fsm/placement.go).
func Check(nodes []Node, accelerators []Accelerator) error {
	accs := make(map[string]Accelerator, len(accelerators))
	for _, a := range accelerators {
		accs[a.Name] = a
	}
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }

	type holding struct {
		node  string
		acc   string
		cards int
		milli int
	}
	replicas := map[string]*holding{}
	var order []string // replica ids in first-seen order, for stable messages
	seenNode := map[string]bool{}
	for _, n := range nodes {
		if seenNode[n.Name] {
			bad("node %q listed twice", n.Name)
		}
		seenNode[n.Name] = true
		if n.CPUMilli > 0 && n.CPUUsedMilli > n.CPUMilli {
			bad("node %s: %dm CPU reserved of %dm", n.Name, n.CPUUsedMilli, n.CPUMilli)
		}
		if n.MemoryMiB > 0 && n.MemoryUsedMiB > n.MemoryMiB {
			bad("node %s: %d MiB memory reserved of %d MiB", n.Name, n.MemoryUsedMiB, n.MemoryMiB)
		}
		seenCard := map[int]bool{}
		for _, c := range n.Cards {
			where := fmt.Sprintf("node %s card %d", n.Name, c.Index)
			if seenCard[c.Index] {
				bad("%s listed twice", where)
			}
			seenCard[c.Index] = true
			if len(c.Shares) == 0 {
				continue
			}
			if c.Accelerator == "" {
				bad("%s holds %d replicas but is bound to no accelerator", where, len(c.Shares))
			}
			sum, pinned, odMax := 0, 0, 0
			for _, s := range c.Shares {
				if s.Milli < 1 || s.Milli > FullCard {
					bad("%s: replica %s has share %d milli, outside 1..%d", where, s.Replica, s.Milli, FullCard)
				}
				if s.Accelerator != c.Accelerator {
					bad("%s is bound to %q but holds replica %s of accelerator %q", where, c.Accelerator, s.Replica, s.Accelerator)
				}
				switch s.Residency {
				case OnDemand:
					odMax = max(odMax, s.Milli)
				case Pinned:
					pinned += s.Milli
					sum += s.Milli
				default:
					sum += s.Milli
				}
				h := replicas[s.Replica]
				if h == nil {
					h = &holding{node: n.Name, acc: s.Accelerator, milli: s.Milli}
					replicas[s.Replica] = h
					order = append(order, s.Replica)
				} else if h.node != n.Name {
					bad("replica %s is on node %s and on node %s", s.Replica, h.node, n.Name)
				}
				h.cards++
			}
			if sum > FullCard {
				bad("%s: shares sum to %s, over 100%%", where, Percent(sum))
			}
			if pinned+odMax > FullCard {
				bad("%s: an onDemand share of %s does not fit beside %s pinned", where, Percent(odMax), Percent(pinned))
			}
			a, ok := accs[c.Accelerator]
			switch {
			case c.Accelerator == "":
			case !ok:
				bad("%s is bound to unknown accelerator %q", where, c.Accelerator)
			case a.Tenancy == Shared:
				if a.MaxModels > 0 && len(c.Shares) > a.MaxModels {
					bad("%s holds %d replicas of %q, over maxModels %d", where, len(c.Shares), a.Name, a.MaxModels)
				}
			default:
				if len(c.Shares) != 1 || c.Shares[0].Milli != FullCard || c.Shares[0].Residency != Pinned {
					bad("%s is dedicated to %q but holds %d replicas using %s", where, a.Name, len(c.Shares), Percent(sum))
				}
			}
		}
	}
	sort.Strings(order)
	for _, id := range order {
		h := replicas[id]
		a, ok := accs[h.acc]
		if !ok {
			continue // reported on the card
		}
		want := a.cardsPerReplica()
		if h.cards != want {
			bad("replica %s holds %d cards of %s, want %d", id, h.cards, h.node, want)
		}
	}
	return errors.Join(errs...)
}
