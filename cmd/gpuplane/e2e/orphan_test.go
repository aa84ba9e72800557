package e2e

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/internal/testutil"
	"github.com/gpuplane/gpuplane/node/procfs"
)

// running says whether pid is a live process, not a zombie (a killed
// engine reparented to an init that does not reap would otherwise count).
func running(pid int) bool {
	st, err := procfs.ReadStat(pid)
	return err == nil && st.Alive()
}

// logWriters lists the live `gpuplane engine log` processes writing the
// logs of the agent with this data dir.
func logWriters(dataDir string) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		if strings.Contains(string(b), "\x00engine\x00log\x00") && strings.Contains(string(b), dataDir) {
			if pid, err := strconv.Atoi(e.Name()); err == nil && running(pid) {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// TestEnginesDoNotOutliveTheirAgent checks --orphan-grace with real
// processes: after a kill -9 of the agent its engine keeps running; an agent
// restarted within the orphan grace adopts it, and it is still the same
// engine past the first grace; after a second kill -9 with no agent coming
// back, the engine and its log writer are gone once the grace has passed,
// and the engine's log says why.
func TestEnginesDoNotOutliveTheirAgent(t *testing.T) {
	requireBinary(t)
	const grace = 25 * time.Second
	dataDir := filepath.Join(t.TempDir(), "data")
	a := newAgent(t, dataDir)
	a.flags = []string{"--orphan-grace", grace.String()}
	a.start()
	mustGpuplane(t, a.url(), "accelerators", "create", "fast", "--device", "l4")
	mustGpuplane(t, a.url(), "models", "deploy", "chat", "--accelerator", "fast", "--model", "/models/tiny", "--engine", "sim")
	mustGpuplane(t, a.url(), "models", "get", "chat", "--wait", "--wait-timeout", "90s")
	first, ok := readRecord(t, dataDir, "chat", 0)
	if !ok || !running(first.PID) {
		t.Fatalf("no running engine for chat/0 (%+v)", first)
	}

	a.kill()
	killed := time.Now()
	if !running(first.PID) {
		t.Fatal("the engine died with its agent: it must wait the orphan grace for an agent to adopt it")
	}
	a.start()
	testutil.Until(t, 60*time.Second, "chat/0 to be running under the new agent", func() bool { return replica(t, a.url(), "chat").State == "running" })
	if now, _ := readRecord(t, dataDir, "chat", 0); now.PID != first.PID {
		t.Fatalf("the restarted agent runs engine %d for chat/0, not the one it should have adopted (%d)", now.PID, first.PID)
	}
	// Past the grace counted from the kill, the adopted engine still runs:
	// its log writer saw the new agent.
	time.Sleep(time.Until(killed.Add(grace + 5*time.Second)))
	if !running(first.PID) {
		t.Fatalf("the adopted engine %d was stopped after the grace although an agent runs", first.PID)
	}

	a.kill()
	if !running(first.PID) {
		t.Fatal("the engine died with its agent: it must wait the orphan grace")
	}
	testutil.Until(t, grace+90*time.Second, "the orphaned engine to stop", func() bool { return !running(first.PID) })
	testutil.Until(t, 60*time.Second, "the orphaned engine's log writer to exit", func() bool { return len(logWriters(dataDir)) == 0 })
	if pids := enginePIDs(t, dataDir, "chat"); len(pids) > 0 {
		t.Errorf("sim engines %v of chat still run after the grace", pids)
	}
	log, err := os.ReadFile(filepath.Join(dataDir, "engines", "chat", "0", "engine.log"))
	if want := "no agent has run for " + grace.String() + " (the orphan grace): stopping the engine"; err != nil || !strings.Contains(string(log), want) {
		t.Errorf("engine.log lacks %q (%v):\n%s", want, err, log)
	}
}
