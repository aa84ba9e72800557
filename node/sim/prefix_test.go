package sim

import (
	"fmt"
	"strings"
	"testing"
)

func tokensOf(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%d", prefix, i)
	}
	return out
}

// TestPrefixCacheSaltNamespaces: the same prompt under another salt, or
// under none, never hits; under the same salt it hits every full block
// before its last token.
func TestPrefixCacheSaltNamespaces(t *testing.T) {
	c := newPrefixCache(defaultPrefixCacheTokens)
	a, b := "salt-a", "salt-b"
	prompt := tokensOf("w", 50) // 3 full blocks before the last token
	c.insert(blockHashes(&a, prompt))
	for _, tc := range []struct {
		name string
		salt *string
		want int
	}{{"other salt", &b, 0}, {"no salt", nil, 0}, {"same salt", &a, 48}} {
		if got := c.lookup(blockHashes(tc.salt, prompt), len(prompt)); got != tc.want {
			t.Errorf("%s: %d cached tokens, want %d", tc.name, got, tc.want)
		}
	}
	// An unsalted prompt has its own namespace, which salted ones miss.
	c.insert(blockHashes(nil, tokensOf("u", 40)))
	if got := c.lookup(blockHashes(&a, tokensOf("u", 40)), 40); got != 0 {
		t.Errorf("a salted request hit an unsalted entry: %d", got)
	}
	if got := c.lookup(blockHashes(nil, tokensOf("u", 40)), 40); got != 32 {
		t.Errorf("unsalted resend: %d, want 32", got)
	}
	// A prompt of exactly two blocks reuses one: its last token is computed.
	c.insert(blockHashes(&a, tokensOf("x", 32)))
	if got := c.lookup(blockHashes(&a, tokensOf("x", 32)), 32); got != 16 {
		t.Errorf("32-token prompt: %d cached, want 16", got)
	}
	// A shared prefix hits up to where the prompts differ.
	longer := append(append([]string(nil), prompt[:20]...), tokensOf("y", 30)...)
	if got := c.lookup(blockHashes(&a, longer), len(longer)); got != 16 {
		t.Errorf("prompt sharing 20 tokens: %d cached, want 16", got)
	}
	// Tokens are length-prefixed: moving a boundary changes the hash.
	p1 := append([]string{"ab", "c"}, tokensOf("z", 15)...)
	p2 := append([]string{"a", "bc"}, tokensOf("z", 15)...)
	if blockHashes(nil, p1)[0] == blockHashes(nil, p2)[0] {
		t.Error(`["ab" "c"] and ["a" "bc"] hash alike`)
	}
}

// TestPrefixCacheEvictsLRU: the cache holds at most its bound, evicts the
// least recently used prompt first, and a prefix outlives its extensions.
func TestPrefixCacheEvictsLRU(t *testing.T) {
	c := newPrefixCache(4 * prefixBlock)
	s := "s"
	p, q, r := tokensOf("p", 33), tokensOf("q", 33), tokensOf("r", 33) // 2 blocks each
	c.insert(blockHashes(&s, p))
	c.insert(blockHashes(&s, q))
	if got := c.lookup(blockHashes(&s, p), 33); got != 32 { // p is now the most recent
		t.Fatalf("p: %d, want 32", got)
	}
	c.insert(blockHashes(&s, r)) // evicts q, the least recent
	if c.tokens() != 4*prefixBlock {
		t.Fatalf("cache holds %d tokens, bound %d", c.tokens(), 4*prefixBlock)
	}
	for name, want := range map[string]int{"p": 32, "q": 0, "r": 32} {
		prompt := map[string][]string{"p": p, "q": q, "r": r}[name]
		if got := c.lookup(blockHashes(&s, prompt), 33); got != want {
			t.Errorf("%s: %d cached, want %d", name, got, want)
		}
	}
	// A prompt longer than the cache keeps its first blocks.
	long := tokensOf("l", 100)
	c.insert(blockHashes(&s, long))
	if got := c.lookup(blockHashes(&s, long), len(long)); got != 4*prefixBlock {
		t.Errorf("long prompt: %d cached, want its first %d", got, 4*prefixBlock)
	}
	c.clear()
	if c.tokens() != 0 || c.lookup(blockHashes(&s, long), len(long)) != 0 {
		t.Error("clear left blocks")
	}
	// No KV pool room for one block: nothing is cached.
	z := newPrefixCache(prefixBlock - 1)
	z.insert(blockHashes(&s, p))
	if z.tokens() != 0 {
		t.Errorf("a cache smaller than a block holds %d tokens", z.tokens())
	}
}

// TestPromptWords: the words counted are the prompt's or the messages',
// and a chat's carry their role.
func TestPromptWords(t *testing.T) {
	got := promptWords(completionRequest{Messages: []message{{Role: "system", Content: "be brief"}, {Role: "user", Content: "hi there"}}})
	if len(got) != 4 || !strings.HasPrefix(got[0], "system") || !strings.HasPrefix(got[3], "user") {
		t.Errorf("chat words = %q", got)
	}
	if got := promptWords(completionRequest{Prompt: "once upon a time"}); len(got) != 4 || got[0] != "once" {
		t.Errorf("prompt words = %q", got)
	}
}
