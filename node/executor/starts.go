package executor

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"
)

// cardStarts are the engine starts in progress on one card: a start is
// counted from its launch until its engine is ready or has failed.
type cardStarts struct {
	index uint32

	mu       sync.Mutex
	starting []started
	// ended is closed, and replaced, whenever a start ends.
	ended chan struct{}
}

// starter is a replica starting an engine.
type starter struct {
	k key
	// kind is its engine's kind; alone says the kind starts alone
	// (engine.StartsAlone).
	kind  string
	alone bool
	// shareMiB is its memory share of each card (0: the whole card).
	shareMiB uint64
	// timeout is its start deadline.
	timeout time.Duration
	// doing is what it does on the card, for those waiting ("starting",
	// or HoldCard's operation).
	doing string
}

// started is a start in progress on a card, since when it began there.
type started struct {
	*starter
	since time.Time
}

// waitReport is how soon a replica waiting for a card says again how long
// the start it waits for has run; the interval then doubles up to
// maxWaitReport. Each report is a write to the cluster's log: a long wait
// (a vLLM start may take half an hour) makes a few dozen, not one a second.
const (
	waitReport    = 5 * time.Second
	maxWaitReport = time.Minute
)

// admit says whether st may start on c now, where the starts in
// progress are c.starting; if not, it returns the start st waits for and
// why. Starts run side by side unless one of them starts alone or their
// shares, with those of the engines running on the card, do not fit the
// card's memory: then they would contend for the same memory, and one
// waits. Called with c.mu held.
func (e *Executor) admit(c *cardStarts, st *starter) (blocker *started, why string) {
	if len(c.starting) == 0 {
		return nil, ""
	}
	if st.alone {
		return &c.starting[0], fmt.Sprintf("a %s engine starts alone", st.kind)
	}
	for i, o := range c.starting {
		if o.alone && o.doing != "" {
			return &c.starting[i], "no engine starts beside one " + o.doing
		}
		if o.alone {
			return &c.starting[i], fmt.Sprintf("a %s engine starts alone", o.kind)
		}
	}
	if used, total := e.taken(c, st); used > total {
		return &c.starting[0], fmt.Sprintf("the card's %d MiB do not hold every share at once (%d MiB)", total, used)
	}
	return nil, ""
}

// taken is the memory the engines of card c would take with st's
// started, and the card's memory, in MiB: the shares of every start in
// progress, of every live engine on it and of st.
func (e *Executor) taken(c *cardStarts, st *starter) (used, total uint64) {
	card := e.cards[c.index]
	total = card.GetMemoryMib()
	share := func(mib uint64) uint64 {
		if mib == 0 {
			return total
		}
		return mib
	}
	counted := map[key]bool{st.k: true}
	used = share(st.shareMiB)
	for _, o := range c.starting {
		counted[o.k] = true
		used += share(o.shareMiB)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for k, en := range e.engines {
		if !counted[k] && slices.Contains(en.CardUUIDs, card.GetUuid()) {
			used += share(en.ShareMiB)
		}
	}
	return used, total
}

// waitingFor says whom a replica waiting for card waits for, and why.
func waitingFor(card uint32, h *started, why string) string {
	doing := h.doing
	if doing == "" {
		doing = "starting"
	}
	return fmt.Sprintf("waiting for card %d: %s is %s (%s of %s), and %s", card, h.k, doing,
		time.Since(h.since).Truncate(time.Second), h.timeout, why)
}

// HoldCard keeps every engine start off card while replica's engine does
// something a start beside it would break (what, e.g. "going to sleep":
// vLLM's sleep asserts that the card's free memory did not fall while it
// offloaded). It waits for the starts in progress there to end, then holds
// the card as a start that runs alone would, until release or limit.
func (e *Executor) HoldCard(ctx context.Context, model string, replica, card uint32, what string, limit time.Duration) (release func(), err error) {
	st := &starter{k: key{model, replica}, kind: what, alone: true, timeout: limit, doing: what}
	return e.lockCards(ctx, st, []uint32{card}, func(reason string) {
		e.log.Info("waiting for the card's starts before an engine operation", "replica", st.k, "operation", what, "reason", reason)
	})
}

// lockCards counts st's start on each of cards, in index order (no
// deadlock between replicas sharing several cards), once admit lets it,
// and returns the release of its place. While a card is not free to start
// on, waiting is told whom st waits for and why: at once, again when that
// changes, and at growing intervals from waitReport with the time the
// other start has run.
func (e *Executor) lockCards(ctx context.Context, st *starter, cards []uint32, waiting func(reason string)) (func(), error) {
	sorted := slices.Compact(slices.Sorted(slices.Values(cards)))
	var held []*cardStarts
	release := func() {
		for _, c := range held {
			c.mu.Lock()
			c.starting = slices.DeleteFunc(c.starting, func(o started) bool { return o.starter == st })
			close(c.ended)
			c.ended = make(chan struct{})
			c.mu.Unlock()
		}
		held = nil
	}
	for _, i := range sorted {
		c, ok := e.starts[i]
		if !ok {
			continue // not a card of this node: the launch fails and says so
		}
		said, due, every := "", false, waitReport
		tick := time.NewTimer(every)
		for {
			c.mu.Lock()
			blocker, why := e.admit(c, st)
			if blocker == nil {
				c.starting = append(c.starting, started{starter: st, since: time.Now()})
				held = append(held, c)
				c.mu.Unlock()
				break
			}
			ended := c.ended
			// A new start to wait for or a new reason is worth a report;
			// the time passing, at growing intervals.
			var reason string
			if who := blocker.k.String() + why; who != said || due {
				said, due = who, false
				reason = waitingFor(i, blocker, why)
			}
			c.mu.Unlock()
			if reason != "" {
				waiting(reason) // a report: not with the card's lock held
			}
			select {
			case <-ended:
			case <-tick.C:
				due, every = true, min(2*every, maxWaitReport)
				tick.Reset(every)
			case <-ctx.Done():
				tick.Stop()
				release()
				return nil, ctx.Err()
			}
		}
		tick.Stop()
	}
	return sync.OnceFunc(release), nil
}
