package residency

import (
	"cmp"
	"slices"
	"sync"
)

// NodeDecision is one decision as a node shows it: numbered in the order the
// node recorded it, across all of its cards.
type NodeDecision struct {
	Seq  uint64
	Node string
	Decision
}

// CardView is one card's controller as the API shows it.
type CardView struct {
	Node, Card string
	// Mode is "auto" or "advise".
	Mode       string
	PinnedOnly bool
	Violations int
	Usable     int64
	Plan       []PlanEntry
	Ledger     Ledger
}

// Journal is what a node's residency manager publishes for the API: recent
// decisions of every card's controller, and each card's latest plan and
// learned profiles. The manager writes it from its loop (controllers are
// not safe for concurrent use); API handlers read it from any goroutine.
type Journal struct {
	node string

	mu       sync.Mutex
	cap      int
	seq      uint64
	buf      []NodeDecision // ring of the last cap decisions
	next     int
	changed  chan struct{}
	cards    map[string]CardView
	profiles map[ProfileKey]Profile
	// counts are every decision and transition recorded since the
	// journal was made, for the node's metrics: the ring forgets, these
	// only grow.
	decided     map[DecisionCount]uint64
	transitions map[Transition]uint64
	// op reaches the manager for operators' loads and unloads (operate.go).
	op operators
}

// DecisionCount keys the count of decisions by action and trigger.
type DecisionCount struct {
	Action, Trigger string
	Advised         bool
}

// Transition is a replica's residency moving from one state to another.
type Transition struct{ From, To State }

// NewJournal keeps the last capacity decisions (default 4096) of node.
func NewJournal(node string, capacity int) *Journal {
	if capacity <= 0 {
		capacity = 4096
	}
	return &Journal{node: node, cap: capacity, changed: make(chan struct{}),
		cards: map[string]CardView{}, profiles: map[ProfileKey]Profile{},
		decided: map[DecisionCount]uint64{}, transitions: map[Transition]uint64{}}
}

// Node is the node whose decisions the journal holds.
func (j *Journal) Node() string { return j.node }

// Record appends decisions, oldest first, and wakes every follower.
func (j *Journal) Record(ds ...Decision) {
	if len(ds) == 0 {
		return
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	for _, d := range ds {
		j.seq++
		j.decided[DecisionCount{Action: d.Action.String(), Trigger: d.Trigger.String(), Advised: d.Advised}]++
		nd := NodeDecision{Seq: j.seq, Node: j.node, Decision: d}
		if len(j.buf) < j.cap {
			j.buf = append(j.buf, nd)
		} else {
			j.buf[j.next] = nd
			j.next = (j.next + 1) % j.cap
		}
	}
	close(j.changed)
	j.changed = make(chan struct{})
}

// Sync records the decisions c made since it had made seen of them and
// returns c's new total: a manager calls it after each Handle with the
// total it got last time (0 at first), so advised decisions, which produce
// no actions, reach the journal too. Decisions c no longer keeps are lost.
func (j *Journal) Sync(c *Controller, seen int) int {
	total := c.decTotal
	if n := total - seen; n > 0 {
		ds := c.Decisions()
		j.Record(ds[max(0, len(ds)-n):]...)
	}
	return total
}

// Decisions returns the kept decisions numbered after after, oldest first,
// and a channel closed when a newer one is recorded (for --follow).
func (j *Journal) Decisions(after uint64) ([]NodeDecision, <-chan struct{}) {
	j.mu.Lock()
	defer j.mu.Unlock()
	var out []NodeDecision
	for i := range j.buf {
		d := j.buf[(j.next+i)%len(j.buf)]
		if d.Seq > after {
			out = append(out, d)
		}
	}
	return out, j.changed
}

// SetCard replaces a card's view; its profiles are merged into the node's.
func (j *Journal) SetCard(v CardView, profiles []Profile) {
	v.Node = j.node
	j.mu.Lock()
	defer j.mu.Unlock()
	j.cards[v.Card] = v
	for _, p := range profiles {
		j.profiles[p.Key] = p
	}
}

// RemoveCard forgets a card's view (its controller stopped).
func (j *Journal) RemoveCard(card string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	delete(j.cards, card)
}

// Cards returns every card's latest view, ordered by card.
func (j *Journal) Cards() []CardView {
	j.mu.Lock()
	defer j.mu.Unlock()
	out := make([]CardView, 0, len(j.cards))
	for _, v := range j.cards {
		out = append(out, v)
	}
	slices.SortFunc(out, func(a, b CardView) int { return cmp.Compare(a.Card, b.Card) })
	return out
}

// Profiles returns the node's learned profiles, ordered by key.
func (j *Journal) Profiles() []Profile {
	j.mu.Lock()
	defer j.mu.Unlock()
	out := make([]Profile, 0, len(j.profiles))
	for _, p := range j.profiles {
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b Profile) int { return compareKeys(a.Key, b.Key) })
	return out
}

// Transitioned counts a replica's residency moving from one state to
// another, as the node's manager reports it.
func (j *Journal) Transitioned(from, to State) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.transitions[Transition{from, to}]++
}

// Counts returns how many decisions (by action and trigger) and residency
// transitions the journal has recorded since it was made.
func (j *Journal) Counts() (map[DecisionCount]uint64, map[Transition]uint64) {
	j.mu.Lock()
	defer j.mu.Unlock()
	d := make(map[DecisionCount]uint64, len(j.decided))
	for k, v := range j.decided {
		d[k] = v
	}
	t := make(map[Transition]uint64, len(j.transitions))
	for k, v := range j.transitions {
		t[k] = v
	}
	return d, t
}
