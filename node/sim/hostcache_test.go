package sim

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/gpuplane/gpuplane/internal/realengine"
	"github.com/gpuplane/gpuplane/internal/tinygguf"
)

// Two tenants' prompts, of distinct words (the sim's tokens).
var (
	hostPromptA = "the private prompt of one tenant, long enough to be worth caching: " + strings.Repeat("alpha beta gamma ", 10)
	hostPromptB = "something else entirely, another tenant's prompt about delta epsilon zeta eta theta"
)

// cachedTokens sends prompt to base (in slot, unless slot < 0) and
// returns its prompt tokens and the cached ones.
func cachedTokens(t *testing.T, base, prompt string, slot int) (promptTokens, cached int) {
	t.Helper()
	body := `{"prompt":` + strconv.Quote(prompt) + `,"max_tokens":2,"temperature":0`
	if slot >= 0 {
		body += `,"id_slot":` + strconv.Itoa(slot)
	}
	var v struct {
		Usage struct {
			Prompt  int `json:"prompt_tokens"`
			Details struct {
				Cached int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		}
	}
	post(t, base+"/v1/completions", body+"}", &v)
	return v.Usage.Prompt, v.Usage.Details.Cached
}

// hostCacheSim is a llama.cpp sim engine of one slot with the KV the
// host cache's memory is counted in (1 MiB a token).
func hostCacheSim(cacheRAM, parallel int) Config {
	return Config{ServedModelName: "tiny", MemoryMiB: 2048, KVPoolMiB: 1024, KVKiBPerToken: 1024, Dialect: DialectLlamaCpp,
		Parallel: parallel, CacheRAMMiB: cacheRAM}
}

// TestLlamaCppHostCacheRestoresAcrossSlots: with llama-server's default
// --cache-ram a slot's prompt is saved to host RAM when another request
// takes the slot, the engine reports that memory as its host memory (its
// status and its record on the simulated card), and a later request
// with that prompt gets it back, whoever sent it; with --cache-ram 0
// the engine holds no host memory and reuses nothing.
func TestLlamaCppHostCacheRestoresAcrossSlots(t *testing.T) {
	wordsA, wordsB := len(strings.Fields(hostPromptA)), len(strings.Fields(hostPromptB))
	for _, c := range []struct {
		cacheRAM int
		on       bool
	}{{DefaultCacheRAMMiB, true}, {-1, true}, {0, false}} {
		t.Run(fmt.Sprintf("--cache-ram %d", c.cacheRAM), func(t *testing.T) {
			base, usage := startEngine(t, hostCacheSim(c.cacheRAM, 1))
			hostMiB := func() (uint64, uint64) {
				var st Status
				getJSON(t, base+"/sim/status", &st)
				engines, err := usage.Engines("GPU-a")
				if err != nil || len(engines) != 1 {
					t.Fatalf("the card's engine records: %v %v", engines, err)
				}
				return st.HostMiB, engines[0].HostMiB
			}
			cachedTokens(t, base, hostPromptA, -1) // tenant a
			cachedTokens(t, base, hostPromptB, -1) // tenant b: a's prompt goes to host RAM
			wantMiB := uint64(0)
			if c.on {
				wantMiB = uint64(wordsA) // 1 MiB a token
			}
			if st, rec := hostMiB(); st != wantMiB || rec != wantMiB {
				t.Errorf("after two prompts the engine holds %d MiB of host memory (the card's record: %d); want %d", st, rec, wantMiB)
			}
			_, cached := cachedTokens(t, base, hostPromptA, -1) // tenant b sends a's prompt
			if want := 0; c.on {
				if want = wordsA - 1; cached != want {
					t.Errorf("a's prompt from host RAM: %d cached tokens, want %d", cached, want)
				}
			} else if cached != want {
				t.Errorf("with --cache-ram 0: %d cached tokens, want none", cached)
			}
			// The restored prompt left the cache; b's went in.
			if c.on {
				wantMiB = uint64(wordsB)
			}
			if st, rec := hostMiB(); st != wantMiB || rec != wantMiB {
				t.Errorf("after the restore the engine holds %d MiB of host memory (the card's record: %d); want %d", st, rec, wantMiB)
			}
		})
	}
}

// TestLlamaCppHostCacheNotForNamedSlots: a request naming its slot
// neither saves nor restores, as in llama-server: with two slots, a's
// prompt run in slot 0 is no hit in slot 1.
func TestLlamaCppHostCacheNotForNamedSlots(t *testing.T) {
	base, _ := startEngine(t, hostCacheSim(DefaultCacheRAMMiB, 2))
	cachedTokens(t, base, hostPromptA, 0)
	cachedTokens(t, base, hostPromptB, 1)
	if _, cached := cachedTokens(t, base, hostPromptA, 1); cached != 0 {
		t.Errorf("a's prompt of slot 0 in slot 1: %d cached tokens, want none", cached)
	}
	if _, cached := cachedTokens(t, base, hostPromptA, 1); cached == 0 {
		t.Error("a's prompt again in slot 1: no cached tokens; the slot's own cache should hold it")
	}
}

// TestLlamaCppHostCacheLimit: past --cache-ram the oldest prompt goes, so
// the host memory stays within it and the evicted prompt is computed again.
func TestLlamaCppHostCacheLimit(t *testing.T) {
	wordsA := len(strings.Fields(hostPromptA))
	base, _ := startEngine(t, hostCacheSim(wordsA+1, 1)) // room for a's prompt alone
	cachedTokens(t, base, hostPromptA, -1)
	cachedTokens(t, base, hostPromptB, -1)
	cachedTokens(t, base, "a third prompt of other words: one two three four five six seven eight", -1)
	var st Status
	getJSON(t, base+"/sim/status", &st)
	if st.HostMiB > uint64(wordsA+1) {
		t.Errorf("the host cache holds %d MiB past --cache-ram %d", st.HostMiB, wordsA+1)
	}
	if _, cached := cachedTokens(t, base, hostPromptA, -1); cached != 0 {
		t.Errorf("a's prompt, evicted: %d cached tokens, want none", cached)
	}
}

// TestRealLlamaCppHostCacheLikeTheSim: the same requests sent to
// llama-server and to the sim in its dialect, each with llama-server's
// default --cache-ram and with 0, reuse another request's prompt in the
// same cases: through the host cache when no slot is named (one slot, and
// llama-server's auto slots), never across named slots; with auto slots
// (a unified KV cache) a new task empties the idle slots into the cache.
func TestRealLlamaCppHostCacheLikeTheSim(t *testing.T) {
	f := tinygguf.Write(t, "ok")
	type step struct {
		prompt string
		slot   int
		hit    bool // most of the prompt cached
	}
	for _, c := range []struct {
		name     string
		parallel int // 0: auto
		cacheRAM int
		steps    []step
	}{
		{"one slot, defaults", 1, DefaultCacheRAMMiB, []step{{hostPromptA, -1, false}, {hostPromptB, -1, false}, {hostPromptA, -1, true}, {hostPromptB, -1, true}}},
		{"one slot, --cache-ram 0", 1, 0, []step{{hostPromptA, -1, false}, {hostPromptB, -1, false}, {hostPromptA, -1, false}}},
		{"auto slots, defaults", 0, DefaultCacheRAMMiB, []step{{hostPromptA, -1, false}, {hostPromptB, -1, false}, {hostPromptA, -1, true}, {hostPromptB, -1, true}}},
		// Every new task saves the other idle slots to the cache and
		// clears them (a unified KV cache): a's slot forgets its prompt.
		{"auto slots named, defaults", 0, DefaultCacheRAMMiB, []step{{hostPromptA, 0, false}, {hostPromptB, 1, false}, {hostPromptA, 0, false}}},
		{"auto slots named, --cache-ram 0", 0, 0, []step{{hostPromptA, 0, false}, {hostPromptB, 1, false}, {hostPromptA, 0, true}}},
		{"named slots, defaults", 2, DefaultCacheRAMMiB, []step{{hostPromptA, 0, false}, {hostPromptB, 1, false}, {hostPromptA, 1, false}, {hostPromptA, 1, true}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, side := range []string{"sim", "real"} {
				var base string
				if side == "sim" {
					base, _ = startEngine(t, hostCacheSim(c.cacheRAM, c.parallel))
				} else {
					args := []string{"-m", f.Model, "-c", "1024", "--cache-ram", strconv.Itoa(c.cacheRAM)}
					if c.parallel > 0 {
						args = append(args, "--parallel", strconv.Itoa(c.parallel))
					}
					base = realengine.StartLlamaServer(t, args...)
				}
				for i, s := range c.steps {
					n, cached := cachedTokens(t, base, s.prompt, s.slot)
					if hit := 2*cached > n; hit != s.hit {
						t.Errorf("%s: step %d (slot %d): %d of %d prompt tokens cached; want most: %v", side, i+1, s.slot, cached, n, s.hit)
					}
				}
			}
		})
	}
}
