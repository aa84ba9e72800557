package agent_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/cmd/gpuplane/agent"
	"github.com/gpuplane/gpuplane/internal/testutil"
)

// TestLlamaCppAdaptersThroughTheGateway: a deployment whose engine speaks
// llama.cpp (a sim with dialect llamacpp) takes adapters: its engine
// starts with each as --lora, and a request through the gateway for
// lorachat:sql or poet runs on the base with that adapter applied (the
// engine's own count), a request for the base with none.
func TestLlamaCppAdaptersThroughTheGateway(t *testing.T) {
	n := devNode(t, "llamalora", agent.GatewayConfig{})
	gpuplane(t, n, "accelerators", "create", "shared", "--device", "l4", "--tenancy", "shared", "--max-models", "4")
	applyFile(t, n, `resource: ModelDeployment
resourceVersion: v1
metadata: {name: lorachat}
spec:
  model: /models/lorachat.gguf
  placement: {accelerator: shared}
  engine: {kind: sim, dialect: llamacpp, memoryPercent: 20, args: ["--tokens-per-second", "0"]}
  adapters:
    - {name: sql, source: /adapters/sql.gguf, rank: 8}
    - {name: poet, source: /adapters/poet.gguf, rank: 8}
`)
	base := n.a.GatewayURL()
	waitServed(t, base, "lorachat")
	for _, model := range []string{"lorachat:sql", "poet", "poet", "lorachat"} {
		if code, body := complete(t, base, model); code != http.StatusOK {
			t.Fatalf("request for %s: %d %s", model, code, body)
		}
	}
	var applied map[string]int
	testutil.Eventually(t, 10*time.Second, "the engine's /sim/status", func() error {
		port, err := simPort("lorachat")
		if err != nil {
			return err
		}
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%s/sim/status", port))
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var st struct {
			LoRAApplied map[string]int `json:"lora_applied"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
			return err
		}
		applied = st.LoRAApplied
		return nil
	})
	if applied["/adapters/sql.gguf"] != 1 || applied["/adapters/poet.gguf"] != 2 || len(applied) != 2 {
		t.Fatalf("the engine ran its adapters %v times, want sql once and poet twice", applied)
	}
}

// simPort is the --port of the running sim engine serving name, read from
// its command line.
func simPort(name string) (string, error) {
	dirs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, d := range dirs {
		raw, err := os.ReadFile(d)
		if err != nil {
			continue
		}
		argv := strings.Split(strings.TrimSuffix(string(raw), "\x00"), "\x00")
		i, p := slices.Index(argv, "--served-model-name"), slices.Index(argv, "--port")
		if i >= 0 && i+1 < len(argv) && argv[i+1] == name && p >= 0 && p+1 < len(argv) && slices.Contains(argv, "--lora") {
			return argv[p+1], nil
		}
	}
	return "", fmt.Errorf("no sim engine serving %s", name)
}
