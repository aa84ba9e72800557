package e2e

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestREADMEWalkthrough runs the README's five-minute walkthrough through the
// real binary against a real agent and checks what the README shows.
func TestREADMEWalkthrough(t *testing.T) {
	requireBinary(t)
	a := newAgent(t, filepath.Join(t.TempDir(), "data"))
	a.start()
	addr := a.url()

	devices := parseTable(t, mustGpuplane(t, addr, "devices", "list"))
	i := slices.IndexFunc(devices, func(r map[string]string) bool { return r["NAME"] == "l4" })
	if i < 0 {
		t.Fatalf("devices list has no l4 row: %v", devices)
	}
	for col, want := range map[string]string{"TOTAL": "2", "FREE": "2", "MAX/NODE": "2", "MEMORY": "23034Mi"} {
		if got := devices[i][col]; got != want {
			t.Errorf("devices list: l4 %s = %q, want %q (row %v)", col, got, want, devices[i])
		}
	}

	nodes := parseTable(t, mustGpuplane(t, addr, "nodes", "list"))
	if len(nodes) != 1 || nodes[0]["NAME"] != "e2e" || nodes[0]["CARDS"] != "l4=2" {
		t.Errorf("nodes list = %v, want one node e2e with CARDS l4=2", nodes)
	}

	if out := mustGpuplane(t, addr, "accelerators", "create", "fast", "--device", "l4"); !strings.Contains(out, "created") {
		t.Errorf("accelerators create fast printed %q, want it to say created", out)
	}
	mustGpuplane(t, addr, "accelerators", "create", "small", "--device", "l4", "--tenancy", "Shared", "--max-models", "2")

	const header = "NAME DEVICE TENANCY CARDS/REPLICA MEMORY/MODEL IN USE CAN PLACE READY"
	const fast = "fast l4 Dedicated 1 23034Mi 0 2 True"
	const small = "small l4 Shared 1 11517Mi 0 4 True"
	wantLines(t, "accelerators list", mustGpuplane(t, addr, "accelerators", "list"), header, fast, small)
	wantLines(t, "accelerators get small", mustGpuplane(t, addr, "accelerators", "get", "small"), header, small)

	mustGpuplane(t, addr, "accelerators", "delete", "fast")
	r := gpuplane(t, addr, "accelerators", "get", "fast")
	if r.code != 1 {
		t.Errorf("accelerators get fast after delete: exit %d, want 1\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	if !strings.HasPrefix(r.stderr, "error: ") || !strings.Contains(r.stderr, "not found") || !strings.Contains(r.stderr, "fast") {
		t.Errorf("accelerators get fast after delete: stderr %q, want an `error: ... \"fast\" not found` message", r.stderr)
	}
	wantLines(t, "accelerators list after delete", mustGpuplane(t, addr, "accelerators", "list"), header, small)
}

// wantLines compares output with want line by line, whitespace-normalised.
func wantLines(t *testing.T, what, out string, want ...string) {
	t.Helper()
	if got := normalise(out); !slices.Equal(got, want) {
		t.Errorf("%s printed:\n%s\nwant (whitespace aside):\n%s", what, strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
