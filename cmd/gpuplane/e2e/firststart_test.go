package e2e

import (
	"context"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/internal/porttest"
	"github.com/gpuplane/gpuplane/node/inventory"
)

// TestServerWithoutDriver: as the README's cluster commands run them, a
// server on a host without an NVIDIA driver (and without --sim-gpus) runs
// with no cards and says so; a client node there is an error naming
// --sim-gpus (docs/operations.md).
func TestServerWithoutDriver(t *testing.T) {
	requireBinary(t)
	if _, err := inventory.Detect(inventory.Options{}); err == nil {
		t.Skip("this host has an NVIDIA driver")
	}
	a := newAgent(t, t.TempDir())
	a.mode = []string{"--server", "--bootstrap-expect", "1", "--bind", "127.0.0.1"}
	a.start()
	if out := a.out.String(); !strings.Contains(out, "running as a server with no cards") {
		t.Errorf("the server does not say it runs with no cards; output:\n%s", out)
	}
	rows := parseTable(t, mustGpuplane(t, a.url(), "nodes", "list"))
	if len(rows) != 1 || rows[0]["NAME"] != "e2e" {
		t.Errorf("nodes list = %v; want the server e2e", rows)
	}
	a.stop()

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "agent", "--node-name", "c1", "--data-dir", t.TempDir(), "--bind", "127.0.0.1",
		"--api-port", strconv.Itoa(porttest.Free(t)), "--raft-port", strconv.Itoa(porttest.Free(t)),
		"--gossip-port", strconv.Itoa(porttest.Free(t)), "--gateway-port", "0", "--join", "127.0.0.1:"+strconv.Itoa(a.ports[2]))
	out, err := cmd.CombinedOutput()
	if err == nil || ctx.Err() != nil || !strings.Contains(string(out), "--sim-gpus") {
		t.Errorf("a client node without a driver: %v, output:\n%s\nwant an error naming --sim-gpus", err, out)
	}
}

// TestDevStartPrintsNoWarning: a dev agent's normal start, first or again
// on its data dir, prints no warning at the default log level (raft's
// first election would warn "heartbeat timeout reached").
func TestDevStartPrintsNoWarning(t *testing.T) {
	requireBinary(t)
	a := newAgent(t, t.TempDir())
	a.flags = []string{"--log-level", "warn"}
	for _, start := range []string{"first start", "restart"} {
		a.start()
		// The start is over once the agent has printed its last line.
		deadline := time.Now().Add(60 * time.Second)
		for !strings.Contains(a.out.String(), "security:") && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		a.stop()
		if out := a.out.String(); strings.Contains(out, "WARN") {
			t.Errorf("%s printed a warning:\n%s", start, out)
		}
	}
}
