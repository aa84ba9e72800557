package gateway

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/node/gateway/queue"
	"github.com/gpuplane/gpuplane/node/residency"
)

// keep_alive reads as Ollama reads it: seconds or a duration, any
// negative value keeping the model (-1).
func TestParseKeepAlive(t *testing.T) {
	for in, want := range map[string]time.Duration{
		`0`: 0, `30`: 30 * time.Second, `"5m"`: 5 * time.Minute, `"0"`: 0, `-1`: -1, `"-1"`: -1, `"-5m"`: -1, `1.5`: 1500 * time.Millisecond,
	} {
		got, err := residency.ParseKeepAlive(json.RawMessage(in))
		if err != nil || got != want {
			t.Errorf("keep_alive %s: %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{`"soon"`, `true`, `{}`, `[1]`} {
		if _, err := residency.ParseKeepAlive(json.RawMessage(bad)); err == nil {
			t.Errorf("keep_alive %s accepted", bad)
		}
	}
}

// A request with a bad keep_alive is refused (400 naming the field and
// its rule) and nothing is sent; a good one is served, and the engine is
// not sent the gateway's field (the sim would take it; a strict engine
// would not).
func TestGatewayKeepAliveField(t *testing.T) {
	engine := simEngine(t, "chat", 0)
	_, srv, _ := startGateway(t, Options{Node: "n1", Cluster: fixedView{[]Model{{Served: "chat", Deployment: "chat", Class: queue.Standard,
		Replicas: []Replica{{Deployment: "chat", Node: "n1", Endpoint: engine, Kind: "sim", Running: true, Resident: true}}}}}})
	send := func(body string) (int, string) {
		resp, err := http.Post(srv.URL+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if code, _ := send(`{"model":"chat","prompt":"hi","max_tokens":1}`); code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the gateway never served its replica")
		}
	}
	if code, body := send(`{"model":"chat","prompt":"hi","max_tokens":1,"keep_alive":"soon"}`); code != http.StatusBadRequest || !strings.Contains(body, "keep_alive") {
		t.Errorf("keep_alive \"soon\": %d %s; want 400 naming keep_alive", code, body)
	}
	if code, body := send(`{"model":"chat","prompt":"hi","max_tokens":1,"keep_alive":"5m"}`); code != http.StatusOK {
		t.Errorf("keep_alive \"5m\": %d %s; want 200", code, body)
	}
	if b, err := withoutField([]byte(`{"model":"chat","keep_alive":0,"n":1}`), "keep_alive"); err != nil || strings.Contains(string(b), "keep_alive") || !strings.Contains(string(b), `"n":1`) {
		t.Errorf("withoutField: %s %v", b, err)
	}
}
