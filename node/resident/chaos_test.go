package resident

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuplane/gpuplane/node/executor"
	"github.com/gpuplane/gpuplane/node/inventory"
	"github.com/gpuplane/gpuplane/node/residency"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// bin is the gpuplane binary TestMain builds: the sim engines are real
// processes of it.
var bin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "resident-test-")
	if err != nil {
		panic(err)
	}
	bin = filepath.Join(dir, "gpuplane")
	build := exec.Command("go", "build", "-o", bin, "./cmd/gpuplane")
	build.Dir = filepath.Join("..", "..")
	build.Env = append(os.Environ(), "CGO_CFLAGS=-Wno-deprecated-declarations")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build gpuplane: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

const node = "node-a"

// source hands the executor the snapshots it is given.
type source struct{ ch chan executor.Snapshot }

func (s *source) Watch(context.Context, string, uint64) (<-chan executor.Snapshot, error) {
	return s.ch, nil
}

// reporter accepts every report; it keeps the residency transitions.
type reporter struct {
	mu          sync.Mutex
	transitions map[string][]string
}

func (r *reporter) Report(_ context.Context, st *pb.ReplicaStatus) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if st.Residency != pb.ReplicaResidency_REPLICA_RESIDENCY_UNSPECIFIED {
		r.transitions[st.Model] = append(r.transitions[st.Model], st.Residency.String()+": "+st.ResidencyReason)
	}
	return nil
}

// model is one deployment of the chaos test.
type model struct {
	name      string
	residency pb.Residency
	percent   uint32
}

func desired(m model, card *pb.Card, generation uint64) executor.Desired {
	mib := card.GetMemoryMib() * uint64(m.percent) / 100
	return executor.Desired{
		Replica: &pb.Replica{Model: m.name, Generation: generation, Node: node, Accelerator: "shared",
			Cards: []uint32{0}, ShareMilli: m.percent * 10, MemoryMib: mib, PlacedIndex: generation,
			State: pb.ReplicaState_REPLICA_STATE_PLACED},
		Spec: &pb.ModelSpec{Model: "sim://" + m.name, ServedModelName: m.name, Replicas: 1, Residency: m.residency,
			Engine: &pb.EngineSpec{Kind: "sim", MemoryPercent: m.percent,
				Args: []string{"--load-seconds", "0.3", "--wake-seconds", "0.1", "--tokens-per-second", "200"}}},
	}
}

// TestChaosKeepsTheLedgerInvariants drives a card shared by a pinned, a
// warm and three onDemand models, with real sim engines, through random
// requests at the fronts, engine crashes (SIGKILL) and deployment changes
// for a bounded time, and checks at every sample, from the simulated
// NVML's numbers and not from the controller's books, that the card never
// holds more than its usable memory (I1) and that the non-pinned engines
// never hold the pinned share (I2). Every request gets an answer or an
// explicit OpenAI-shaped error (503 refused, 502 cut off by a crash), never
// a dropped connection; the controller reports no violation.
func TestChaosKeepsTheLedgerInvariants(t *testing.T) {
	duration := 20 * time.Second
	if testing.Short() {
		duration = 10 * time.Second
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("GPUPLANE_CHAOS_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	t.Logf("seed %d (GPUPLANE_CHAOS_SEED reruns it)", seed)
	rng := rand.New(rand.NewPCG(seed, 0))

	dataDir := t.TempDir()
	cards, err := inventory.Simulated(node, "l4=1")
	if err != nil {
		t.Fatal(err)
	}
	card := cards[0]
	usageDir := filepath.Join(dataDir, "sim-nvml")
	lib := inventory.NewSimNVML(cards, inventory.NewSimUsage(usageDir))
	logger := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo}))
	journal := residency.NewJournal(node, 0)
	mgr := New(Options{Node: node, Cards: cards, NVML: lib, Journal: journal, BindHost: "127.0.0.1",
		Wait: 20 * time.Second, Tick: 200 * time.Millisecond, Logger: logger,
		Config: residency.Config{MinResidency: time.Second, IdleSleep: 3 * time.Second, IdleUnload: 6 * time.Second,
			DrainDeadline: 5 * time.Second, RetryBackoff: 200 * time.Millisecond, MaxBackoff: 2 * time.Second}})
	src := &source{ch: make(chan executor.Snapshot, 16)}
	rep := &reporter{transitions: map[string][]string{}}
	ex, err := executor.New(src, rep, executor.Options{Node: node, DataDir: dataDir, Cards: cards, Self: bin,
		SimUsageDir: usageDir, BindHost: "127.0.0.1", AdvertiseHost: "127.0.0.1", GracePeriod: 2 * time.Second,
		HealthInterval: 50 * time.Millisecond, Gate: mgr, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var loops sync.WaitGroup
	loops.Go(func() { _ = ex.Run(ctx) })
	loops.Go(func() { mgr.Run(ctx, ex) })
	defer func() {
		cancel()
		loops.Wait()
	}()

	models := []model{
		{"base", pb.Residency_RESIDENCY_PINNED, 20},
		{"warm", pb.Residency_RESIDENCY_WARM, 25},
		{"a", pb.Residency_RESIDENCY_ON_DEMAND, 40},
		{"b", pb.Residency_RESIDENCY_ON_DEMAND, 35},
		{"c", pb.Residency_RESIDENCY_ON_DEMAND, 30},
	}
	usable := int64(card.GetMemoryMib()) << 20 * 95 / 100
	pinnedShare := int64(card.GetMemoryMib()*20/100) << 20
	generation := map[string]uint64{}
	present := map[string]bool{}
	var index uint64
	publish := func() {
		index++
		var ds []executor.Desired
		for _, m := range models {
			if present[m.name] {
				ds = append(ds, desired(m, card, generation[m.name]))
			}
		}
		src.ch <- executor.Snapshot{Index: index, Replicas: ds}
	}
	for _, m := range models {
		generation[m.name], present[m.name] = 1, true
	}
	publish()

	// The checker samples the simulated NVML, attributing each process to
	// its replica by the executor's engine list (its pid).
	var checks, violations int
	var firstViolation string
	checkOnce := func() {
		byPID := map[uint32]string{}
		for _, e := range ex.Engines() {
			byPID[uint32(e.PID)] = e.Model
		}
		dev, ret := lib.DeviceGetHandleByUUID(card.GetUuid())
		if ret != nvml.SUCCESS {
			t.Fatalf("simulated NVML: %v", ret)
		}
		procs, ret := dev.GetComputeRunningProcesses()
		if ret != nvml.SUCCESS {
			t.Fatalf("simulated NVML: %v", ret)
		}
		var total, others int64
		for _, p := range procs {
			total += int64(p.UsedGpuMemory)
			if byPID[p.Pid] != "base" {
				others += int64(p.UsedGpuMemory)
			}
		}
		checks++
		var v string
		switch {
		case total > usable:
			v = fmt.Sprintf("%s I1: engines hold %d MiB, usable %d MiB: %+v by %v", time.Now().Format("15:04:05.000"), total>>20, usable>>20, procs, byPID)
		case others > usable-pinnedShare:
			v = fmt.Sprintf(time.Now().Format("15:04:05.000")+" I2: non-pinned engines hold %d MiB, more than usable %d MiB minus the pinned share %d MiB", others>>20, usable>>20, pinnedShare>>20)
		}
		if v != "" {
			for _, cv := range journal.Cards() {
				v += fmt.Sprintf("\n\tthe controller's ledger then: %+v", cv.Ledger)
			}
			violations++
			if firstViolation == "" {
				firstViolation = v
			}
		}
	}
	checkDone := make(chan struct{})
	var checker sync.WaitGroup
	checker.Go(func() {
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-checkDone:
				return
			case <-tick.C:
				checkOnce()
			}
		}
	})

	// Fronts: every model but the pinned one is served at its own.
	frontOf := func(name string) string {
		mgr.mu.Lock()
		defer mgr.mu.Unlock()
		if f := mgr.fronts[rkey{name, 0}]; f != nil {
			return f.url
		}
		return ""
	}
	var reqs sync.WaitGroup
	var resMu sync.Mutex
	answered := map[string]int{}
	var bad []string
	client := &http.Client{Timeout: time.Minute}
	request := func(name, url string) {
		body := `{"model":"` + name + `","messages":[{"role":"user","content":"hi"}],"max_tokens":8}`
		resp, err := client.Post(url+"/v1/chat/completions", "application/json", bytes.NewBufferString(body))
		resMu.Lock()
		defer resMu.Unlock()
		if err != nil {
			bad = append(bad, fmt.Sprintf("%s: %v", name, err))
			return
		}
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var e struct {
			Error struct{ Message string } `json:"error"`
		}
		switch {
		case resp.StatusCode == http.StatusOK:
			answered[name]++
		case (resp.StatusCode == http.StatusServiceUnavailable || resp.StatusCode == http.StatusBadGateway) &&
			json.Unmarshal(data, &e) == nil && e.Error.Message != "":
			// Refused (not loaded in time, the replica left) or cut
			// off by a crash, with an explicit error.
		default:
			bad = append(bad, fmt.Sprintf("%s: %s %s", name, resp.Status, data))
		}
	}
	managed := []string{"warm", "a", "b", "c"}
	deadline := time.Now().Add(duration)
	kills, changes := 0, 0
	for time.Now().Before(deadline) {
		time.Sleep(time.Duration(50+rng.IntN(250)) * time.Millisecond)
		switch p := rng.IntN(100); {
		case p < 80:
			name := managed[rng.IntN(len(managed))]
			if url := frontOf(name); url != "" {
				reqs.Go(func() { request(name, url) })
			}
		case p < 90:
			engines := ex.Engines()
			if len(engines) > 0 {
				e := engines[rng.IntN(len(engines))]
				_ = syscall.Kill(e.PID, syscall.SIGKILL)
				logger.Info("chaos: kill -9", "replica", e.Model, "pid", e.PID)
				kills++
			}
		default:
			// c leaves the node or comes back; a's spec changes.
			if rng.IntN(2) == 0 {
				present["c"] = !present["c"]
				generation["c"]++
			} else {
				generation["a"]++
			}
			publish()
			logger.Info("chaos: deployments changed", "c", present["c"], "generations", fmt.Sprint(generation))
			changes++
		}
	}
	reqs.Wait()
	close(checkDone)
	checker.Wait()
	t.Logf("%d samples, %d kills, %d deployment changes, answered %v", checks, kills, changes, answered)
	if violations > 0 {
		t.Errorf("%d of %d samples broke an invariant; first: %s", violations, checks, firstViolation)
	}
	for _, b := range bad {
		t.Errorf("request neither answered nor refused with 503: %s", b)
	}
	for _, v := range journal.Cards() {
		if v.Violations > 0 {
			t.Errorf("controller of card %s found %d violations", v.Card, v.Violations)
		}
	}
	swaps := 0
	ds, _ := journal.Decisions(0)
	for _, d := range ds {
		if d.Action == residency.ActSleep || d.Action == residency.ActEvict {
			swaps++
		}
	}
	if swaps == 0 || len(answered) < 2 {
		t.Errorf("the run exercised too little: %d sleeps or evictions, answered %v", swaps, answered)
	}
}
