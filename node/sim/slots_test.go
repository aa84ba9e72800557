package sim

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// cachedOf sends a completion of prompt with extra fields and returns the
// cached prompt tokens it reports.
func cachedOf(t *testing.T, base, prompt, extra string) int {
	t.Helper()
	code, body := call(t, http.MethodPost, base+"/v1/completions",
		`{"model":"m","prompt":`+strconv.Quote(prompt)+`,"max_tokens":1`+extra+`}`)
	if code != http.StatusOK {
		t.Fatalf("completion with %s: %d %s", extra, code, body)
	}
	var v struct {
		Usage struct {
			Details struct {
				Cached int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		t.Fatal(err)
	}
	return v.Usage.Details.Cached
}

// As llama.cpp's slots: a slot reuses the prompt it last ran (all but the
// last token), unless cache_prompt is false; slots share nothing; and
// id_slot must name one of --parallel slots.
func TestSimSlotCache(t *testing.T) {
	base, _ := startEngine(t, Config{ServedModelName: "m", MemoryMiB: 1024, Parallel: 2})
	prompt := strings.Repeat("w ", 39) + "end"
	if got := cachedOf(t, base, prompt, `,"id_slot":0`); got != 0 {
		t.Fatalf("first prompt in slot 0: %d cached tokens, want 0", got)
	}
	if got := cachedOf(t, base, prompt, `,"id_slot":0`); got != 39 {
		t.Errorf("the same prompt again in slot 0: %d cached tokens, want 39", got)
	}
	if got := cachedOf(t, base, prompt, `,"id_slot":1`); got != 0 {
		t.Errorf("slot 1 reused slot 0's prompt: %d cached tokens", got)
	}
	if got := cachedOf(t, base, prompt, `,"id_slot":0,"cache_prompt":false`); got != 0 {
		t.Errorf("cache_prompt false still reused %d tokens", got)
	}
	for _, bad := range []string{`,"id_slot":2`, `,"id_slot":-2`} {
		code, body := call(t, http.MethodPost, base+"/v1/completions", `{"model":"m","prompt":"hi"`+bad+`}`)
		if code != http.StatusBadRequest || !strings.Contains(body, "id_slot") {
			t.Errorf("%s with 2 slots: %d %s; want 400 naming id_slot", bad, code, body)
		}
	}
}
