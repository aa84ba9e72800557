package e2e

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/internal/testutil"
)

// engineRecord is the part of the executor's pid.json the tests read.
type engineRecord struct {
	PID      int    `json:"pid"`
	Endpoint string `json:"endpoint"`
	Restarts uint32 `json:"restarts"`
}

func readRecord(t *testing.T, dataDir, model string, replica int) (engineRecord, bool) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dataDir, "engines", model, strconv.Itoa(replica), "pid.json"))
	if err != nil {
		return engineRecord{}, false
	}
	var r engineRecord
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("pid.json: %v", err)
	}
	return r, true
}

func alive(pid int) bool { return pid > 0 && syscall.Kill(pid, 0) == nil }

// enginePIDs lists the live sim engine processes serving model that belong
// to the agent with this data dir (their simulated NVML lives under it).
func enginePIDs(t *testing.T, dataDir, served string) []int {
	t.Helper()
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if len(args) > 2 && args[1] == "engine" && args[2] == "sim" && strings.Contains(string(b), "\x00--served-model-name\x00"+served+"\x00") {
			env, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
			if strings.Contains(string(env), dataDir) {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

func environ(t *testing.T, pid int) map[string]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "environ"))
	if err != nil {
		t.Fatalf("environ of %d: %v", pid, err)
	}
	env := map[string]string{}
	for _, kv := range strings.Split(string(b), "\x00") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			env[k] = v
		}
	}
	return env
}

// TestEnginesRunAsProcesses runs engines through the real binary: a dev agent
// runs a two-replica sim deployment at 40% on one shared accelerator as two
// engine processes with their cards and shares, answers chat completions at
// each endpoint, restarts a killed engine, keeps exactly one engine per
// replica across a kill -9 of the agent, and leaves none after models delete.
func TestEnginesRunAsProcesses(t *testing.T) {
	requireBinary(t)
	dataDir := filepath.Join(t.TempDir(), "data")
	a := newAgent(t, dataDir)
	a.start()
	defer a.kill()
	// A killed agent leaves its engines for the next one to adopt; the test
	// must not leave them behind.
	t.Cleanup(func() {
		for _, pid := range enginePIDs(t, dataDir, "chat") {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	mustGpuplane(t, a.url(), "accelerators", "create", "shared", "--device", "l4", "--tenancy", "shared", "--max-models", "2")
	mustGpuplane(t, a.url(), "models", "deploy", "chat", "--accelerator", "shared", "--model", "/models/tiny",
		"--engine", "sim", "--replicas", "2", "--memory-percent", "40")
	mustGpuplane(t, a.url(), "models", "get", "chat", "--wait", "--wait-timeout", "60s")

	rows := parseTable(t, mustGpuplane(t, a.url(), "replicas", "list", "--model", "chat"))
	if len(rows) != 2 {
		t.Fatalf("want 2 replicas, got %v", rows)
	}
	for _, row := range rows {
		if row["STATE"] != "Running" || !strings.HasPrefix(row["ENDPOINT"], "http://") {
			t.Fatalf("replica not running with an endpoint: %v", row)
		}
		// A chat completion answers at each endpoint.
		body := `{"model":"chat","messages":[{"role":"user","content":"hello"}]}`
		resp, err := http.Post(row["ENDPOINT"]+"/v1/chat/completions", "application/json", bytes.NewBufferString(body))
		if err != nil {
			t.Fatalf("chat completion at %s: %v", row["ENDPOINT"], err)
		}
		out, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(out), `"choices"`) {
			t.Fatalf("chat completion at %s: %d %s", row["ENDPOINT"], resp.StatusCode, out)
		}
	}
	pids := enginePIDs(t, dataDir, "chat")
	if len(pids) != 2 {
		t.Fatalf("want 2 engine processes, found %v", pids)
	}
	for _, pid := range pids {
		env := environ(t, pid)
		if !strings.HasPrefix(env["CUDA_VISIBLE_DEVICES"], "GPU-") {
			t.Errorf("engine %d: CUDA_VISIBLE_DEVICES = %q, want its card's UUID", pid, env["CUDA_VISIBLE_DEVICES"])
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
		if !strings.Contains(string(cmdline), "--memory-mib\x009213\x00") {
			t.Errorf("engine %d: command line lacks its 40%% share (9213 MiB of 23034): %q", pid, cmdline)
		}
	}

	// kill -9 of one engine: the replica restarts and shows its restart count.
	first, ok := readRecord(t, dataDir, "chat", 0)
	if !ok {
		t.Fatal("no pid.json for chat/0")
	}
	if err := syscall.Kill(first.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testutil.Until(t, 60*time.Second, "chat/0 to restart", func() bool {
		r, ok := readRecord(t, dataDir, "chat", 0)
		if !ok || r.PID == first.PID || !alive(r.PID) {
			return false
		}
		rows := parseTable(t, mustGpuplane(t, a.url(), "replicas", "list", "--model", "chat", "-o", "table"))
		return rows[0]["STATE"] == "Running"
	})
	var listed []struct {
		Index    uint32 `json:"index"`
		Restarts uint32 `json:"restarts"`
	}
	if err := json.Unmarshal([]byte(mustGpuplane(t, a.url(), "replicas", "list", "--model", "chat", "-o", "json")), &listed); err != nil {
		t.Fatal(err)
	}
	if listed[0].Restarts < 1 {
		t.Errorf("chat/0 restarts = %d after its engine was killed, want ≥ 1", listed[0].Restarts)
	}
	events := mustGpuplane(t, a.url(), "audit", "log", "--resource", "model/chat")
	if !strings.Contains(events, "Failed") && !strings.Contains(events, "failed") {
		t.Errorf("the engine's failure is not in the log:\n%s", events)
	}

	// The engine's log is kept across its restart and served by the API.
	logs := mustGpuplane(t, a.url(), "replicas", "logs", "chat/0")
	if strings.Count(logs, "\n") < 2 {
		t.Errorf("replicas logs chat/0 printed too little:\n%s", logs)
	}

	// kill -9 of the agent, restart on the same data dir: one engine per replica.
	a.kill()
	a.start()
	mustGpuplane(t, a.url(), "models", "get", "chat", "--wait", "--wait-timeout", "60s")
	if pids := enginePIDs(t, dataDir, "chat"); len(pids) != 2 {
		t.Fatalf("after the agent's restart want exactly 2 engine processes, found %v", pids)
	}

	// models delete stops every engine within the grace period.
	mustGpuplane(t, a.url(), "models", "delete", "chat")
	testutil.Until(t, 20*time.Second, "the engines to stop", func() bool { return len(enginePIDs(t, dataDir, "chat")) == 0 })
}
