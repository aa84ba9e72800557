package cardmanager

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/internal/testutil"
	"github.com/gpuplane/gpuplane/node/executor"
	"github.com/gpuplane/gpuplane/node/inventory"
	"github.com/gpuplane/gpuplane/node/residency"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// TestFrontOutlivesAnOlderPlacementAppliedLate: the executor takes two
// snapshots in a row, the first placing a pinned coder alone, the second
// a warm writer beside it, while the manager's loop is busy (as on a
// loaded machine, where it runs late). The writer's supervisor opens the
// writer's front (Hold) and reports it as the replica's endpoint before
// the loop applies the first snapshot's placement, which does not have the
// writer. Once the loop runs, the warm writer loads, and a request at the
// endpoint the node reported must be answered: the older placement, seen
// late, must not close the front the newer one opened (its replica would
// go on reporting, and gateways go on dialling, a closed port).
func TestFrontOutlivesAnOlderPlacementAppliedLate(t *testing.T) {
	dataDir := t.TempDir()
	cards, err := inventory.Simulated(node, "l4=1")
	if err != nil {
		t.Fatal(err)
	}
	usageDir := dataDir + "/sim-nvml"
	lib := inventory.NewSimNVML(cards, inventory.NewSimUsage(usageDir))
	logger := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo}))
	src := &source{ch: make(chan executor.Snapshot, 4)}
	rep := &reporter{transitions: map[string][]string{}}
	mgr := New(Options{Node: node, Cards: cards, NVML: lib, Journal: residency.NewJournal(node, 0), BindHost: "127.0.0.1",
		DataDir: dataDir, Wait: 30 * time.Second, Tick: 200 * time.Millisecond, Logger: logger,
		Config: residency.Config{MinResidency: time.Second, IdleSleep: time.Hour, IdleUnload: time.Hour,
			DrainDeadline: drainDeadline, RetryBackoff: 200 * time.Millisecond, MaxBackoff: 2 * time.Second}})
	ex, err := executor.New(src, rep, executor.Options{Node: node, DataDir: dataDir, Cards: cards, Self: bin,
		SimUsageDir: usageDir, BindHost: "127.0.0.1", AdvertiseHost: "127.0.0.1", GracePeriod: 2 * time.Second,
		HealthInterval: 200 * time.Millisecond, Gate: mgr, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var loops sync.WaitGroup
	loops.Go(func() { _ = ex.Run(ctx) })
	loops.Go(func() { mgr.Run(ctx, ex) })
	t.Cleanup(func() {
		src.ch <- executor.Snapshot{Index: 100}
		for end := time.Now().Add(30 * time.Second); len(ex.Engines()) > 0 && time.Now().Before(end); {
			time.Sleep(50 * time.Millisecond)
		}
		cancel()
		loops.Wait()
	})

	// The loop is busy until released (released at the latest as the
	// test ends, before the engines are stopped).
	busy := make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(busy) }) }
	t.Cleanup(release)
	mgr.post(func() { <-busy })

	coder := model{"coder", pb.Residency_RESIDENCY_PINNED, 30}
	writer := model{"writer", pb.Residency_RESIDENCY_WARM, 40}
	src.ch <- executor.Snapshot{Index: 1, Replicas: []executor.Desired{desired(coder, cards[0], 1)}}
	src.ch <- executor.Snapshot{Index: 2, Replicas: []executor.Desired{desired(coder, cards[0], 1), desired(writer, cards[0], 1)}}
	testutil.Until(t, 30*time.Second, "writer's front reported as its endpoint", func() bool {
		return rep.endpoint("writer") != ""
	})
	release()

	endpoint := rep.endpoint("writer")
	client := &http.Client{Timeout: time.Minute}
	resp, err := client.Post(endpoint+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"writer","messages":[{"role":"user","content":"hi"}],"max_tokens":4}`))
	if err != nil {
		t.Fatalf("request for writer at its reported endpoint %s: %v", endpoint, err)
	}
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("request for writer at its reported endpoint %s: %s %s", endpoint, resp.Status, data)
	}
	if now := rep.endpoint("writer"); now != endpoint {
		t.Errorf("writer's endpoint moved from %s to %s while it stayed placed here", endpoint, now)
	}
}
