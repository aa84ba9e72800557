package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
	"github.com/gpuplane/gpuplane/proto/gpuplane/v1/gpuplanev1connect"
	"github.com/gpuplane/gpuplane/rpc"
)

// TestAcknowledgedWritesSurviveKill9 is the README's promise: every change is
// fsynced before it is acknowledged, so `kill -9` in the middle of a stream of
// writes loses none that a client was told succeeded, and a restart on the
// same data dir brings them all back without registering the node again.
func TestAcknowledgedWritesSurviveKill9(t *testing.T) {
	requireBinary(t)
	const (
		writers   = 8
		perWriter = 25 // 200 writes at most
		killAfter = 80 // acknowledged writes before the SIGKILL
	)
	a := newAgent(t, filepath.Join(t.TempDir(), "data"))
	a.start()
	accels := gpuplanev1connect.NewAcceleratorServiceClient(rpc.HTTPClient(), a.url())

	var (
		mu        sync.Mutex
		acked     []string
		attempted = map[string]bool{}
		failed    int
	)
	reached := make(chan struct{})
	var once sync.Once
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perWriter {
				name := fmt.Sprintf("k9-%d-%d", w, i)
				mu.Lock()
				attempted[name] = true
				mu.Unlock()
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				_, err := accels.CreateAccelerator(ctx, connect.NewRequest(&pb.CreateAcceleratorRequest{
					Name: name, Spec: &pb.AcceleratorSpec{Device: "l4"},
				}))
				cancel()
				mu.Lock()
				if err != nil {
					// Unknown outcome: the write may or may not have committed.
					failed++
					mu.Unlock()
					return
				}
				acked = append(acked, name)
				n := len(acked)
				mu.Unlock()
				if n >= killAfter {
					once.Do(func() { close(reached) })
				}
			}
		}()
	}
	select {
	case <-reached:
	case <-time.After(40 * time.Second):
		mu.Lock()
		n := len(acked)
		mu.Unlock()
		t.Fatalf("only %d writes acknowledged in 40s\nagent output:\n%s", n, a.out.String())
	}
	a.kill() // writers are still running: some calls are in flight
	wg.Wait()
	t.Logf("%d writes acknowledged before and around the SIGKILL, %d ended with an error", len(acked), failed)
	if failed == 0 {
		t.Logf("every write finished before the kill landed; the test still checks durability but not an in-flight kill")
	}

	// Before the restart, offline audit on the killed node's data dir shows
	// every acknowledged write: the newest may still be only in the Raft
	// write-ahead log (raft/wal/), which the next start moves into raft.db.
	segs, _ := filepath.Glob(filepath.Join(a.dataDir, "raft", "wal", "wal-*.log"))
	var walBytes int64
	for _, s := range segs {
		if fi, err := os.Stat(s); err == nil {
			walBytes += fi.Size()
		}
	}
	t.Logf("killed node left %d write-ahead log segments, %d bytes", len(segs), walBytes)
	// --addr is ignored with --data-dir; point it nowhere to be sure.
	out := mustGpuplane(t, "http://127.0.0.1:1", "audit", "replay", "--data-dir", a.dataDir,
		"--at", time.Now().Add(time.Minute).UTC().Format(time.RFC3339), "-o", "json")
	var replayed struct {
		Accelerators []struct {
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
		} `json:"accelerators"`
	}
	if err := json.Unmarshal([]byte(out), &replayed); err != nil {
		t.Fatalf("audit replay --data-dir -o json: %v\n%s", err, out)
	}
	offline := map[string]bool{}
	for _, acc := range replayed.Accelerators {
		offline[acc.Metadata.Name] = true
	}
	for _, name := range acked {
		if !offline[name] {
			t.Errorf("accelerator %q was acknowledged before kill -9 but offline audit replay of the data dir lacks it", name)
		}
	}
	mustGpuplane(t, "http://127.0.0.1:1", "audit", "verify", "--data-dir", a.dataDir)

	a.start()
	listed := listAcceleratorNames(t, a.url())
	if len(listed) != len(offline) {
		t.Errorf("after restart %d accelerators are listed; offline audit of the killed node's data dir replayed %d", len(listed), len(offline))
	}
	for _, name := range acked {
		if !listed[name] {
			t.Errorf("accelerator %q was acknowledged before kill -9 but is missing after restart", name)
		}
	}
	for name := range listed {
		if !attempted[name] {
			t.Errorf("accelerator %q is listed after restart but was never created", name)
		}
	}
	assertOneNode(t, a.url())
}

// TestCleanRestartAddsNothing restarts an idle agent on the same data dir: the
// node must not register again and the state hash must not move.
func TestCleanRestartAddsNothing(t *testing.T) {
	requireBinary(t)
	a := newAgent(t, filepath.Join(t.TempDir(), "data"))
	a.start()
	initial := status(t, a.url())
	mustGpuplane(t, a.url(), "accelerators", "create", "keep", "--device", "l4")
	before := status(t, a.url())
	if before.StateHash == "" || before.StateHash == initial.StateHash {
		// Otherwise the comparison below could not fail.
		t.Fatalf("state hash %q did not move when an accelerator was created (was %q)", before.StateHash, initial.StateHash)
	}

	a.stop()
	a.start()
	after := status(t, a.url())
	if after.StateHash != before.StateHash {
		log := gpuplane(t, a.url(), "audit", "log")
		t.Errorf("state hash moved across a clean restart with no writes:\nbefore: %s (applied %d)\nafter:  %s (applied %d)\naudit log:\n%s%s",
			before.StateHash, before.AppliedIndex, after.StateHash, after.AppliedIndex, log.stdout, log.stderr)
	}
	assertOneNode(t, a.url())
	if !listAcceleratorNames(t, a.url())["keep"] {
		t.Errorf("accelerator keep is missing after a clean restart")
	}
}

// status reads ClusterService.Status once the agent has applied everything it
// has committed (a restarted leader commits a no-op of its own first).
func status(t *testing.T, url string) *pb.StatusResponse {
	t.Helper()
	c := gpuplanev1connect.NewClusterServiceClient(rpc.HTTPClient(), url)
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err := c.Status(ctx, connect.NewRequest(&pb.StatusRequest{}))
		cancel()
		if err == nil && resp.Msg.AppliedIndex >= resp.Msg.CommitIndex {
			return resp.Msg
		}
		if time.Now().After(deadline) {
			t.Fatalf("ClusterService.Status: applied index never caught up with commit: %v, %v", resp, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// listAcceleratorNames lists accelerators through the CLI binary, as JSON.
func listAcceleratorNames(t *testing.T, url string) map[string]bool {
	t.Helper()
	out := mustGpuplane(t, url, "accelerators", "list", "-o", "json")
	var list []struct {
		Metadata struct {
			Name string `json:"name"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("accelerators list -o json: %v\n%s", err, out)
	}
	names := map[string]bool{}
	for _, a := range list {
		names[a.Metadata.Name] = true
	}
	return names
}

// assertOneNode checks that the node is registered exactly once.
func assertOneNode(t *testing.T, url string) {
	t.Helper()
	out := mustGpuplane(t, url, "nodes", "list", "-o", "json")
	var nodes []struct {
		Name string `json:"name"`
	}
	if err := json.Unmarshal([]byte(out), &nodes); err != nil {
		t.Fatalf("nodes list -o json: %v\n%s", err, out)
	}
	var names []string
	for _, n := range nodes {
		names = append(names, n.Name)
	}
	if !slices.Equal(names, []string{"e2e"}) {
		t.Errorf("nodes after restart = %v, want exactly [e2e]", names)
	}
}
