// Package cardfit is the card-fit rule of docs/residency.md (descriptor rule
// 11) in one place: what a card holds, how a replica holds its share
// (residency), and whether one more share fits. The state machine checks
// every placement with it and the scheduler chooses cards with it, so the
// scheduler never proposes what the state machine refuses, nor the reverse.
// It imports nothing of the project.
package cardfit

import (
	"fmt"
	"strings"
)

// Full is a whole card in milli-cards: shares are counted in 1/1000 of a
// card.
const Full = 1000

// Residency says how a replica holds its share of a card.
type Residency uint8

const (
	// Pinned (the zero value) reserves the share; it is never unloaded.
	Pinned Residency = iota
	// Warm reserves the share, which it may lend while it sleeps.
	Warm
	// OnDemand reserves nothing: the replica is assigned to the card (it
	// counts against maxModels) and loaded on demand into memory nobody
	// pinned, so its share must fit in the card minus the pinned shares.
	OnDemand
)

// String returns the descriptor spelling: pinned, warm or onDemand.
func (r Residency) String() string {
	switch r {
	case Warm:
		return "warm"
	case OnDemand:
		return "onDemand"
	}
	return "pinned"
}

// ParseResidency reads a residency's name (pinned, warm, onDemand; case and
// surrounding space ignored). An empty name is the default: a deployment
// that names no residency is pinned.
func ParseResidency(s string) (Residency, bool) {
	s = strings.TrimSpace(s)
	if s == "" {
		return Pinned, true
	}
	for _, r := range []Residency{Pinned, Warm, OnDemand} {
		if strings.EqualFold(s, r.String()) {
			return r, true
		}
	}
	return 0, false
}

// Reserves says whether a share of this residency is reserved.
func (r Residency) Reserves() bool { return r != OnDemand }

// Load is what one card of a shared accelerator holds, as the rule counts
// it. Shares are in milli-cards.
type Load struct {
	Replicas    int32 // every replica, whatever its residency (maxModels)
	Reserved    int32 // pinned and warm shares
	Pinned      int32 // pinned shares alone
	OnDemandMax int32 // the largest onDemand share
}

// Add counts one more share of residency r on the card.
func (l *Load) Add(r Residency, milli int32) {
	l.Replicas++
	switch r {
	case OnDemand:
		l.OnDemandMax = max(l.OnDemandMax, milli)
	case Pinned:
		l.Pinned += milli
		l.Reserved += milli
	default:
		l.Reserved += milli
	}
}

// Merge is the load of two sets of replicas on one card.
func (l Load) Merge(o Load) Load {
	return Load{Replicas: l.Replicas + o.Replicas, Reserved: l.Reserved + o.Reserved,
		Pinned: l.Pinned + o.Pinned, OnDemandMax: max(l.OnDemandMax, o.OnDemandMax)}
}

// Room is the largest share of residency r the card can take, maxModels
// aside: reserved shares stay within the card, an onDemand share within
// the card minus the pinned shares, and a pinned share leaves the largest
// onDemand share that room. It is negative on an over-committed card.
func (l *Load) Room(r Residency) int32 {
	switch r {
	case OnDemand:
		return Full - l.Pinned
	case Pinned:
		return min(Full-l.Reserved, Full-l.Pinned-l.OnDemandMax)
	}
	return Full - l.Reserved
}

// Fits reports whether the card takes one more share of residency r:
// fewer than maxModels replicas (0: unbounded) and the share within Room.
func (l *Load) Fits(r Residency, milli, maxModels int32) bool {
	return (maxModels == 0 || l.Replicas < maxModels) && milli <= l.Room(r)
}

// Why is nil where Fits holds and otherwise the rule the share breaks,
// with the numbers, worded to follow "card n/i ".
func (l *Load) Why(r Residency, milli, maxModels int32) error {
	switch {
	case l.Fits(r, milli, maxModels):
		return nil
	case maxModels != 0 && l.Replicas >= maxModels:
		return fmt.Errorf("already holds %d of %d models", l.Replicas, maxModels)
	case r == OnDemand:
		return fmt.Errorf("has %d%% not pinned, onDemand replica needs %d%%", (Full-l.Pinned)/10, milli/10)
	case l.Reserved+milli > Full:
		return fmt.Errorf("has %d%% free, replica needs %d%%", (Full-l.Reserved)/10, milli/10)
	}
	return fmt.Errorf("pinning %d%% would leave %d%% for an onDemand replica there that needs %d%%", milli/10, (Full-l.Pinned-milli)/10, l.OnDemandMax/10)
}

// failoverPrefix starts the reason of a replica placed again after its node
// or card was lost, until its node reports it.
const failoverPrefix = "placed after a failover: "

// FailoverReason is the reason the state machine gives a replica it placed
// again after its node or card was lost (cause says how).
func FailoverReason(cause string) string { return failoverPrefix + cause }

// PlacedByFailover reports whether a placed replica's reason says it was
// placed again after its node or card was lost: the node's residency
// controller records that first load as a failover, not a placement.
func PlacedByFailover(reason string) bool { return strings.HasPrefix(reason, failoverPrefix) }
