package agent_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/cmd/gpuplane/agent"
	"github.com/gpuplane/gpuplane/internal/testutil"
)

// applyFile applies a descriptor through the CLI.
func applyFile(t *testing.T, n *node, spec string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "d.yaml")
	if err := os.WriteFile(path, []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	gpuplane(t, n, "apply", "-f", path)
}

// complete sends one completion for model through the gateway at base and
// returns the status and the body.
func complete(t *testing.T, base, model string) (int, string) {
	t.Helper()
	resp, err := http.Post(base+"/v1/completions", "application/json",
		strings.NewReader(fmt.Sprintf(`{"model":%q,"prompt":"ping","max_tokens":2}`, model)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// jsonList runs a listing command with -o json.
func jsonList(n *node, args ...string) ([]map[string]any, error) {
	out, err := tryCLI(n, append([]string{"-o", "json"}, args...)...)
	if err != nil {
		return nil, err
	}
	var items []map[string]any
	if err := json.Unmarshal([]byte(out), &items); err != nil {
		return nil, fmt.Errorf("%v: %s", err, out)
	}
	return items, nil
}

// num reads a JSON number, written as a number or (int64) a string.
func num(v any) int64 {
	switch x := v.(type) {
	case float64:
		return int64(x)
	case string:
		n, _ := strconv.ParseInt(x, 10, 64)
		return n
	}
	return 0
}

// TestVariantsAreSeparateResidents checks variants on a --dev agent: two
// quantizations of one model are two residents, each with its
// own learned footprint and load, two rows in `residency profiles`.
func TestVariantsAreSeparateResidents(t *testing.T) {
	n := devNode(t, "variants", agent.GatewayConfig{})
	gpuplane(t, n, "accelerators", "create", "shared", "--device", "l4", "--tenancy", "shared", "--max-models", "4")
	for _, v := range []struct {
		quant   string
		percent int
	}{{"fp8", 15}, {"bf16", 30}} {
		applyFile(t, n, fmt.Sprintf(`resource: ModelDeployment
resourceVersion: v1
metadata: {name: llama-%s}
spec:
  model: /models/llama
  residency: onDemand
  placement: {accelerator: shared}
  engine: {kind: sim, quantization: %s, memoryPercent: %d, args: ["--load-seconds", "0.2"]}
`, v.quant, v.quant, v.percent))
	}
	base := n.a.GatewayURL()
	for _, m := range []string{"llama-fp8", "llama-bf16"} {
		waitServed(t, base, m)
	}
	var rows []map[string]any
	testutil.Eventually(t, 60*time.Second, "a profile per variant with its footprint", func() error {
		var err error
		if rows, err = jsonList(n, "residency", "profiles"); err != nil {
			return err
		}
		foot := map[string]int64{}
		for _, r := range rows {
			if r["model"] != "/models/llama" || num(r["loads"]) != 1 {
				return fmt.Errorf("profile %v: want model /models/llama with its one load", r)
			}
			foot[fmt.Sprint(r["quantization"])] = num(r["footprintBytes"])
		}
		if len(rows) != 2 || foot["fp8"] == 0 || foot["bf16"] <= foot["fp8"] {
			return fmt.Errorf("profiles %v: want fp8 and bf16 apart, bf16's footprint the larger", rows)
		}
		return nil
	})
	out := gpuplane(t, n, "residency", "profiles")
	var lines []string
	for l := range strings.SplitSeq(out, "\n") {
		if strings.Contains(l, "/models/llama") {
			lines = append(lines, l)
		}
	}
	if len(lines) != 2 || !strings.Contains(out, " fp8 ") || !strings.Contains(out, " bf16 ") {
		t.Errorf("residency profiles, want one row per variant:\n%s", out)
	}
}

// TestAliasesShareOneResidentCopy: two endpoints on one base — a served
// name and an alias — both answer from one engine, charged once on the
// card, and learn one profile.
func TestAliasesShareOneResidentCopy(t *testing.T) {
	n := devNode(t, "aliases", agent.GatewayConfig{})
	gpuplane(t, n, "accelerators", "create", "shared", "--device", "l4", "--tenancy", "shared", "--max-models", "4")
	gpuplane(t, n, "models", "deploy", "chat", "--accelerator", "shared", "--model", "/models/chat", "--engine", "sim",
		"--memory-percent", "20", "--residency", "onDemand", "--alias", "helpdesk")
	base := n.a.GatewayURL()
	waitServed(t, base, "helpdesk")
	for _, m := range []string{"chat", "helpdesk", "helpdesk", "chat"} {
		if code, body := complete(t, base, m); code != http.StatusOK {
			t.Fatalf("%s: %d %s", m, code, body)
		}
	}
	resp, err := http.Get(base + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), `"id":"helpdesk"`) || !strings.Contains(string(b), `"id":"chat"`) {
		t.Errorf("/v1/models lacks chat or its alias: %s", b)
	}

	// One replica, one engine, one charge on the card: the card's resident
	// memory is one 20% share, not one per name.
	out, err := tryCLI(n, "-o", "json", "devices", "get", "l4")
	if err != nil {
		t.Fatal(err)
	}
	var dev struct {
		Cards []struct {
			MemoryMib   int64    `json:"memoryMib"`
			ResidentMib int64    `json:"residentMib"`
			Replicas    []string `json:"replicas"`
		} `json:"cards"`
	}
	if err := json.Unmarshal([]byte(out), &dev); err != nil || len(dev.Cards) != 1 {
		t.Fatalf("devices get l4: %v\n%s", err, out)
	}
	c := dev.Cards[0]
	if share := c.MemoryMib * 20 / 100; c.ResidentMib != share || len(c.Replicas) != 1 || c.Replicas[0] != "chat/0" {
		t.Errorf("card: resident %dMi, replicas %v; want one %dMi charge for chat/0\n%s", c.ResidentMib, c.Replicas, share, out)
	}
	rows, err := jsonList(n, "residency", "profiles")
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0]["model"] != "/models/chat" || num(rows[0]["loads"]) != 1 {
		t.Errorf("profiles %v: want one for /models/chat, loaded once for both names", rows)
	}
	plan := gpuplane(t, n, "residency", "plan")
	if strings.Count(plan, "chat/0") != 1 {
		t.Errorf("residency plan, want chat/0 once:\n%s", plan)
	}
}
