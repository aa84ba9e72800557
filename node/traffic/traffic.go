// Package traffic keeps, per card, a bounded rotating record of the
// requests a node's gateway served from it (docs/simulate.md, "What if,
// from a card's own traffic"): when each arrived, for which deployment and
// adapter, its tenant and class, its tokens in and out, its time to first
// token and how it ended. `gpuplane simulate serve --from-node` replays it
// through the serving simulator.
//
// The record stays on its node: it is read only through the node's API
// (ResidencyService.ListRequests), by a caller allowed to read, and tenant
// names leave it only where the caller may see them (rpc). It never grows
// past PerCard records a card; the oldest go first. Log.Requests gives it
// in the wire's shapes, tenants named t1, t2, ... per answer.
package traffic

import (
	"slices"
	"sync"
	"time"
)

// PerCard is how many requests a card's record keeps by default: about
// 10 MiB a card when full (a record is about 100 bytes), a day of a card
// serving one request a second.
const PerCard = 100_000

// Outcome is how a request ended.
type Outcome uint8

const (
	// Served: the engine answered (a first token, then the rest).
	Served Outcome = iota
	// Rejected: the gateway refused it (a full queue, a cold wait past its
	// deadline).
	Rejected
	// Failed: it reached no answer (its engine failed, it was cut off).
	Failed
	// Abandoned: its client left before it was answered (a timeout, a
	// cancel), most often while it waited for the card.
	Abandoned
)

func (o Outcome) String() string {
	switch o {
	case Served:
		return "served"
	case Rejected:
		return "rejected"
	case Abandoned:
		return "abandoned"
	}
	return "failed"
}

// Record is one request a card's gateway queue ended.
type Record struct {
	Arrived    time.Time
	Deployment string
	Replica    uint32
	Adapter    string
	Tenant     string
	// Class is the request's class (interactive, standard, background).
	Class        string
	PromptTokens int
	OutputTokens int
	// TTFT is the time from its arrival to its first token (0: none).
	TTFT    time.Duration
	Outcome Outcome
}

// Log is a node's per-card records. Safe for concurrent use.
type Log struct {
	perCard int
	mu      sync.Mutex
	cards   map[uint32]*ring
}

type ring struct {
	recs []Record
	next int
	full bool
}

// NewLog keeps up to perCard records a card (≤ 0: PerCard).
func NewLog(perCard int) *Log {
	if perCard <= 0 {
		perCard = PerCard
	}
	return &Log{perCard: perCard, cards: map[uint32]*ring{}}
}

// Add records r as served from card.
func (l *Log) Add(card uint32, r Record) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	rg := l.cards[card]
	if rg == nil {
		rg = &ring{}
		l.cards[card] = rg
	}
	if !rg.full {
		rg.recs = append(rg.recs, r)
		if len(rg.recs) == l.perCard {
			rg.full = true
		}
		return
	}
	rg.recs[rg.next] = r
	rg.next = (rg.next + 1) % len(rg.recs)
}

// Since returns card's records that arrived at since or later, oldest
// first (by arrival).
func (l *Log) Since(card uint32, since time.Time) []Record {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	rg := l.cards[card]
	var out []Record
	if rg != nil {
		all := append(append([]Record(nil), rg.recs[rg.next:]...), rg.recs[:rg.next]...)
		for _, r := range all {
			if !r.Arrived.Before(since) {
				out = append(out, r)
			}
		}
	}
	l.mu.Unlock()
	// Recorded as they end: a long request ends after later short ones.
	slices.SortStableFunc(out, func(a, b Record) int { return a.Arrived.Compare(b.Arrived) })
	return out
}

// Cards lists the cards with records, in order.
func (l *Log) Cards() []uint32 {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]uint32, 0, len(l.cards))
	for c := range l.cards {
		out = append(out, c)
	}
	slices.Sort(out)
	return out
}
