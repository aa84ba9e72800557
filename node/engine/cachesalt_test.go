package engine

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/node/gateway/isolation"
)

func TestAcceptsCacheSalt(t *testing.T) {
	for kind, want := range map[string]bool{KindVLLM: true, KindSim: true, KindLlamaCpp: false, KindOllama: false, KindCommand: false, "": false} {
		if got := AcceptsCacheSalt(kind); got != want {
			t.Errorf("AcceptsCacheSalt(%q) = %v, want %v", kind, got, want)
		}
	}
}

// saltedAnswer is what a completion says about its prompt.
type saltedAnswer struct {
	code                 int
	message              string
	prompt, cached       int
	completion           int
	elapsed              time.Duration
	usageChunks, nullUse int // streamed: chunks with a usage, with a null one
}

// ask sends prompt to the sim's chat endpoint under salt (none when nil),
// streamed or not, and reads the usage.
func ask(t *testing.T, p *simProc, salt *string, prompt string, stream bool) saltedAnswer {
	t.Helper()
	body := map[string]any{"model": "chat", "max_tokens": 2, "messages": []any{map[string]any{"role": "user", "content": prompt}}}
	if salt != nil {
		body["cache_salt"] = *salt
	}
	if stream {
		body["stream"], body["stream_options"] = true, map[string]any{"include_usage": true}
	}
	b, _ := json.Marshal(body)
	start := time.Now()
	resp, err := http.Post(p.base+"/v1/chat/completions", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	type usage struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		PromptTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	}
	a := saltedAnswer{code: resp.StatusCode}
	if !stream || resp.StatusCode != http.StatusOK {
		var out struct {
			Usage usage
			Error struct{ Message string }
		}
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
			t.Fatal(err)
		}
		a.elapsed = time.Since(start)
		a.prompt, a.cached, a.message = out.Usage.PromptTokens, out.Usage.PromptTokensDetails.CachedTokens, out.Error.Message
		a.completion = out.Usage.CompletionTokens
		return a
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || line == "[DONE]" {
			continue
		}
		var chunk struct {
			Choices []json.RawMessage `json:"choices"`
			Usage   *usage            `json:"usage"`
		}
		var raw map[string]json.RawMessage
		if err := json.Unmarshal([]byte(line), &chunk); err != nil || json.Unmarshal([]byte(line), &raw) != nil {
			t.Fatalf("bad chunk %q", line)
		}
		if _, has := raw["usage"]; has && chunk.Usage == nil {
			a.nullUse++
		}
		if chunk.Usage != nil {
			a.usageChunks++
			if len(chunk.Choices) != 0 {
				t.Fatalf("the usage chunk has choices: %s", line)
			}
			a.prompt, a.cached = chunk.Usage.PromptTokens, chunk.Usage.PromptTokensDetails.CachedTokens
			a.completion = chunk.Usage.CompletionTokens
		}
	}
	a.elapsed = time.Since(start)
	return a
}

// TestSimCacheIsolation runs a real sim engine
// process and sends it prompts under the cache salts the gateway derives
// for two tenants: tenant B sending tenant A's exact prompt gets no cached
// tokens, nor does a request without a salt; A resending gets a hit, in the
// plain and the streamed answer's usage, and computes only what the cache
// missed. A sleep frees the cache.
func TestSimCacheIsolation(t *testing.T) {
	c := newCard(t)
	p := startSim(t, c, "chat", "--load-seconds", "0", "--tokens-per-second", "0", "--prefill-tokens-per-second", "100",
		"--memory-mib", "2048", "--overhead-mib", "100")
	p.waitHealthy(t)
	salter, err := isolation.NewSalter(bytes.Repeat([]byte{42}, isolation.MinSecretLen))
	if err != nil {
		t.Fatal(err)
	}
	saltA, saltB := salter.CacheSalt("acme", "chat"), salter.CacheSalt("globex", "chat")
	prompt := strings.TrimSpace(strings.Repeat("summarise the quarterly report for the board ", 7)) + " please" // 50 words

	type step struct {
		who        string
		salt       *string
		stream     bool
		cached     int
		prefilled  int64 // the engine's running count of prompt tokens computed
		minElapsed time.Duration
	}
	for _, s := range []step{
		// A miss computes all 50 tokens at 100/s: half a second at least.
		{"A first", &saltA, false, 0, 50, 450 * time.Millisecond},
		{"B sends A's prompt", &saltB, false, 0, 100, 450 * time.Millisecond},
		{"no salt sends A's prompt", nil, false, 0, 150, 0},
		// A hit covers the 3 full blocks before the last token: 48 of 50,
		// so only 2 are computed.
		{"A resends", &saltA, false, 48, 152, 0},
		{"A resends, streamed", &saltA, true, 48, 154, 0},
		{"B resends", &saltB, false, 48, 156, 0},
	} {
		a := ask(t, p, s.salt, prompt, s.stream)
		if a.code != http.StatusOK || a.prompt != 50 || a.cached != s.cached || a.completion != 2 {
			t.Fatalf("%s: status %d, prompt_tokens %d, cached_tokens %d, completion_tokens %d; want 200, 50, %d, 2", s.who, a.code, a.prompt, a.cached, a.completion, s.cached)
		}
		if s.stream && (a.usageChunks != 1 || a.nullUse < 3) {
			t.Fatalf("%s: %d usage chunks and %d chunks with usage null; want 1 and one per token and the final chunk", s.who, a.usageChunks, a.nullUse)
		}
		if a.elapsed < s.minElapsed {
			t.Fatalf("%s: answered in %v; a 50-token prefill at 100 tokens/s takes 500ms", s.who, a.elapsed)
		}
		if got := p.status(t).PrefillTokens; got != s.prefilled {
			t.Fatalf("%s: the engine computed %d prompt tokens in all, want %d", s.who, got, s.prefilled)
		}
	}

	// Bad input: vLLM's rules for the two fields.
	for _, bad := range []struct{ body, want string }{
		{`{"model":"chat","messages":[{"role":"user","content":"x"}],"cache_salt":""}`, "cache_salt must be a non-empty string"},
		{`{"model":"chat","messages":[{"role":"user","content":"x"}],"stream_options":{"include_usage":true}}`, "stream_options is only allowed when stream is true"},
	} {
		code, body := postBody(t, p.base+"/v1/chat/completions", bad.body)
		if code != http.StatusBadRequest || !strings.Contains(body, bad.want) {
			t.Errorf("%s: %d %s; want 400 and %q", bad.body, code, body, bad.want)
		}
	}

	// A sleep frees the KV cache, and the prefix cache with it.
	ctl := NewVLLMControls(Target{BaseURL: p.base})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := ctl.Sleep(ctx, SleepOffload); err != nil {
		t.Fatal(err)
	}
	if err := ctl.Wake(ctx); err != nil {
		t.Fatal(err)
	}
	if st := p.status(t); st.PrefixCacheTokens != 0 {
		t.Fatalf("after a sleep the prefix cache holds %d tokens", st.PrefixCacheTokens)
	}
	if a := ask(t, p, &saltA, prompt, false); a.cached != 0 {
		t.Fatalf("after a sleep A's prompt hit %d cached tokens", a.cached)
	}
}

// TestSimCacheBoundedByKVPool: an engine whose KV pool holds 32 tokens
// caches at most two blocks, and evicts the least recently used prompt.
func TestSimCacheBoundedByKVPool(t *testing.T) {
	c := newCard(t)
	p := startSim(t, c, "chat", "--load-seconds", "0", "--tokens-per-second", "0",
		"--memory-mib", "2048", "--overhead-mib", "100", "--kv-pool-mib", "1", "--kv-kib-per-token", "32")
	p.waitHealthy(t)
	salt := "tenant-salt"
	promptOf := func(word string) string { return strings.TrimSpace(strings.Repeat(word+" ", 33)) } // 2 blocks reusable
	steps := []struct {
		word   string
		cached int
	}{{"alpha", 0}, {"alpha", 32}, {"beta", 0}, {"alpha", 0}, {"alpha", 32}}
	for i, s := range steps {
		if a := ask(t, p, &salt, promptOf(s.word), false); a.code != http.StatusOK || a.cached != s.cached {
			t.Fatalf("step %d (%s): status %d, %d cached tokens, want %d", i, s.word, a.code, a.cached, s.cached)
		}
		if held := p.status(t).PrefixCacheTokens; held > 32 {
			t.Fatalf("step %d: the cache holds %d tokens, more than the 32 the KV pool holds", i, held)
		}
	}
}

func postBody(t *testing.T, url, body string) (int, string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	return resp.StatusCode, b.String()
}
