package cli

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestGetOutputAppliesBack runs against a real dev agent:
// `get -o yaml|json` speaks the descriptor's vocabulary (shared, pinned,
// numbers as numbers) and what it prints for an accelerator or a deployment
// is a document `apply -f` takes back as unchanged.
func TestGetOutputAppliesBack(t *testing.T) {
	run := startDevAgent(t)
	mustRun := func(args ...string) string {
		t.Helper()
		out, errOut, code := run(args...)
		if code != 0 {
			t.Fatalf("gpuplane %s: exit %d: %s", strings.Join(args, " "), code, errOut)
		}
		return out
	}
	file := writeFile(t, `resource: Accelerator
resourceVersion: v1
metadata: {name: small}
spec: {device: l4, tenancy: shared, maxModels: 3}
---
resource: Accelerator
resourceVersion: v1
metadata: {name: fast}
spec: {device: l4}
---
resource: ModelDeployment
resourceVersion: v1
metadata: {name: chat}
spec:
  model: /models/chat
  replicas: 0
  placement: {accelerator: small, nodeSelector: {zone: a}}
  engine:
    kind: sim
    memory: 2Gi
    computePercent: 40
    maxModelLen: 4096
    args: [--verbose]
    env: {A: "1"}
    startTimeout: 90s
    quantization: fp8
  resources: {cpu: 500m, memory: 1Gi}
  priority: interactive
  slo: {ttftMs: 800}
`)
	mustRun("apply", "-f", file)

	for _, get := range [][]string{
		{"-o", "yaml", "models", "get", "chat"},
		{"-o", "json", "models", "get", "chat"},
		{"-o", "yaml", "accelerators", "get", "small"},
		{"-o", "yaml", "accelerators", "get", "fast"},
	} {
		out := mustRun(get...)
		for _, bad := range []string{"RESIDENCY_", "PRIORITY_", "TENANCY_", "UNSPECIFIED", `: "0"`, `: "2048"`} {
			if strings.Contains(out, bad) {
				t.Errorf("%s prints %q, the API's vocabulary, not the descriptor's:\n%s", strings.Join(get, " "), bad, out)
			}
		}
		back := writeFile(t, out)
		applied, errOut, code := run("apply", "-f", back)
		kind := "modeldeployment"
		if get[2] == "accelerators" {
			kind = "accelerator"
		}
		if want := kind + "/" + get[4] + " unchanged\n"; code != 0 || applied != want || errOut != "" {
			t.Errorf("apply -f of what `%s` printed: exit %d, stdout %q, stderr %q; want %q\n%s", strings.Join(get, " "), code, applied, errOut, want, out)
		}
	}

	// A pinned deployment says so (the server keeps the default as
	// unspecified).
	out := mustRun("-o", "yaml", "models", "get", "chat")
	for _, want := range []string{"\n  residency: pinned\n", "\n  priority: interactive\n", "\n    memory: 2048Mi\n", "\n    startTimeout: 1m30s\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("models get -o yaml lacks %q:\n%s", want, out)
		}
	}

	var accs []struct {
		Metadata struct{ Name string }
		Spec     struct{ Tenancy string }
		Status   struct{ MemoryPerModelMib any }
	}
	out = mustRun("-o", "json", "accelerators", "list")
	if err := json.Unmarshal([]byte(out), &accs); err != nil || len(accs) != 2 {
		t.Fatalf("accelerators list -o json: %v\n%s", err, out)
	}
	tenancy := map[string]string{}
	for _, a := range accs {
		tenancy[a.Metadata.Name] = a.Spec.Tenancy
		if _, isNumber := a.Status.MemoryPerModelMib.(float64); !isNumber {
			t.Errorf("accelerator %s: memoryPerModelMib is %#v, want a JSON number", a.Metadata.Name, a.Status.MemoryPerModelMib)
		}
	}
	if tenancy["small"] != "shared" || tenancy["fast"] != "dedicated" {
		t.Errorf("tenancies in -o json = %v, want small shared and fast dedicated", tenancy)
	}
}
