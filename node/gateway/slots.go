package gateway

import (
	"context"
	"sync"
)

// slotPool hands out a llama.cpp engine's slots (docs/gateway.md,
// Isolation): a slot runs one request at a time, so the tenant whose prompt
// it holds is known. A request takes a free slot that holds its own
// tenant's prompt if there is one, else one never used (or whose content is
// unknown), else the one free the longest; with none free it waits. A slot
// taken from another tenant, or whose content is unknown, is run with
// `cache_prompt: false`, so the engine computes the whole prompt and reuses
// nothing the slot held.
type slotPool struct {
	mu sync.Mutex
	// owner is the tenant whose prompt each slot holds ("": unknown,
	// also while a request runs in it); busy marks slots in use; freed
	// orders the free slots by when they were freed.
	owner []string
	busy  []bool
	freed []uint64
	clock uint64
	// wake is closed, and replaced, when a slot is freed.
	wake chan struct{}
}

func newSlotPool(n int) *slotPool {
	return &slotPool{owner: make([]string, n), busy: make([]bool, n), freed: make([]uint64, n), wake: make(chan struct{})}
}

// acquire takes a slot for tenant, waiting until one is free or ctx ends.
// reuse says whether the slot holds tenant's own prompt (so the engine may
// reuse it). The caller must release the slot.
func (p *slotPool) acquire(ctx context.Context, tenant string) (slot int, reuse bool, err error) {
	for {
		p.mu.Lock()
		best := -1
		for i := range p.owner {
			if p.busy[i] {
				continue
			}
			if best < 0 || p.rank(i, tenant) < p.rank(best, tenant) ||
				p.rank(i, tenant) == p.rank(best, tenant) && p.freed[i] < p.freed[best] {
				best = i
			}
		}
		if best >= 0 {
			reuse = tenant != "" && p.owner[best] == tenant
			p.busy[best], p.owner[best] = true, ""
			p.mu.Unlock()
			return best, reuse, nil
		}
		wake := p.wake
		p.mu.Unlock()
		select {
		case <-wake:
		case <-ctx.Done():
			return 0, false, context.Cause(ctx)
		}
	}
}

// rank orders free slots for tenant: its own, then unknown, then others'.
func (p *slotPool) rank(i int, tenant string) int {
	switch p.owner[i] {
	case tenant:
		return 0
	case "":
		return 1
	}
	return 2
}

// release frees slot. holds: the request ran to its end, so the slot holds
// tenant's prompt; otherwise its content is unknown.
func (p *slotPool) release(slot int, tenant string, holds bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.busy[slot] = false
	if holds {
		p.owner[slot] = tenant
	}
	p.clock++
	p.freed[slot] = p.clock
	close(p.wake)
	p.wake = make(chan struct{})
}
