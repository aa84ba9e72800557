package sim

import "sync"

// The slot cache works as llama.cpp server's slots (docs/engines.md): the
// engine has --parallel slots, each keeping the tokens of the last prompt it
// ran. A request that names a slot (`id_slot` ≥ 0) reuses the common prefix
// of its prompt and that slot's tokens, unless it sends `cache_prompt:
// false`; it then leaves its own prompt in the slot. Slots share nothing, so
// a prompt run in one slot is never a hit in another. As in the prefix
// cache, the last prompt token is always computed. A request without
// `id_slot` (or -1) uses the salted prefix cache (prefix.go) instead.

// slotCache is safe for concurrent use.
type slotCache struct {
	mu     sync.Mutex
	tokens map[int][]string
}

func newSlotCache() *slotCache { return &slotCache{tokens: map[int][]string{}} }

// lookup is how many of prompt's tokens slot holds (0 without reuse).
func (c *slotCache) lookup(slot int, prompt []string, reuse bool) int {
	if !reuse {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	held := c.tokens[slot]
	n := 0
	for n < len(held) && n < len(prompt)-1 && held[n] == prompt[n] {
		n++
	}
	return n
}

// store leaves prompt in slot, replacing what it held.
func (c *slotCache) store(slot int, prompt []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.tokens[slot] = append([]string(nil), prompt...)
}

// clear empties every slot (the KV cache was freed).
func (c *slotCache) clear() {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.tokens)
}

// held is a copy of the prompt slot holds.
func (c *slotCache) held(slot int) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.tokens[slot]...)
}

// drop empties one slot.
func (c *slotCache) drop(slot int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.tokens, slot)
}
