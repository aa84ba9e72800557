package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/internal/testutil"
)

// replicaJSON is the part of `replicas list -o json` these tests read.
type replicaJSON struct {
	Model    string `json:"model"`
	Index    uint32 `json:"index"`
	State    string `json:"state"`
	Reason   string `json:"reason"`
	Restarts uint32 `json:"restarts"`
	Endpoint string `json:"endpoint"`
}

// replica reads model/0 from `replicas list`.
func replica(t *testing.T, addr, model string) replicaJSON {
	t.Helper()
	var rs []replicaJSON
	if err := json.Unmarshal([]byte(mustGpuplane(t, addr, "replicas", "list", "--model", model, "-o", "json")), &rs); err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		if r.Index == 0 {
			return r
		}
	}
	t.Fatalf("no replica %s/0 in %v", model, rs)
	return replicaJSON{}
}

// TestStuckEngineDoesNotHoldItsCard checks start deadlines through the
// real binary, on a node with one simulated card: a sim engine that never
// becomes ready (its load takes a day) with a 5 s startTimeout, and a
// healthy deployment applied after it. Both shares fit the card, so the
// second starts and runs beside the first without waiting for it; the
// first is Failed at its deadline with a reason that says so.
func TestStuckEngineDoesNotHoldItsCard(t *testing.T) {
	requireBinary(t)
	dataDir := filepath.Join(t.TempDir(), "data")
	a := newAgent(t, dataDir)
	a.flags = []string{"--sim-gpus", "l4=1"}
	a.start()
	mustGpuplane(t, a.url(), "accelerators", "create", "shared", "--device", "l4", "--tenancy", "shared", "--max-models", "2")
	stuck := `resource: ModelDeployment
resourceVersion: v1
metadata: {name: stuck}
spec:
  model: /models/stuck
  placement: {accelerator: shared}
  engine: {kind: sim, memoryPercent: 40, startTimeout: 5s, args: [--load-seconds, "86400"]}
`
	path := filepath.Join(t.TempDir(), "stuck.yaml")
	if err := os.WriteFile(path, []byte(stuck), 0o644); err != nil {
		t.Fatal(err)
	}
	mustGpuplane(t, a.url(), "apply", "-f", path)
	testutil.Until(t, 60*time.Second, "stuck/0 to start", func() bool { return replica(t, a.url(), "stuck").State == "starting" })
	mustGpuplane(t, a.url(), "models", "deploy", "chat", "--accelerator", "shared", "--model", "/models/chat",
		"--engine", "sim", "--memory-percent", "40", "--start-timeout", "2m")

	var waiting, failed string
	testutil.Until(t, 90*time.Second, "chat/0 to run", func() bool {
		c, s := replica(t, a.url(), "chat"), replica(t, a.url(), "stuck")
		if c.State == "placed" && strings.HasPrefix(c.Reason, "waiting for card") && waiting == "" {
			waiting = c.Reason
		}
		if s.State == "failed" && failed == "" {
			failed = s.Reason
		}
		return c.State == "running"
	})
	if waiting != "" {
		t.Errorf("chat/0 waited for the card (%q): sim engines whose shares fit start side by side", waiting)
	}
	// The failure is in the log even if no listing caught it.
	const deadline = "engine not ready within its start timeout of 5s (spec.engine.startTimeout): GET /health on port "
	var events string
	testutil.Until(t, 60*time.Second, "stuck/0 to fail at its deadline", func() bool {
		events = mustGpuplane(t, a.url(), "audit", "log", "--resource", "model/stuck")
		return strings.Contains(failed+events, deadline)
	})
}

// TestEngineDiedWhileTheAgentWasDown checks restart counts across a real
// agent restart: the agent is killed, then its engine, then the agent is
// started again. The replica is reported Failed (the engine exited while
// the agent was down) before it starts again, and its restart count goes
// on from the one the cluster recorded instead of starting over at 0.
func TestEngineDiedWhileTheAgentWasDown(t *testing.T) {
	requireBinary(t)
	dataDir := filepath.Join(t.TempDir(), "data")
	a := newAgent(t, dataDir)
	a.start()
	t.Cleanup(func() {
		for _, pid := range enginePIDs(t, dataDir, "chat") {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	mustGpuplane(t, a.url(), "accelerators", "create", "shared", "--device", "l4", "--tenancy", "shared", "--max-models", "2")
	mustGpuplane(t, a.url(), "models", "deploy", "chat", "--accelerator", "shared", "--model", "/models/tiny",
		"--engine", "sim", "--memory-percent", "40")
	mustGpuplane(t, a.url(), "models", "get", "chat", "--wait", "--wait-timeout", "60s")

	// One crash while the agent watches: restarts 1.
	first, ok := readRecord(t, dataDir, "chat", 0)
	if !ok {
		t.Fatal("no pid.json for chat/0")
	}
	if err := syscall.Kill(first.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testutil.Until(t, 60*time.Second, "chat/0 to run again", func() bool {
		r := replica(t, a.url(), "chat")
		return r.State == "running" && r.Restarts == 1
	})
	second, ok := readRecord(t, dataDir, "chat", 0)
	if !ok || second.PID == first.PID {
		t.Fatalf("no new engine for chat/0 after its restart (%v)", second)
	}

	// The agent dies, then its engine; then the agent comes back.
	a.kill()
	if err := syscall.Kill(second.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testutil.Until(t, 10*time.Second, "the engine to die", func() bool { return !alive(second.PID) })
	a.start()
	var seen []string
	var reset *replicaJSON
	testutil.Until(t, 60*time.Second, "chat/0 to run after the agent's restart", func() bool {
		r := replica(t, a.url(), "chat")
		if len(seen) == 0 || seen[len(seen)-1] != r.State {
			seen = append(seen, r.State)
		}
		if r.Restarts < 1 && reset == nil {
			reset = &r
		}
		third, ok := readRecord(t, dataDir, "chat", 0)
		return r.State == "running" && ok && third.PID != second.PID && alive(third.PID)
	})
	t.Logf("states listed after the restart: %v", seen)
	if reset != nil {
		t.Errorf("chat/0's restart count went back to %d after the agent's restart: %+v", reset.Restarts, *reset)
	}
	if r := replica(t, a.url(), "chat"); r.Restarts != 2 {
		t.Errorf("chat/0 has restarts %d after a crash and a death while the agent was down, want 2", r.Restarts)
	}
	// What the new agent reported, in the log's order: first that the
	// engine had died, then the new start, with the count carried on.
	reports := statusReports(t, a.url(), "chat")
	last := -1
	for i, r := range reports {
		if r.State == "running" && r.Restarts == 1 {
			last = i
		}
	}
	var after []string
	for _, r := range reports[last+1:] {
		after = append(after, fmt.Sprintf("%s %q restarts %d", r.State, r.Reason, r.Restarts))
	}
	want := []string{`failed "engine exited while the node agent was down" restarts 2`, `starting "" restarts 2`, `running "" restarts 2`}
	if last < 0 || !slices.Equal(after, want) {
		t.Errorf("after the agent's restart chat/0 was reported\n%s\nwant\n%s\n(all reports: %+v)", strings.Join(after, "\n"), strings.Join(want, "\n"), reports)
	}
}

// statusReport is a ReplicaStatus command as `audit log -o json` prints it.
type statusReport struct {
	State    string `json:"state"`
	Reason   string `json:"reason"`
	Restarts uint32 `json:"restarts"`
}

// statusReports returns the status reports about model/0 in the log, in
// its order.
func statusReports(t *testing.T, addr, model string) []statusReport {
	t.Helper()
	var events []json.RawMessage
	if err := json.Unmarshal([]byte(mustGpuplane(t, addr, "audit", "log", "--resource", "model/"+model, "-o", "json")), &events); err != nil {
		t.Fatal(err)
	}
	var out []statusReport
	for _, ev := range events {
		var find func(v any)
		find = func(v any) {
			switch v := v.(type) {
			case map[string]any:
				if st, ok := v["replicaStatus"].(map[string]any); ok {
					b, _ := json.Marshal(st)
					var r statusReport
					if err := json.Unmarshal(b, &r); err != nil {
						t.Fatal(err)
					}
					out = append(out, r)
					return
				}
				for _, x := range v {
					find(x)
				}
			case []any:
				for _, x := range v {
					find(x)
				}
			}
		}
		var v any
		if err := json.Unmarshal(ev, &v); err != nil {
			t.Fatal(err)
		}
		find(v)
	}
	return out
}
