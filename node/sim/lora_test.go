package sim

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/internal/testutil"
)

// TestLoRAAdapters: the sim speaks vLLM's runtime LoRA API: an adapter is
// served only while loaded (404 otherwise, as vLLM), at most --max-loras
// are loaded, each one's memory (rank from adapter_config.json) is on the
// simulated card, /v1/models lists loaded adapters under their parent, and
// a sleep leaves none on the card.
func TestLoRAAdapters(t *testing.T) {
	base, usage := startEngine(t, Config{ServedModelName: "chat", MemoryMiB: 1000, OverheadMiB: 100,
		MaxLoRAs: 2, LoRAMiBPerRank: 1, LoRALoad: LoadDist{Fixed: 50 * time.Millisecond}})
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "adapter_config.json"), []byte(`{"r": 64}`), 0o644); err != nil {
		t.Fatal(err)
	}
	chat := func(model string) (int, string) {
		return call(t, "POST", base+"/v1/chat/completions", fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hi"}]}`, model))
	}
	if code, body := chat("sql"); code != http.StatusNotFound || !strings.Contains(body, "The model `sql` does not exist.") {
		t.Fatalf("request for an adapter not loaded: %d %s, want 404", code, body)
	}
	before := usedMiB(t, usage)
	if code, body := call(t, "POST", base+"/v1/load_lora_adapter", `{"lora_name":"sql","lora_path":"`+dir+`"}`); code != http.StatusOK {
		t.Fatalf("load sql: %d %s", code, body)
	}
	if code, body := call(t, "POST", base+"/v1/load_lora_adapter", `{"lora_name":"sql","lora_path":"`+dir+`"}`); code != http.StatusBadRequest || !strings.Contains(body, "already been loaded") {
		t.Fatalf("load sql twice: %d %s, want 400", code, body)
	}
	if code, body := call(t, "POST", base+"/v1/load_lora_adapter", `{"lora_name":"code","lora_path":"/nowhere/code"}`); code != http.StatusOK {
		t.Fatalf("load code: %d %s", code, body)
	}
	// rank 64 × 1 MiB + the default rank 16 × 1 MiB.
	testutil.Until(t, 20*time.Second, "adapter memory on the card", func() bool { return usedMiB(t, usage) == before+64+16 })
	if code, body := call(t, "POST", base+"/v1/load_lora_adapter", `{"lora_name":"law","lora_path":"/nowhere/law"}`); code != http.StatusBadRequest || !strings.Contains(body, "--max-loras 2") {
		t.Fatalf("a third adapter with --max-loras 2: %d %s, want 400", code, body)
	}
	code, body := chat("sql")
	if code != http.StatusOK || !strings.Contains(body, `"model":"sql"`) {
		t.Fatalf("request for loaded sql: %d %s", code, body)
	}
	_, body = call(t, "GET", base+"/v1/models", "")
	var list struct {
		Data []struct{ ID, Parent string }
	}
	if err := json.Unmarshal([]byte(body), &list); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, m := range list.Data {
		ids = append(ids, m.ID+"<"+m.Parent)
	}
	if want := []string{"chat<", "code<chat", "sql<chat"}; !slices.Equal(ids, want) {
		t.Errorf("/v1/models = %v, want %v", ids, want)
	}
	if code, body := call(t, "POST", base+"/v1/unload_lora_adapter", `{"lora_name":"code"}`); code != http.StatusOK {
		t.Fatalf("unload code: %d %s", code, body)
	}
	if code, _ := call(t, "POST", base+"/v1/unload_lora_adapter", `{"lora_name":"code"}`); code != http.StatusNotFound {
		t.Fatalf("unload code twice: %d, want 404", code)
	}
	testutil.Until(t, 20*time.Second, "code's memory freed", func() bool { return usedMiB(t, usage) == before+64 })
	if code, _ := chat("code"); code != http.StatusNotFound {
		t.Fatalf("request for unloaded code: %d, want 404", code)
	}
	if code, body := call(t, "POST", base+"/sleep?level=1", ""); code != http.StatusOK {
		t.Fatalf("sleep: %d %s", code, body)
	}
	if s := getStatus(t, base); len(s.Adapters) != 0 {
		t.Errorf("adapters on the card after a sleep: %v", s.Adapters)
	}
}

// TestLoRAAdaptersShareTheBatch: requests for two loaded adapters run in
// the engine's one batch, both in flight at once.
func TestLoRAAdaptersShareTheBatch(t *testing.T) {
	base, _ := startEngine(t, Config{ServedModelName: "chat", MemoryMiB: 1000, TokensPerSecond: 8,
		LoRALoad: LoadDist{Fixed: time.Millisecond}})
	for _, a := range []string{"a", "b"} {
		if code, body := call(t, "POST", base+"/v1/load_lora_adapter", `{"lora_name":"`+a+`","lora_path":"/x/`+a+`"}`); code != http.StatusOK {
			t.Fatalf("load %s: %d %s", a, code, body)
		}
	}
	var wg sync.WaitGroup
	for _, a := range []string{"a", "b"} {
		wg.Go(func() {
			code, body := call(t, "POST", base+"/v1/completions", `{"model":"`+a+`","prompt":"x","max_tokens":8}`)
			if code != http.StatusOK {
				t.Errorf("%s: %d %s", a, code, body)
			}
		})
	}
	// Both requests are in flight together at some point: one batch.
	testutil.Until(t, 20*time.Second, "both adapters' requests in one batch", func() bool { return getStatus(t, base).InFlight == 2 })
	wg.Wait()
}

// TestDefaultLoRALoadFitsTheTrace: the default distribution reproduces
// the measured quantiles of GenTD26's LoRA loads within 15 %.
func TestDefaultLoRALoadFitsTheTrace(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	n := 100000
	d := make([]float64, n)
	for i := range d {
		d[i] = float64(DefaultLoRALoad.Draw(r).Milliseconds())
	}
	slices.Sort(d)
	for _, q := range []struct {
		p    float64
		want float64
	}{{0.05, 1131}, {0.25, 3571}, {0.5, 4378}, {0.75, 5284}, {0.95, 6767}} {
		got := d[int(q.p*float64(n))]
		if got < q.want*0.85 || got > q.want*1.15 {
			t.Errorf("p%.0f = %.0f ms, the trace's is %.0f ms", q.p*100, got, q.want)
		}
	}
}

func getStatus(t *testing.T, base string) Status {
	t.Helper()
	var st Status
	getJSON(t, base+"/sim/status", &st)
	return st
}
