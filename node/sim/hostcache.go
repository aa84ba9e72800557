package sim

import "sync"

// The host-RAM prompt cache works as llama-server's (--cache-ram;
// tools/server/server-context.cpp get_available_slot, server-task.cpp
// server_prompt_cache), in the llamacpp dialect only:
//
//   - A request that names no slot takes one by itself. If the slot holds a
//     prompt of which the new one keeps little (at most a tenth of the new
//     prompt matches it, as when llama-server picks the slot by LRU, or
//     under half of the slot's prompt would be kept), the slot's prompt is
//     saved to the cache (unless a cached prompt already holds it whole;
//     cached prompts it holds whole are dropped), and the cached prompt
//     that matches the new one best, keeping at least a quarter of itself
//     and more of both than the slot's own, moves into the slot (an empty
//     slot takes any that keeps a quarter of itself). A prompt
//     is matched by its tokens alone: whatever slot, tenant or adapter
//     computed it.
//   - With a unified KV cache (auto slots or --kv-unified), each new task
//     also saves every other idle slot's prompt to the cache and clears
//     the slot (--cache-idle-slots, on by default).
//   - A request that names its slot (id_slot) neither saves nor restores.
//   - The cache holds host memory: each prompt's KV (--kv-kib-per-token a
//     token; the sim has no KV size without it, and then holds none). Past
//     --cache-ram MiB the oldest prompts go, always keeping one; -1 sets
//     no limit, 0 turns the cache off.
//
// llama-server's other bound, a token count that grows to what the memory
// limit holds, is not modelled.

// DefaultCacheRAMMiB is llama-server's --cache-ram when not given
// (common/common.h, cache_ram_mib).
const DefaultCacheRAMMiB = 8192

// hostCache is safe for concurrent use.
type hostCache struct {
	mu          sync.Mutex
	limitMiB    int // -1: no limit
	kibPerToken uint64
	states      [][]string // oldest first
}

// newHostCache is cfg's host cache, or nil where it has none.
func newHostCache(cfg Config) *hostCache {
	if cfg.Dialect != DialectLlamaCpp || cfg.CacheRAMMiB == 0 {
		return nil
	}
	return &hostCache{limitMiB: cfg.CacheRAMMiB, kibPerToken: cfg.KVKiBPerToken}
}

func commonPrefix(a, b []string) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

// save keeps a copy of a slot's prompt (server_prompt_cache::alloc).
func (c *hostCache) save(prompt []string) {
	if c == nil || len(prompt) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, st := range c.states {
		if commonPrefix(st, prompt) == len(prompt) {
			return
		}
	}
	kept := c.states[:0]
	for _, st := range c.states {
		if commonPrefix(st, prompt) != len(st) {
			kept = append(kept, st)
		}
	}
	c.states = append(kept, append([]string(nil), prompt...))
	c.evict()
}

// evict drops the oldest prompts past the limit, keeping one
// (server_prompt_cache::update). Callers hold c.mu.
func (c *hostCache) evict() {
	for c.limitMiB >= 0 && len(c.states) > 1 && c.kib() > uint64(c.limitMiB)*1024 {
		c.states = c.states[1:]
	}
}

// load is the cached prompt that should replace held as the slot's prompt
// for a request of prompt (server_prompt_cache::load), taken out of the
// cache; ok is false where none does better than held.
func (c *hostCache) load(held, prompt []string) (best []string, ok bool) {
	if c == nil || len(prompt) == 0 {
		return nil, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	lcp := commonPrefix(held, prompt)
	keepBest, simBest := -1.0, float64(lcp)/float64(len(prompt))
	if len(held) > 0 {
		keepBest = float64(lcp) / float64(len(held))
	}
	at := -1
	for i, st := range c.states {
		n := commonPrefix(st, prompt)
		keep, sim := float64(n)/float64(len(st)), float64(n)/float64(len(prompt))
		if keep < 0.25 {
			continue
		}
		if keepBest < keep && simBest < sim {
			keepBest, simBest, at = keep, sim, i
		}
	}
	if at < 0 {
		return nil, false
	}
	best = c.states[at]
	c.states = append(c.states[:at], c.states[at+1:]...)
	return best, true
}

// kib is the host memory the cached prompts hold. Callers hold c.mu.
func (c *hostCache) kib() uint64 {
	var n uint64
	for _, st := range c.states {
		n += uint64(len(st)) * c.kibPerToken
	}
	return n
}

// mib is the host memory the cache holds, rounded up.
func (c *hostCache) mib() uint64 {
	if c == nil {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return (c.kib() + 1023) / 1024
}

// hostCacheOnLaunch runs the host cache's part of a llama.cpp request
// taking slot id (named: the request chose it), before the slot's own
// prompt is matched: the slot's prompt saved and a better cached one
// restored into it, and with a unified KV cache every other idle slot's
// prompt saved and cleared. Callers must not hold s.mu.
func (s *server) hostCacheOnLaunch(id int, named bool, prompt []string) {
	if s.host == nil {
		return
	}
	if !named {
		held := s.slots.held(id)
		lcp := commonPrefix(held, prompt)
		// llama-server leaves the cache alone for a slot it picked by
		// similarity (over a tenth of the new prompt matches) unless
		// under half of the slot's prompt stays; a slot picked by LRU
		// (an empty one too) always saves and loads.
		if len(held) == 0 || float64(lcp) <= 0.1*float64(len(prompt)) || float64(lcp) < 0.5*float64(len(held)) {
			s.host.save(held)
			if best, ok := s.host.load(held, prompt); ok {
				s.slots.store(id, best)
			}
		}
	}
	if s.cfg.Parallel <= 0 || s.cfg.KVUnified {
		s.mu.Lock()
		var idle []int
		for i := range s.cfg.slots() {
			if i != id && !s.busySlots[i] {
				idle = append(idle, i)
			}
		}
		s.mu.Unlock()
		for _, i := range idle {
			if held := s.slots.held(i); len(held) > 0 {
				s.host.save(held)
				s.slots.drop(i)
			}
		}
	}
	s.report()
}
