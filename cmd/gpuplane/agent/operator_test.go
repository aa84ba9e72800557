package agent_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/gpuplane/gpuplane/cmd/gpuplane/agent"
	"github.com/gpuplane/gpuplane/internal/testutil"
)

// TestOperatorLoadAndUnload: `models load` brings a cold onDemand model onto
// its card without a request and `models unload` takes it off, each a
// decision with trigger operator; a pinned model's unload and an unknown
// model are refused with the reason, and a request after the unload loads
// the model again as usual.
func TestOperatorLoadAndUnload(t *testing.T) {
	n := devNode(t, "op", agent.GatewayConfig{})
	deploySim(t, n, "pin", "pinned", "--tokens-per-second", "0")
	deploySim(t, n, "lazy", "onDemand", "--tokens-per-second", "0", "--load-seconds", "0.2")
	waitCold(t, n, "lazy")

	out := gpuplane(t, n, "models", "load", "lazy")
	if line, ok := lineOf(out, "lazy/0"); !ok || !strings.Contains(line, " load ") || !strings.Contains(line, "asked by the operator") {
		t.Fatalf("models load lazy:\n%s", out)
	}
	t.Logf("models load lazy:\n%s", out)
	waitReplica(t, n, "lazy", "Resident")
	operatorDecision(t, n, "lazy/0", "load")

	// Loading a loaded model does nothing and says so.
	out = gpuplane(t, n, "models", "load", "lazy")
	if line, ok := lineOf(out, "lazy/0"); !ok || !strings.Contains(line, " none ") || !strings.Contains(line, "already resident") {
		t.Errorf("models load of a resident model:\n%s", out)
	}

	out = gpuplane(t, n, "models", "unload", "lazy")
	if line, ok := lineOf(out, "lazy/0"); !ok || !strings.Contains(line, " unload ") {
		t.Fatalf("models unload lazy:\n%s", out)
	}
	waitReplica(t, n, "lazy", "Cold")
	operatorDecision(t, n, "lazy/0", "unload")
	// The transitions are committed with their reasons: an auditor reads
	// the operator's load and unload in the log, with who asked (the API
	// caller: anonymous without ACLs).
	testutil.Eventually(t, 30*time.Second, "the operator's actions in the audit log", func() error {
		out, err := tryCLI(n, "audit", "log", "--resource", "model/lazy")
		if err != nil {
			return err
		}
		for _, want := range []string{"loading (load lazy/0: asked by the operator (anonymous)", "cold (unload lazy/0: asked by the operator (anonymous)"} {
			if !strings.Contains(out, want) {
				return fmt.Errorf("no %q in the audit log:\n%s", want, out)
			}
		}
		t.Logf("audit log --resource model/lazy:\n%s", out)
		return nil
	})

	_, err := tryCLI(n, "models", "unload", "pin")
	t.Logf("models unload pin: %v", err)
	if err == nil || !strings.Contains(err.Error(), "pin/0 is pinned") {
		t.Errorf("unload of a pinned model: %v, want a refusal saying it is pinned", err)
	}
	waitReplica(t, n, "pin", "Resident")
	if _, err := tryCLI(n, "models", "load", "nosuch"); err == nil || !strings.Contains(err.Error(), `"nosuch" not found`) {
		t.Errorf("load of an unknown model: %v, want an error naming it", err)
	}

	// The controller still loads it on demand.
	c := openaiClient(n)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := c.Completions.New(ctx, openai.CompletionNewParams{Model: "lazy",
		Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("x")}, MaxTokens: openai.Int(2)}); err != nil {
		t.Fatalf("a request after the operator's unload: %v", err)
	}
}

func lineOf(out, sub string) (string, bool) {
	for line := range strings.SplitSeq(out, "\n") {
		if strings.Contains(line, sub) {
			return line, true
		}
	}
	return "", false
}

// waitReplica waits until model's replica shows state in `replicas list`.
func waitReplica(t *testing.T, n *node, model, state string) {
	t.Helper()
	testutil.Eventually(t, 60*time.Second, model+" "+state, func() error {
		out, err := tryCLI(n, "replicas", "list")
		if err != nil {
			return err
		}
		for line := range strings.SplitSeq(out, "\n") {
			if strings.HasPrefix(line, model+" ") && strings.Contains(line, state) {
				return nil
			}
		}
		return fmt.Errorf("replicas:\n%s", out)
	})
}

// operatorDecision checks that the node recorded action on replica with
// trigger operator.
func operatorDecision(t *testing.T, n *node, replica, action string) {
	t.Helper()
	out := gpuplane(t, n, "residency", "decisions", "--model", replica, "-o", "json")
	type dec struct{ Action, Model, Trigger, Reason string }
	var ds []dec
	if err := json.Unmarshal([]byte(out), &ds); err != nil {
		t.Fatalf("residency decisions: %v: %s", err, out)
	}
	if !slices.ContainsFunc(ds, func(d dec) bool {
		return d.Action == action && d.Model == replica && d.Trigger == "operator" && strings.Contains(d.Reason, "asked by the operator")
	}) {
		t.Errorf("no %s of %s with trigger operator among %+v", action, replica, ds)
	}
}

// TestOperatorLoadMakesRoom: on a --dev agent whose card holds two idle
// onDemand sim models of 45 % each, `models load` of a third unloads one of
// them to make room (listed with the load, an evict decision with trigger
// operator naming the load) and then loads it; the model that stays keeps
// answering.
func TestOperatorLoadMakesRoom(t *testing.T) {
	n := devNode(t, "room", agent.GatewayConfig{})
	gpuplane(t, n, "accelerators", "create", "shared", "--device", "l4", "--tenancy", "shared", "--max-models", "4")
	for _, name := range []string{"a", "b", "c"} {
		applySpec(t, n, name, fmt.Sprintf(`resource: ModelDeployment
resourceVersion: v1
metadata: {name: %s}
spec:
  model: /models/%s
  residency: onDemand
  placement: {accelerator: shared}
  engine: {kind: sim, memoryPercent: 45, args: ["--tokens-per-second", "0", "--load-seconds", "0.2"]}
`, name, name))
	}
	waitServed(t, n.a.GatewayURL(), "a")
	waitServed(t, n.a.GatewayURL(), "b")
	waitReplica(t, n, "a", "Resident")
	waitReplica(t, n, "b", "Resident")
	waitCold(t, n, "c")

	out := gpuplane(t, n, "models", "load", "c")
	t.Logf("models load c:\n%s", out)
	evicted := ""
	for _, m := range []string{"a/0", "b/0"} {
		if line, ok := lineOf(out, " "+m+" "); ok && strings.Contains(line, " evict ") && strings.Contains(line, "makes room for c/0") {
			evicted = m
		}
	}
	if evicted == "" {
		t.Fatalf("models load c lists no idle model unloaded to make room:\n%s", out)
	}
	waitReplica(t, n, "c", "Resident")
	waitReplica(t, n, strings.TrimSuffix(evicted, "/0"), "Cold")
	operatorDecision(t, n, "c/0", "load")
	out = gpuplane(t, n, "residency", "decisions", "--model", evicted, "-o", "json")
	if !strings.Contains(out, `"trigger": "operator"`) || !strings.Contains(out, "makes room for c/0") {
		t.Errorf("no evict of %s with trigger operator for c/0:\n%s", evicted, out)
	}
	kept := "a"
	if evicted == "a/0" {
		kept = "b"
	}
	waitServed(t, n.a.GatewayURL(), kept)
}
