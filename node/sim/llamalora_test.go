package sim

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// loraApplied is the engine's count of requests per --lora adapter.
func loraApplied(t *testing.T, base string) map[string]int {
	t.Helper()
	code, body := call(t, http.MethodGet, base+"/sim/status", "")
	if code != http.StatusOK {
		t.Fatalf("GET /sim/status: %d %s", code, body)
	}
	var st Status
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatal(err)
	}
	return st.LoRAApplied
}

// The llamacpp dialect's adapters, as llama-server's: --lora files get ids
// 0.. in order, listed by GET /lora-adapters with their global scale (0
// with --lora-init-without-apply); a request's "lora" applies those it
// names, an id past the last is 400 "invalid adapter id"; POST
// /lora-adapters sets the global scales. A slot does not reuse a prompt
// cached under other adapters.
func TestSimLlamaCppLoRA(t *testing.T) {
	base, _ := startEngine(t, Config{ServedModelName: "m", MemoryMiB: 1024, Dialect: DialectLlamaCpp,
		LlamaLoRA: []string{"/a/sql.gguf", "/a/poet.gguf"}, LlamaLoRAInitWithoutApply: true})
	code, body := call(t, http.MethodGet, base+"/lora-adapters", "")
	var list []struct {
		ID    int     `json:"id"`
		Path  string  `json:"path"`
		Scale float64 `json:"scale"`
	}
	if err := json.Unmarshal([]byte(body), &list); code != http.StatusOK || err != nil || len(list) != 2 ||
		list[0].ID != 0 || list[0].Path != "/a/sql.gguf" || list[1].ID != 1 || list[1].Scale != 0 {
		t.Fatalf("GET /lora-adapters: %d %s", code, body)
	}
	complete := func(extra string) (int, string) {
		return call(t, http.MethodPost, base+"/v1/completions", `{"model":"m","prompt":"a b c d e f g h","max_tokens":1,"id_slot":0`+extra+`}`)
	}
	if code, body := complete(""); code != http.StatusOK {
		t.Fatalf("base request: %d %s", code, body)
	}
	if got := loraApplied(t, base); len(got) != 0 {
		t.Fatalf("a request naming no adapter ran with %v; --lora-init-without-apply leaves them at 0", got)
	}
	if code, body := complete(`,"lora":[{"id":1,"scale":1}]`); code != http.StatusOK {
		t.Fatalf("request for adapter 1: %d %s", code, body)
	}
	if got := loraApplied(t, base); got["/a/poet.gguf"] != 1 || got["/a/sql.gguf"] != 0 {
		t.Fatalf("after a request for adapter 1: %v", got)
	}
	if got := cachedOf(t, base, "a b c d e f g h", `,"id_slot":0,"lora":[{"id":1,"scale":1}]`); got == 0 {
		t.Errorf("the same prompt and adapter in the same slot reused nothing")
	}
	if got := cachedOf(t, base, "a b c d e f g h", `,"id_slot":0,"lora":[{"id":0,"scale":1}]`); got != 0 {
		t.Errorf("slot 0 reused %d tokens cached under another adapter", got)
	}
	code, body = complete(`,"lora":[{"id":2,"scale":1}]`)
	if code != http.StatusBadRequest || !strings.Contains(body, "invalid adapter id") {
		t.Fatalf("request for adapter 2 of 2: %d %s; want 400 invalid adapter id", code, body)
	}
	if code, body := call(t, http.MethodPost, base+"/lora-adapters", `[{"id":0,"scale":0.5}]`); code != http.StatusOK {
		t.Fatalf("POST /lora-adapters: %d %s", code, body)
	}
	before := loraApplied(t, base)["/a/sql.gguf"]
	if code, body := complete(""); code != http.StatusOK {
		t.Fatalf("base request: %d %s", code, body)
	}
	if got := loraApplied(t, base)["/a/sql.gguf"]; got != before+1 {
		t.Errorf("with adapter 0's global scale at 0.5 a request naming none ran without it (%d, was %d)", got, before)
	}
}
