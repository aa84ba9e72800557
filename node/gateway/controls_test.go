package gateway

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/node/gateway/queue"
	"github.com/gpuplane/gpuplane/node/sim"
)

// send posts body to the gateway at base+path with headers, retrying a
// 503 while the gateway has not placed its replica yet.
func send(t *testing.T, base, path, body string, headers map[string]string) (int, []byte) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		req, _ := http.NewRequest(http.MethodPost, base+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		for k, v := range headers {
			req.Header.Set(k, v)
		}
		resp, err := (&http.Client{Timeout: time.Minute}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable || time.Now().After(deadline) {
			return resp.StatusCode, data
		}
	}
}

// TestGatewayPrivateAdapterByBodyRefused: adapter priv is private to
// tenant acme on a llama.cpp engine. Tenant beta asking for the base model
// with "lora":[{"id":0,"scale":1}] in its body (the adapter by its engine
// id) is refused with 400 naming the field, and the engine never runs
// priv for it; acme's own request for chat:priv runs it once.
func TestGatewayPrivateAdapterByBodyRefused(t *testing.T) {
	engine := simEngineWith(t, sim.Config{ServedModelName: "chat", Dialect: sim.DialectLlamaCpp, TokensPerSecond: 500,
		LlamaLoRA: []string{"/a/priv.gguf"}, LlamaLoRAInitWithoutApply: true})
	_, srv, _ := startGateway(t, Options{Node: "n1", Cluster: fixedView{[]Model{{Served: "chat", Deployment: "chat", Class: queue.Standard,
		Adapters: map[string][]string{"priv": {"acme"}}, AdapterIDs: map[string]int{"priv": 0},
		Replicas: []Replica{{Deployment: "chat", Node: "n1", Endpoint: engine, Kind: "llamacpp", Slots: 2, Running: true, Resident: true}}}}}})
	for _, body := range []string{
		`{"model":"chat","prompt":"hi","max_tokens":3,"lora":[{"id":0,"scale":1}]}`,
		// The same key escaped, and in another case: Go's decoder reads
		// both as lora, so the gateway refuses them as it does lora.
		`{"model":"chat","prompt":"hi","max_tokens":3,"\u006cora":[{"id":0,"scale":1}]}`,
		`{"model":"chat","prompt":"hi","max_tokens":3,"LoRA":[{"id":0,"scale":1}]}`,
	} {
		code, data := send(t, srv.URL, "/v1/completions", body, map[string]string{TenantHeader: "beta"})
		var e struct {
			Error struct {
				Param, Code, Message string
			} `json:"error"`
		}
		_ = json.Unmarshal(data, &e)
		if code != http.StatusBadRequest || e.Error.Param != "lora" || e.Error.Code != "engine_control" || !strings.Contains(e.Error.Message, "NAME:ADAPTER") {
			t.Fatalf("beta's base request with its own lora field %s: %d %s; want 400 engine_control naming lora and how to name an adapter", body, code, data)
		}
	}
	if code, data := send(t, srv.URL, "/v1/completions", `{"model":"chat:priv","prompt":"hi","max_tokens":3}`, map[string]string{TenantHeader: "acme"}); code != http.StatusOK {
		t.Fatalf("acme's request for chat:priv: %d %s", code, data)
	}
	resp, err := http.Get(engine + "/sim/status")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st sim.Status
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	if st.LoRAApplied["/a/priv.gguf"] != 1 {
		t.Fatalf("the engine applied priv %d times, want once (acme's request alone)", st.LoRAApplied["/a/priv.gguf"])
	}
}

// TestGatewayEngineControls: every engine control in the table, sent by a
// client, is refused with 400 naming the field and its rule before
// anything reaches the engine; cache_prompt is taken as false and refused
// as anything but a boolean, a request id as anything but a string.
func TestGatewayEngineControls(t *testing.T) {
	var seen atomic.Int32
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"x","object":"text_completion","choices":[{"index":0,"text":"ok","finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
	}))
	t.Cleanup(engine.Close)
	_, srv, _ := startGateway(t, Options{Node: "n1", Cluster: fixedView{[]Model{{Served: "chat", Deployment: "chat", Class: queue.Standard,
		Replicas: []Replica{{Deployment: "chat", Node: "n1", Endpoint: engine.URL, Kind: "vllm", Running: true, Resident: true}}}}}})
	// The replica is placed: a plain request reaches the engine.
	if code, data := send(t, srv.URL, "/v1/completions", `{"model":"chat","prompt":"hi"}`, nil); code != http.StatusOK {
		t.Fatalf("plain request: %d %s", code, data)
	}
	values := map[string]string{
		"lora": `[{"id":0,"scale":1}]`, "lora_path": `"priv"`, "id_slot": `0`, "slot_id": `1`, "cache_salt": `"acme-salt"`,
		"priority": `-10`, "kv_transfer_params": `{"do_remote_prefill":true}`,
		"bootstrap_host": `"10.0.0.9"`, "bootstrap_port": `8998`, "bootstrap_room": `7`, "data_parallel_rank": `0`,
	}
	for _, ec := range engineControls {
		t.Run(ec.name, func(t *testing.T) {
			before := seen.Load()
			switch ec.action {
			case refuse:
				v, ok := values[ec.name]
				if !ok {
					t.Fatalf("no test value for %s", ec.name)
				}
				for _, val := range []string{v, `null`} {
					code, data := send(t, srv.URL, "/v1/completions", `{"model":"chat","prompt":"hi","`+ec.name+`":`+val+`}`, nil)
					if code != http.StatusBadRequest || !strings.Contains(string(data), `"param":"`+ec.name+`"`) || !strings.Contains(string(data), "engine_control") {
						t.Errorf("%s: %s: %d %s; want 400 engine_control naming the field", ec.name, val, code, data)
					}
				}
			case checkBool:
				code, data := send(t, srv.URL, "/v1/completions", `{"model":"chat","prompt":"hi","`+ec.name+`":"yes"}`, nil)
				if code != http.StatusBadRequest || !strings.Contains(string(data), `"param":"`+ec.name+`"`) {
					t.Errorf("%s: \"yes\": %d %s; want 400 naming the field", ec.name, code, data)
				}
				if seen.Load() != before {
					t.Fatalf("%s: a refused request reached the engine", ec.name)
				}
				code, data = send(t, srv.URL, "/v1/completions", `{"model":"chat","prompt":"hi","`+ec.name+`":false}`, nil)
				if code != http.StatusOK {
					t.Errorf("%s: false: %d %s; a client may give up cache reuse", ec.name, code, data)
				}
				return
			case checkString:
				for _, val := range []string{`5`, `""`, `null`} {
					code, data := send(t, srv.URL, "/v1/completions", `{"model":"chat","prompt":"hi","`+ec.name+`":`+val+`}`, nil)
					if code != http.StatusBadRequest || !strings.Contains(string(data), `"param":"`+ec.name+`"`) {
						t.Errorf("%s: %s: %d %s; want 400 naming the field", ec.name, val, code, data)
					}
				}
				if seen.Load() != before {
					t.Fatalf("%s: a refused request reached the engine", ec.name)
				}
				code, data := send(t, srv.URL, "/v1/completions", `{"model":"chat","prompt":"hi","`+ec.name+`":"bench-1"}`, nil)
				if code != http.StatusOK {
					t.Errorf("%s: a string: %d %s; a request id is passed on", ec.name, code, data)
				}
				return
			}
			if seen.Load() != before {
				t.Fatalf("%s: a refused request reached the engine", ec.name)
			}
		})
	}
}
