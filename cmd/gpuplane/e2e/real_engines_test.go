package e2e

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/internal/porttest"
	"github.com/gpuplane/gpuplane/internal/realengine"
	"github.com/gpuplane/gpuplane/internal/testutil"
	"github.com/gpuplane/gpuplane/internal/tinygguf"
)

// TestRealEnginesAdoptedAfterAgentKill9: the real llama-server and
// `ollama serve`, each serving a GGUF file, run on after their agent is
// killed with SIGKILL; the agent started again on the same data dir
// adopts them (the same processes, no restart, Ollama's model still
// loaded) and they answer through its gateway.
func TestRealEnginesAdoptedAfterAgentKill9(t *testing.T) {
	requireBinary(t)
	bins := t.TempDir()
	for name, path := range map[string]string{"llama-server": realengine.LlamaServer(t), "ollama": realengine.Ollama(t)} {
		if err := os.Symlink(path, filepath.Join(bins, name)); err != nil {
			t.Fatal(err)
		}
	}
	// The agent starts engines from its PATH, as a user installs them.
	t.Setenv("PATH", bins+string(os.PathListSeparator)+os.Getenv("PATH"))
	model := tinygguf.Write(t).Model
	dataDir := filepath.Join(t.TempDir(), "data")
	home := t.TempDir()
	a := newAgent(t, dataDir)
	gateway := "http://127.0.0.1:" + strconv.Itoa(porttest.Free(t))
	a.flags = []string{"--gateway-port", gateway[strings.LastIndex(gateway, ":")+1:], "--sim-gpus", "l4=2"}
	a.start()
	mustGpuplane(t, a.url(), "accelerators", "create", "shared", "--device", "l4", "--tenancy", "shared", "--max-models", "2")
	// Ollama runs on a share of a card only under hard limits: a card of
	// its own.
	mustGpuplane(t, a.url(), "accelerators", "create", "whole", "--device", "l4", "--tenancy", "dedicated")
	spec := filepath.Join(t.TempDir(), "models.yaml")
	if err := os.WriteFile(spec, []byte(fmt.Sprintf(`resource: ModelDeployment
resourceVersion: v1
metadata: {name: ltiny}
spec:
  model: %[1]s
  residency: pinned
  placement: {accelerator: shared}
  engine: {kind: llamacpp, memoryPercent: 20, maxModelLen: 512, args: ["--threads", "1"]}
---
resource: ModelDeployment
resourceVersion: v1
metadata: {name: otiny}
spec:
  model: %[1]s
  residency: pinned
  placement: {accelerator: whole}
  engine: {kind: ollama, env: {OLLAMA_MODELS: %[2]q, HOME: %[3]q}}
`, model, filepath.Join(home, "models"), home)), 0o644); err != nil {
		t.Fatal(err)
	}
	mustGpuplane(t, a.url(), "apply", "-f", spec)
	for _, m := range []string{"ltiny", "otiny"} {
		mustGpuplane(t, a.url(), "models", "get", m, "--wait", "--wait-timeout", "60s")
	}
	before := map[string]engineRecord{}
	for _, m := range []string{"ltiny", "otiny"} {
		r, ok := readRecord(t, dataDir, m, 0)
		if !ok || !alive(r.PID) {
			t.Fatalf("%s/0: no live engine recorded (%+v)", m, r)
		}
		before[m] = r
		askGateway(t, gateway, m)
	}

	a.kill()
	for m, r := range before {
		if !alive(r.PID) {
			t.Fatalf("%s's engine (pid %d) died with its agent", m, r.PID)
		}
	}
	a.start()
	testutil.Eventually(t, 60*time.Second, "both replicas Running again", func() error {
		rows := parseTable(t, mustGpuplane(t, a.url(), "replicas", "list"))
		running := 0
		for _, row := range rows {
			if row["STATE"] == "Running" {
				running++
			}
		}
		if running != 2 {
			return fmt.Errorf("replicas: %v", rows)
		}
		return nil
	})
	for m, was := range before {
		r, ok := readRecord(t, dataDir, m, 0)
		if !ok || r.PID != was.PID || r.Restarts != was.Restarts {
			t.Fatalf("%s/0 after the agent's restart: %+v, want its engine adopted as it was (%+v)", m, r, was)
		}
		askGateway(t, gateway, m)
	}
	// Ollama's model stayed loaded: nothing was preloaded again.
	resp, err := http.Get(before["otiny"].Endpoint + "/api/ps")
	if err != nil {
		t.Fatal(err)
	}
	ps, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(ps), `"name":"tiny:`) {
		t.Fatalf("adopted Ollama lists %s in /api/ps; want its model still loaded", ps)
	}
}

// askGateway sends a completion for model through the agent's gateway; the
// answer names the model as asked.
func askGateway(t *testing.T, gateway, model string) {
	t.Helper()
	body := fmt.Sprintf(`{"model":%q,"prompt":"hello","max_tokens":2}`, model)
	var code int
	var out []byte
	// The gateway learns of the adopted engines from the cluster.
	testutil.Eventually(t, 30*time.Second, model+" answered through the gateway", func() error {
		resp, err := http.Post(gateway+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			return err
		}
		out, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		if code = resp.StatusCode; code != http.StatusOK {
			return fmt.Errorf("%d %s", code, out)
		}
		return nil
	})
	if !strings.Contains(string(out), `"model":"`+model+`"`) || !strings.Contains(string(out), `"choices"`) {
		t.Fatalf("%s through the gateway: %d %s", model, code, out)
	}
}
