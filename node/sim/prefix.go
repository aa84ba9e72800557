package sim

import (
	"container/list"
	"crypto/sha256"
	"encoding/binary"
	"hash"
	"strings"
	"sync"
)

// The prefix cache (docs/engines.md) works as vLLM's automatic prefix caching:
// a prompt's tokens (the sim's words) are cut into blocks of prefixBlock;
// each full block is known by a hash of the block's tokens and its parent's
// hash, so a hash names a whole prefix. The first block's hash also covers
// the request's cache_salt, or that it had none, so prompts with different
// salts never share a block, and a salted request never reuses an unsalted
// one's: each salt is its own namespace, and a tenant (the gateway sends each
// its own salt) never gets a hit from another's prompt.
//
// A hit saves the prefill of the tokens it covers. As in vLLM the last
// prompt token is always computed, so a prompt reuses at most the full
// blocks before its last token. The cache holds at most the KV pool's worth
// of tokens (or defaultPrefixCacheTokens when the sim models no pool) and
// evicts the least recently used block; within a prompt the deepest block
// is the least recent, so a prefix is never evicted before its extensions.
// A sleep or an unload frees the KV cache, and with it every cached block.

// prefixBlock is how many tokens a cache block holds: vLLM's default
// --block-size.
const prefixBlock = 16

// defaultPrefixCacheTokens bounds the cache of an engine whose KV cache is
// not modelled (no --kv-kib-per-token).
const defaultPrefixCacheTokens = 1 << 16

type blockHash [sha256.Size]byte

// prefixCache is safe for concurrent use.
type prefixCache struct {
	mu        sync.Mutex
	maxBlocks int
	lru       *list.List // of blockHash, most recently used first
	blocks    map[blockHash]*list.Element
}

func newPrefixCache(maxTokens int) *prefixCache {
	return &prefixCache{maxBlocks: maxTokens / prefixBlock, lru: list.New(), blocks: map[blockHash]*list.Element{}}
}

// prefixCacheTokens is the cache's bound for cfg: its KV pool in tokens.
func prefixCacheTokens(cfg Config) int {
	if cfg.KVKiBPerToken == 0 {
		return defaultPrefixCacheTokens
	}
	return int(cfg.KVPoolMiB * 1024 / cfg.KVKiBPerToken)
}

// blockHashes returns the hash of each full block of tokens, in order.
func blockHashes(salt *string, tokens []string) []blockHash {
	n := len(tokens) / prefixBlock
	if n == 0 {
		return nil
	}
	out := make([]blockHash, n)
	h := sha256.New()
	var parent blockHash
	for i := range n {
		h.Reset()
		if i == 0 {
			if salt == nil {
				h.Write([]byte{0})
			} else {
				h.Write([]byte{1})
				writeString(h, *salt)
			}
		} else {
			h.Write(parent[:])
		}
		for _, tok := range tokens[i*prefixBlock : (i+1)*prefixBlock] {
			writeString(h, tok)
		}
		h.Sum(out[i][:0])
		parent = out[i]
	}
	return out
}

// writeString writes s length-prefixed, so no two token lists hash alike
// by shifting a boundary.
func writeString(h hash.Hash, s string) {
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(s)))
	h.Write(n[:])
	h.Write([]byte(s))
}

// reusable is how many of a prompt's blocks a hit may cover: the full
// blocks before its last token.
func reusable(promptTokens int) int {
	if promptTokens == 0 {
		return 0
	}
	return (promptTokens - 1) / prefixBlock
}

// lookup returns how many tokens of the prompt whose blocks are hashes (of
// promptTokens tokens) are cached: its longest cached prefix of reusable
// blocks. The blocks it covers become the most recently used.
func (c *prefixCache) lookup(hashes []blockHash, promptTokens int) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, h := range hashes[:min(len(hashes), reusable(promptTokens))] {
		if _, ok := c.blocks[h]; !ok {
			break
		}
		n++
	}
	// Deepest first, so the shortest prefix ends up the most recent.
	for i := n - 1; i >= 0; i-- {
		c.lru.MoveToFront(c.blocks[hashes[i]])
	}
	return n * prefixBlock
}

// insert caches a prompt's blocks once its prefill is done, evicting the
// least recently used blocks past the bound.
func (c *prefixCache) insert(hashes []blockHash) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.maxBlocks == 0 {
		return
	}
	for i := len(hashes) - 1; i >= 0; i-- {
		if e, ok := c.blocks[hashes[i]]; ok {
			c.lru.MoveToFront(e)
			continue
		}
		c.blocks[hashes[i]] = c.lru.PushFront(hashes[i])
	}
	for c.lru.Len() > c.maxBlocks {
		e := c.lru.Back()
		delete(c.blocks, e.Value.(blockHash))
		c.lru.Remove(e)
	}
}

// clear drops every block: the KV cache is gone (sleep, unload).
func (c *prefixCache) clear() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lru.Init()
	clear(c.blocks)
}

// tokens is how many tokens the cache holds.
func (c *prefixCache) tokens() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lru.Len() * prefixBlock
}

// promptWords are the prompt's tokens as the sim counts them (words); in a
// chat each carries its message's role, so moving words between messages
// changes the prefix.
func promptWords(req completionRequest) []string {
	var out []string
	if str, ok := req.Prompt.(string); ok {
		out = append(out, strings.Fields(str)...)
	}
	for _, m := range req.Messages {
		if str, ok := m.Content.(string); ok {
			for _, w := range strings.Fields(str) {
				out = append(out, m.Role+"\x00"+w)
			}
		}
	}
	return out
}
