package gateway

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/node/gateway/queue"
	"github.com/gpuplane/gpuplane/node/sim"
)

// Against engines speaking strictly (issue 33): the gateway sends each
// engine what it accepts.

// TestGatewayOllamaRequestByServedName (point 2): Ollama knows its model
// only by its tag; a client asking for the deployment's served name is
// answered, because the gateway sends the tag. The engine itself refuses
// the served name with Ollama's 404, and reports no cached_tokens.
func TestGatewayOllamaRequestByServedName(t *testing.T) {
	engine := simEngineWith(t, sim.Config{ServedModelName: "llama3.2:1b", Dialect: sim.DialectOllama})
	body := `{"model":"chat","messages":[{"role":"user","content":"hi"}],"max_tokens":3}`
	resp, err := http.Post(engine+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound || !strings.Contains(string(data), `model \"chat\" not found`) {
		t.Fatalf("the engine asked for the served name: %d %s; want Ollama's 404", resp.StatusCode, data)
	}
	_, srv, _ := startGateway(t, Options{Node: "n1", Cluster: fixedView{[]Model{{Served: "chat", Deployment: "chat", Class: queue.Standard,
		Aliases: []string{"assistant"}, EngineModel: "llama3.2:1b",
		Replicas: []Replica{{Deployment: "chat", Node: "n1", Endpoint: engine, Kind: "ollama", Running: true, Resident: true}}}}}})
	for _, model := range []string{"chat", "assistant"} {
		body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hi"}],"max_tokens":3}`, model)
		var code int
		var data []byte
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			resp, err := http.Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			data, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
			code = resp.StatusCode
			// 503 until the gateway has placed the replica.
			if code != http.StatusServiceUnavailable || time.Now().After(deadline) {
				break
			}
		}
		if code != http.StatusOK {
			t.Fatalf("request for %s: %d %s", model, code, data)
		}
		var v struct {
			Model string         `json:"model"`
			Usage map[string]any `json:"usage"`
		}
		if err := json.Unmarshal(data, &v); err != nil {
			t.Fatal(err)
		}
		// The answer names the model as the engine knows it, as vLLM
		// answers an alias with its served name.
		if v.Model != "llama3.2:1b" {
			t.Fatalf("request for %s answered as model %q, want Ollama's tag llama3.2:1b", model, v.Model)
		}
		if _, ok := v.Usage["prompt_tokens_details"]; ok || v.Usage["completion_tokens"] != float64(3) {
			t.Fatalf("request for %s: usage %v; Ollama reports 3 completion tokens and no cached tokens", model, v.Usage)
		}
	}
}

// TestGatewayLlamaCppAutoSlots (point 6): llama-server without --parallel
// runs 4 slots; the gateway counts 4 (engine.LlamaSlots), so 8 requests
// run four at a time, each in a slot the engine has: its /slots shows all
// four processing at once, never a fifth, and every request is answered.
// (llama-server runs a slot id past its last in that id modulo its slot
// count, so a fifth slot would share another tenant's.)
func TestGatewayLlamaCppAutoSlots(t *testing.T) {
	engine := simEngineWith(t, sim.Config{ServedModelName: "chat", Dialect: sim.DialectLlamaCpp, TokensPerSecond: 20})
	_, srv, _ := startGateway(t, Options{Node: "n1", Cluster: fixedView{[]Model{{Served: "chat", Deployment: "chat", Class: queue.Standard,
		Replicas: []Replica{{Deployment: "chat", Node: "n1", Endpoint: engine, Kind: "llamacpp", Slots: 4, Running: true, Resident: true}}}}}})
	busiest := 0
	stop := make(chan struct{})
	var watch sync.WaitGroup
	watch.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			resp, err := http.Get(engine + "/slots")
			if err != nil {
				continue
			}
			var slots []struct {
				ID           int  `json:"id"`
				IsProcessing bool `json:"is_processing"`
			}
			_ = json.NewDecoder(resp.Body).Decode(&slots)
			resp.Body.Close()
			if len(slots) != 4 {
				t.Errorf("GET /slots lists %d slots, want llama-server's auto 4", len(slots))
				return
			}
			n := 0
			for _, s := range slots {
				if s.IsProcessing {
					n++
				}
			}
			busiest = max(busiest, n)
		}
	})
	var wg sync.WaitGroup
	codes := make(chan int, 8)
	for i := range 8 {
		wg.Go(func() {
			body := fmt.Sprintf(`{"model":"chat","prompt":"request %d","max_tokens":10}`, i)
			for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
				resp, err := (&http.Client{Timeout: time.Minute}).Post(srv.URL+"/v1/completions", "application/json", strings.NewReader(body))
				if err != nil {
					t.Error(err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusServiceUnavailable || time.Now().After(deadline) {
					codes <- resp.StatusCode
					return
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	watch.Wait()
	close(codes)
	for c := range codes {
		if c != http.StatusOK {
			t.Errorf("a request answered %d", c)
		}
	}
	if busiest != 4 {
		t.Fatalf("at most %d slots processed at once, want all 4 of llama-server's auto slots in use", busiest)
	}
}

// TestGatewayLlamaCppAdaptersPerRequest: llama-server loads its adapters
// at start (--lora, --lora-init-without-apply) and applies those a request
// names in "lora". On a 4-slot engine, 12 requests through the gateway for
// chat:sql, poet (bare) and the base, four at a time, are each answered,
// and the engine ran each adapter's requests with that adapter alone and
// the base's with none.
func TestGatewayLlamaCppAdaptersPerRequest(t *testing.T) {
	engine := simEngineWith(t, sim.Config{ServedModelName: "chat", Dialect: sim.DialectLlamaCpp, TokensPerSecond: 200,
		LlamaLoRA: []string{"/a/sql.gguf", "/a/poet.gguf"}, LlamaLoRAInitWithoutApply: true})
	_, srv, _ := startGateway(t, Options{Node: "n1", Cluster: fixedView{[]Model{{Served: "chat", Deployment: "chat", Class: queue.Standard,
		Adapters: map[string][]string{"sql": nil, "poet": nil}, AdapterIDs: map[string]int{"sql": 0, "poet": 1},
		Replicas: []Replica{{Deployment: "chat", Node: "n1", Endpoint: engine, Kind: "llamacpp", Slots: 4, Running: true, Resident: true}}}}}})
	var wg sync.WaitGroup
	for i := range 12 {
		model := []string{"chat:sql", "poet", "chat"}[i%3]
		wg.Go(func() {
			body := fmt.Sprintf(`{"model":%q,"prompt":"request %d","max_tokens":5}`, model, i)
			for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
				resp, err := (&http.Client{Timeout: time.Minute}).Post(srv.URL+"/v1/completions", "application/json", strings.NewReader(body))
				if err != nil {
					t.Error(err)
					return
				}
				data, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusServiceUnavailable && time.Now().Before(deadline) {
					continue
				}
				if resp.StatusCode != http.StatusOK {
					t.Errorf("request for %s: %d %s", model, resp.StatusCode, data)
				}
				return
			}
		})
	}
	wg.Wait()
	resp, err := http.Get(engine + "/sim/status")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st sim.Status
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	if st.LoRAApplied["/a/sql.gguf"] != 4 || st.LoRAApplied["/a/poet.gguf"] != 4 || len(st.LoRAApplied) != 2 {
		t.Fatalf("the engine ran its adapters %v times, want 4 requests each (and none for the base's 4)", st.LoRAApplied)
	}
}
