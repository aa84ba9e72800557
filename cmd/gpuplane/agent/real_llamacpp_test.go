package agent_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/cmd/gpuplane/agent"
	"github.com/gpuplane/gpuplane/internal/realengine"
	"github.com/gpuplane/gpuplane/internal/testutil"
	"github.com/gpuplane/gpuplane/internal/tinygguf"
)

// TestRealLlamaCppThroughTheAgent: a dev agent runs the real llama-server
// (on its PATH) for a deployment of the tiny model with a private adapter,
// under its own API key. Through the gateway and the replica's front a
// base request runs on the base alone and the adapter's request with the
// adapter; the agent's /metrics reads the engine's gauges with its key;
// the engine's own port refuses a request without the key.
func TestRealLlamaCppThroughTheAgent(t *testing.T) {
	bin := realengine.LlamaServer(t)
	dir := t.TempDir()
	if err := os.Symlink(bin, filepath.Join(dir, "llama-server")); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	f := tinygguf.Write(t, "ok")
	n := devNode(t, "realllama", agent.GatewayConfig{})
	gpuplane(t, n, "accelerators", "create", "shared", "--device", "l4", "--tenancy", "shared", "--max-models", "4")
	for _, d := range []struct{ name, residency string }{{"tiny", "pinned"}} {
		spec := fmt.Sprintf(`resource: ModelDeployment
resourceVersion: v1
metadata: {name: %s}
spec:
  model: %s
  residency: %s
  placement: {accelerator: shared}
  adapters:
    - {name: okay, source: %s, rank: 4, tenants: [acme]}
  engine: {kind: llamacpp, memoryPercent: 20, maxModelLen: 256, args: ["--parallel", "2", "--threads", "1", "--no-webui"]}
`, d.name, f.Model, d.residency, f.Adapters["ok"])
		path := filepath.Join(t.TempDir(), d.name+".yaml")
		if err := os.WriteFile(path, []byte(spec), 0o644); err != nil {
			t.Fatal(err)
		}
		gpuplane(t, n, "apply", "-f", path)
	}
	base := n.a.GatewayURL()
	t.Cleanup(func() {
		if t.Failed() {
			for _, m := range []string{"tiny"} {
				b, _ := os.ReadFile(filepath.Join(n.cfg.DataDir, "engines", m, "0", "engine.log"))
				t.Logf("%s's engine log:\n%s", m, b)
			}
			t.Logf("replicas:\n%s", gpuplane(t, n, "replicas", "list"))
		}
	})
	okText := strings.Repeat(" ok", 4)
	for _, model := range []string{"tiny"} {
		waitServed(t, base, model)
		ask := func(name, tenant string) (int, string) {
			req, _ := http.NewRequest("POST", base+"/v1/completions", strings.NewReader(fmt.Sprintf(
				`{"model":%q,"prompt":"hello there","max_tokens":4,"temperature":0}`, name)))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("X-Gpuplane-Tenant", tenant)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			var v struct{ Choices []struct{ Text string } }
			if json.Unmarshal(b, &v) != nil || len(v.Choices) != 1 {
				return resp.StatusCode, string(b)
			}
			return resp.StatusCode, v.Choices[0].Text
		}
		if code, text := ask(model, "bob"); code != http.StatusOK || text == okText {
			t.Errorf("%s for bob: %d %q; want the base model's answer", model, code, text)
		}
		if code, text := ask(model+":okay", "acme"); code != http.StatusOK || text != okText {
			t.Errorf("%s:okay for acme: %d %q; want %q", model, code, text, okText)
		}
		if code, body := ask(model+":okay", "bob"); code != http.StatusNotFound {
			t.Errorf("%s:okay for bob: %d %s; want 404", model, code, body)
		}
	}
	testutil.Eventually(t, 30*time.Second, "gpuplane_engine_requests of tiny's engine", func() error {
		resp, err := http.Get(n.url() + "/metrics")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if !strings.Contains(string(body), `gpuplane_engine_requests{model="tiny",replica="0",state="running"} 0`) {
			return fmt.Errorf("no idle running series for tiny/0")
		}
		return nil
	})
	// The engine's own port (its --port, from its command line; the
	// replica's ENDPOINT is its front, which adds the key).
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		raw, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		argv := strings.Split(string(raw), "\x00")
		if filepath.Base(argv[0]) != "llama-server" || !strings.Contains(string(raw), "\x00--alias\x00tiny\x00") {
			continue
		}
		for i, a := range argv[:len(argv)-1] {
			if a != "--port" {
				continue
			}
			resp, err := http.Post("http://127.0.0.1:"+argv[i+1]+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"hi","max_tokens":1}`))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusUnauthorized {

			}
			return
		}
	}
	t.Error("no llama-server process serves tiny")
}
