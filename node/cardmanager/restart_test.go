package cardmanager

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuplane/gpuplane/node/executor"
	"github.com/gpuplane/gpuplane/node/residency"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// TestRestartedAgentWaitsForTheMemoryOfAdoptedEngines: an agent loads b
// (onDemand, 60% of the card) and is killed, its engines kept; a new agent
// on the same data dir adopts b's engine, which its fresh ledger holds Cold
// and so stops once the engine answers its first health check. A request
// for a (onDemand, 60%: a and b do not fit together) comes at once: a's
// engine must not take the card's memory until b's is gone, so the card
// never holds more than its usable memory, and a is answered. The health
// interval is long so that b's engine outlives the new agent's start by
// seconds, as a busy engine draining its requests would.
func TestRestartedAgentWaitsForTheMemoryOfAdoptedEngines(t *testing.T) {
	dataDir := t.TempDir()
	cards, lib, usageDir := simL4(t, dataDir)
	card := cards[0]
	logger := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo}))
	src := &source{ch: make(chan executor.Snapshot, 4)}
	rep := &reporter{transitions: map[string][]string{}}
	a := model{"a", pb.Residency_RESIDENCY_ON_DEMAND, 60}
	b := model{"b", pb.Residency_RESIDENCY_ON_DEMAND, 60}
	usable := card.GetMemoryMib() * 95 / 100
	if share := card.GetMemoryMib() * 60 / 100; share > usable || 2*share <= usable {
		t.Fatalf("a and b (%d MiB each) must fit the card's usable %d MiB alone, not together", share, usable)
	}

	start := func() *agent {
		ag := &agent{journal: residency.NewJournal(node, 0)}
		ag.mgr = New(Options{Node: node, Cards: cards, NVML: lib, Journal: ag.journal, BindHost: "127.0.0.1",
			DataDir: dataDir, Wait: time.Minute, Tick: 200 * time.Millisecond, Logger: logger,
			Config: residency.Config{MinResidency: time.Second, IdleSleep: time.Hour, IdleUnload: time.Hour,
				DrainDeadline: drainDeadline, RetryBackoff: 200 * time.Millisecond, MaxBackoff: 2 * time.Second}})
		var err error
		ag.ex, err = executor.New(src, rep, executor.Options{Node: node, DataDir: dataDir, Cards: cards, Self: bin,
			SimUsageDir: usageDir, BindHost: "127.0.0.1", AdvertiseHost: "127.0.0.1", GracePeriod: 2 * time.Second,
			HealthInterval: 2 * time.Second, Gate: ag.mgr, Logger: logger, KeepEngines: true})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		ag.cancel = cancel
		ag.loops.Go(func() { _ = ag.ex.Run(ctx) })
		ag.loops.Go(func() { ag.mgr.Run(ctx, ag.ex) })
		return ag
	}
	stopAgent := func(ag *agent) {
		ag.cancel()
		ag.loops.Wait()
	}
	var index uint64
	publish := func(ms ...model) {
		index++
		snap := executor.Snapshot{Index: index}
		for _, m := range ms {
			snap.Replicas = append(snap.Replicas, desired(m, card, 1))
		}
		src.ch <- snap
	}
	frontOf := func(ag *agent, name string) string { return waitFront(t, ag.mgr, name) }
	client := &http.Client{Timeout: 2 * time.Minute}
	ask := func(url, name string) {
		t.Helper()
		body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hi"}],"max_tokens":8}`, name)
		resp, err := client.Post(url+"/v1/chat/completions", "application/json", bytes.NewBufferString(body))
		if err != nil {
			t.Fatalf("request for %s: %v", name, err)
		}
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request for %s: %s %s", name, resp.Status, data)
		}
	}
	held := func() (total uint64, pids []uint32) {
		dev, ret := lib.DeviceGetHandleByUUID(card.GetUuid())
		if ret != nvml.SUCCESS {
			t.Errorf("simulated NVML: %v", ret)
			return 0, nil
		}
		procs, ret := dev.GetComputeRunningProcesses()
		if ret != nvml.SUCCESS {
			t.Errorf("simulated NVML: %v", ret)
			return 0, nil
		}
		for _, p := range procs {
			total += p.UsedGpuMemory >> 20
			pids = append(pids, p.Pid)
		}
		return total, pids
	}

	first := start()
	publish(a, b)
	ask(frontOf(first, "b"), "b")
	var bPID int
	for _, en := range first.ex.Engines() {
		if en.Model == "b" {
			bPID = en.PID
		}
	}
	if bPID == 0 {
		t.Fatal("b answered but has no engine")
	}
	stopAgent(first) // kill -9: the engines are kept

	second := start()
	publish(a, b)
	var mu sync.Mutex
	var worst string
	sawB := false
	done := make(chan struct{})
	var sampler sync.WaitGroup
	sampler.Go(func() {
		for {
			total, pids := held()
			mu.Lock()
			for _, p := range pids {
				sawB = sawB || int(p) == bPID
			}
			if total > usable && worst == "" {
				worst = fmt.Sprintf("the card held %d MiB of %d usable, processes %v (b's adopted engine is %d)", total, usable, pids, bPID)
			}
			mu.Unlock()
			select {
			case <-done:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	})
	ask(frontOf(second, "a"), "a")
	close(done)
	sampler.Wait()
	if !sawB {
		t.Error("b's adopted engine was never seen holding memory under the new agent: the test proves nothing")
	}
	if worst != "" {
		t.Errorf("a loaded while b's adopted engine still held its memory: %s", worst)
	}

	publish()
	for end := time.Now().Add(30 * time.Second); len(second.ex.Engines()) > 0 && time.Now().Before(end); {
		time.Sleep(50 * time.Millisecond)
	}
	stopAgent(second)
}
