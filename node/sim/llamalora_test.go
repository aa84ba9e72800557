package sim

import (
	"encoding/json"
	"net/http"
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

// The llamacpp dialect's adapters, as the real llama-server's
// (TestRealConformance and node/gateway's TestRealLlamaCpp… check the
// same against the binary): --lora files get ids 0.. in order, listed by
// GET /lora-adapters at global scale 1 even with --lora-init-without-apply;
// a request without a "lora" list runs with every adapter; a list applies
// those it names, ignoring ids that are no adapter's; POST /lora-adapters
// sets the global scales. A slot drops its cached prompt when a request's
// list names other adapters than its last, and keeps it for a request
// without a list.
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
		list[0].ID != 0 || list[0].Path != "/a/sql.gguf" || list[1].ID != 1 || list[1].Scale != 1 {
		t.Fatalf("GET /lora-adapters: %d %s", code, body)
	}
	complete := func(extra string) (int, string) {
		return call(t, http.MethodPost, base+"/v1/completions", `{"model":"m","prompt":"a b c d e f g h","max_tokens":1,"id_slot":0`+extra+`}`)
	}
	if code, body := complete(""); code != http.StatusOK {
		t.Fatalf("base request: %d %s", code, body)
	}
	if got := loraApplied(t, base); got["/a/sql.gguf"] != 1 || got["/a/poet.gguf"] != 1 {
		t.Fatalf("a request naming no adapter ran with %v; llama-server runs it with every adapter at its global scale", got)
	}
	if code, body := complete(`,"lora":[{"id":1,"scale":1}]`); code != http.StatusOK {
		t.Fatalf("request for adapter 1: %d %s", code, body)
	}
	if got := loraApplied(t, base); got["/a/poet.gguf"] != 2 || got["/a/sql.gguf"] != 1 {
		t.Fatalf("after a request for adapter 1: %v", got)
	}
	if got := cachedOf(t, base, "a b c d e f g h", `,"id_slot":0,"lora":[{"id":1,"scale":1}]`); got == 0 {
		t.Errorf("the same prompt and adapter in the same slot reused nothing")
	}
	if got := cachedOf(t, base, "a b c d e f g h", `,"id_slot":0,"lora":[{"id":0,"scale":1}]`); got != 0 {
		t.Errorf("slot 0 reused %d tokens cached under another adapter", got)
	}
	if got := cachedOf(t, base, "a b c d e f g h", `,"id_slot":0`); got == 0 {
		t.Errorf("a request without a lora list did not reuse the slot's cache (llama-server keeps it)")
	}
	before := loraApplied(t, base)
	if code, body := complete(`,"lora":[{"id":2,"scale":1}]`); code != http.StatusOK {
		t.Fatalf("request for adapter 2 of 2: %d %s; llama-server ignores an id that is no adapter's", code, body)
	}
	if got := loraApplied(t, base); got["/a/sql.gguf"] != before["/a/sql.gguf"] || got["/a/poet.gguf"] != before["/a/poet.gguf"] {
		t.Errorf("a request naming only adapter id 2 ran with adapters: %v, was %v", got, before)
	}
	if code, body := call(t, http.MethodPost, base+"/lora-adapters", `[{"id":0,"scale":0.5}]`); code != http.StatusOK {
		t.Fatalf("POST /lora-adapters: %d %s", code, body)
	}
	before = loraApplied(t, base)
	if code, body := complete(""); code != http.StatusOK {
		t.Fatalf("base request: %d %s", code, body)
	}
	if got := loraApplied(t, base); got["/a/sql.gguf"] != before["/a/sql.gguf"]+1 || got["/a/poet.gguf"] != before["/a/poet.gguf"] {
		t.Errorf("with global scales 0.5 and 0 a request naming none ran with %v (was %v)", got, before)
	}
}
