package cardmanager

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuplane/gpuplane/internal/testutil"
	"github.com/gpuplane/gpuplane/node/engine"
	"github.com/gpuplane/gpuplane/node/executor"
	"github.com/gpuplane/gpuplane/node/inventory"
	"github.com/gpuplane/gpuplane/node/residency"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// tierReporter keeps every adapter-tier report and every residency
// transition.
type tierReporter struct {
	mu      sync.Mutex
	reports [][]*pb.AdapterStatus
	last    *pb.ReplicaStatus
}

func (r *tierReporter) Report(_ context.Context, st *pb.ReplicaStatus) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if st.Adapters != nil {
		r.reports = append(r.reports, st.Adapters.GetAdapters())
	}
	r.last = st
	return nil
}

// adapterNode is a node with one simulated card, its executor and
// residency manager, running real sim engines.
type adapterNode struct {
	t       *testing.T
	card    *pb.Card
	lib     nvml.Interface
	mgr     *Manager
	ex      *executor.Executor
	journal *residency.Journal
	src     *source
	rep     *tierReporter
	index   uint64
	// kill stops the agent's loops (its engines too, unless it keeps
	// them).
	kill func()
}

func newAdapterNode(t *testing.T) *adapterNode { return newAdapterNodeWith(t, nil) }

// newAdapterNodeWith is newAdapterNode with tune changing the residency
// configuration.
func newAdapterNodeWith(t *testing.T, tune func(*residency.Config)) *adapterNode {
	return newAdapterNodeAt(t, t.TempDir(), tune, false)
}

// newAdapterNodeAt is a node on dataDir; with keep its kill leaves the
// engines running for the next agent on dataDir to adopt.
func newAdapterNodeAt(t *testing.T, dataDir string, tune func(*residency.Config), keep bool) *adapterNode {
	return newAdapterNodeEnforcing(t, dataDir, tune, keep, engine.Enforcement{})
}

// newAdapterNodeEnforcing is newAdapterNodeAt whose executor holds engines
// to their shares with enf.
func newAdapterNodeEnforcing(t *testing.T, dataDir string, tune func(*residency.Config), keep bool, enf engine.Enforcement) *adapterNode {
	cards, err := inventory.Simulated(node, "l4=1")
	if err != nil {
		t.Fatal(err)
	}
	usageDir := filepath.Join(dataDir, "sim-nvml")
	n := &adapterNode{t: t, card: cards[0], lib: inventory.NewSimNVML(cards, inventory.NewSimUsage(usageDir)),
		journal: residency.NewJournal(node, 0), src: &source{ch: make(chan executor.Snapshot, 16)}, rep: &tierReporter{}}
	logger := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	cfg := residency.Config{MinResidency: time.Second, RetryBackoff: 200 * time.Millisecond, MaxBackoff: 2 * time.Second}
	if tune != nil {
		tune(&cfg)
	}
	n.mgr = New(Options{Node: node, Cards: cards, NVML: n.lib, Journal: n.journal, BindHost: "127.0.0.1",
		DataDir: dataDir, Wait: time.Minute, Tick: 200 * time.Millisecond, AdapterReport: 300 * time.Millisecond, Logger: logger,
		Config: cfg})
	n.ex, err = executor.New(n.src, n.rep, executor.Options{Node: node, DataDir: dataDir, Cards: cards, Self: bin,
		SimUsageDir: usageDir, BindHost: "127.0.0.1", AdvertiseHost: "127.0.0.1", GracePeriod: 2 * time.Second,
		HealthInterval: 50 * time.Millisecond, Gate: n.mgr, Logger: logger, KeepEngines: keep, Enforcement: enf})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var loops sync.WaitGroup
	loops.Go(func() { _ = n.ex.Run(ctx) })
	loops.Go(func() { n.mgr.Run(ctx, n.ex) })
	killed := false
	n.kill = func() {
		killed = true
		cancel()
		loops.Wait()
	}
	t.Cleanup(func() {
		if killed {
			return
		}
		// Every replica leaves: the executor stops the engines.
		n.publish()
		deadline := time.Now().Add(30 * time.Second)
		for len(n.ex.Engines()) > 0 && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		cancel()
		loops.Wait()
	})
	return n
}

func (n *adapterNode) publish(ds ...executor.Desired) {
	n.index++
	n.src.ch <- executor.Snapshot{Index: n.index, Replicas: ds}
}

// deployment is chat on 40 % of the card with adapters, at most maxOnCard
// of them loaded; the sim draws adapter load times from GenTD26's
// distribution scaled to a fiftieth (median about 90 ms).
func (n *adapterNode) deployment(res pb.Residency, maxOnCard uint32, adapters []*pb.Adapter) executor.Desired {
	mib := n.card.GetMemoryMib() * 40 / 100
	return executor.Desired{
		Replica: &pb.Replica{Model: "chat", Generation: 1, Node: node, Accelerator: "shared",
			Cards: []uint32{0}, MemoryMib: mib, PlacedIndex: 1, State: pb.ReplicaState_REPLICA_STATE_PLACED},
		Spec: &pb.ModelSpec{Model: "sim://chat", ServedModelName: "chat", Replicas: 1, Residency: res, Adapters: adapters,
			Engine: &pb.EngineSpec{Kind: "sim", MemoryPercent: 40, MaxAdapters: maxOnCard,
				Args: []string{"--load-seconds", "0.3", "--tokens-per-second", "400", "--lora-load-scale", "0.02"}}},
	}
}

func (n *adapterNode) front() string { return waitFront(n.t, n.mgr, "chat") }

// waitFront is the URL of model's replica 0's front on m, once it serves
// (30 s at most).
func waitFront(t *testing.T, m *Manager, model string) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		m.mu.Lock()
		f := m.fronts[rkey{model, 0}]
		m.mu.Unlock()
		if f != nil {
			return f.url
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s's front never served", model)
	return ""
}

// ask sends one chat request for model as tenant ("" sends no tenant) and
// returns the status, the answer's model and its error message.
func ask(t *testing.T, url, model, tenant string) (int, string, string) {
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hi"}],"max_tokens":4}`, model)
	req, err := http.NewRequest("POST", url+"/v1/chat/completions", bytes.NewBufferString(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if tenant != "" {
		req.Header.Set(TenantHeader, tenant)
	}
	resp, err := (&http.Client{Timeout: 2 * time.Minute}).Do(req)
	if err != nil {
		t.Errorf("request for %s: %v", model, err)
		return 0, "", ""
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var out struct {
		Model string
		Error struct{ Message string }
	}
	_ = json.Unmarshal(data, &out)
	return resp.StatusCode, out.Model, out.Error.Message
}

func adapterList(n int, rank uint32) []*pb.Adapter {
	out := make([]*pb.Adapter, n)
	for i := range out {
		name := fmt.Sprintf("a%03d", i)
		out[i] = &pb.Adapter{Name: name, Source: "/adapters/" + name, Rank: rank}
	}
	return out
}

// simAdapters is what the engine itself says it has loaded.
func simAdapters(t *testing.T, n *adapterNode) []string {
	st := simStatus(t, n)
	return st.Adapters
}

// simStatus is the engine's own /sim/status (zero while it starts or
// stops).
func simStatus(t *testing.T, n *adapterNode) (st struct {
	State         string
	Level         int
	Adapters      []string
	WeightReloads int `json:"weight_reloads"`
}) {
	done := make(chan string, 1)
	n.mgr.post(func() { done <- n.mgr.engines[rkey{"chat", 0}].url })
	var url string
	select {
	case url = <-done:
	case <-time.After(10 * time.Second):
		return st
	}
	if url == "" {
		return st
	}
	resp, err := http.Get(url + "/sim/status")
	if err != nil {
		return st // the engine is starting or stopping
	}
	defer resp.Body.Close()
	_ = json.NewDecoder(resp.Body).Decode(&st)
	return st
}

// TestManyAdaptersOnOneBase: one onDemand sim base with 200 adapters, at
// most 4 on the card; 300 requests whose adapter follows a Zipf
// popularity, 16 at a time, half naming chat:ADAPTER and half ADAPTER, are
// all answered by their adapter; the engine never holds more than 4, the
// card never more than usable; the tiers reported to the cluster change
// (card, host RAM); the decisions explain the loads and the unloads.
func TestManyAdaptersOnOneBase(t *testing.T) {
	n := newAdapterNode(t)
	n.publish(n.deployment(pb.Residency_RESIDENCY_ON_DEMAND, 4, adapterList(200, 8)))
	url := n.front()

	usable := int64(n.card.GetMemoryMib()) << 20 * 95 / 100
	var maxUsed int64
	maxLoaded := 0
	stop := make(chan struct{})
	var sampler sync.WaitGroup
	sampler.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			dev, _ := n.lib.DeviceGetHandleByUUID(n.card.GetUuid())
			procs, _ := dev.GetComputeRunningProcesses()
			var used int64
			for _, p := range procs {
				used += int64(p.UsedGpuMemory)
			}
			maxUsed = max(maxUsed, used)
			maxLoaded = max(maxLoaded, len(simAdapters(t, n)))
		}
	})

	rng := rand.New(rand.NewPCG(15, 0))
	zipf := rand.NewZipf(rng, 1.1, 1, 199)
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	var mu sync.Mutex
	answered := 0
	var failures []string
	for i := range 300 {
		name := fmt.Sprintf("a%03d", zipf.Uint64())
		model := name
		if i%2 == 0 {
			model = "chat:" + name
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			code, got, msg := ask(t, url, model, "tenant-"+fmt.Sprint(i%5))
			mu.Lock()
			defer mu.Unlock()
			if code == http.StatusOK && got == name {
				answered++
			} else {
				failures = append(failures, fmt.Sprintf("%s: %d %q %s", model, code, got, msg))
			}
		})
	}
	wg.Wait()
	close(stop)
	sampler.Wait()
	if answered != 300 {
		t.Fatalf("%d of 300 adapter requests answered by their adapter; first failures: %v", answered, failures[:min(5, len(failures))])
	}
	if maxLoaded > 4 {
		t.Errorf("the engine held %d adapters at once, more than maxAdapters 4", maxLoaded)
	}
	if maxUsed > usable {
		t.Errorf("the card held %d MiB, more than usable %d MiB", maxUsed>>20, usable>>20)
	}

	// Tiers as the cluster saw them: some adapter on the card, some moved
	// to host RAM, never more than 4 on the card in one report.
	time.Sleep(time.Second)
	n.rep.mu.Lock()
	seen := map[pb.AdapterTier]bool{}
	for _, r := range n.rep.reports {
		onCard := 0
		for _, a := range r {
			seen[a.GetTier()] = true
			if a.GetTier() == pb.AdapterTier_ADAPTER_TIER_CARD || a.GetTier() == pb.AdapterTier_ADAPTER_TIER_LOADING {
				onCard++
			}
		}
		if onCard > 4 {
			t.Errorf("a report has %d adapters on the card: %v", onCard, r)
		}
	}
	reports := len(n.rep.reports)
	n.rep.mu.Unlock()
	if !seen[pb.AdapterTier_ADAPTER_TIER_CARD] || !seen[pb.AdapterTier_ADAPTER_TIER_HOST] {
		t.Errorf("tiers reported in %d reports: %v; want card and host", reports, seen)
	}

	// The decisions explain loads and evictions with their numbers.
	ds, _ := n.journal.Decisions(0)
	var loads, unloads int
	for _, d := range ds {
		switch d.Action {
		case residency.ActLoadAdapter:
			loads++
			if !strings.HasPrefix(d.Reason, "load adapter a") || !strings.Contains(d.Reason, "requests waiting; slot") {
				t.Errorf("load decision %q", d.Reason)
			}
		case residency.ActUnloadAdapter:
			unloads++
			if !strings.Contains(d.Reason, "to host RAM: value") || !strings.Contains(d.Reason, "slots used") {
				t.Errorf("unload decision %q", d.Reason)
			}
		}
	}
	if loads < 5 || unloads == 0 {
		t.Fatalf("%d adapter loads and %d unloads decided; want paging", loads, unloads)
	}
	t.Logf("300 requests over %d adapters: %d loads, %d unloads, %d tier reports, peak card %d MiB", 200, loads, unloads, reports, maxUsed>>20)
}

// TestPrivateAdaptersAndApply: an adapter private to a tenant is refused
// to every other tenant (and to requests without one) with the same 404 as
// an adapter that does not exist, and is never loaded for them; its tenant
// is served. An apply that adds and removes adapters does not restart the
// base (a pinned one here, which gets a front because it has adapters):
// the removed adapter is refused, the added one served, the engine is the
// same process.
func TestPrivateAdaptersAndApply(t *testing.T) {
	n := newAdapterNode(t)
	ads := adapterList(3, 16)
	ads = append(ads, &pb.Adapter{Name: "secret", Source: "/adapters/secret", Rank: 16, Tenants: []string{"acme"}})
	// An adapter whose config cannot be read fails to load: its request
	// is told so, not left to wait out the front's deadline.
	broken := t.TempDir()
	if err := os.WriteFile(filepath.Join(broken, "adapter_config.json"), []byte("{not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	ads = append(ads, &pb.Adapter{Name: "broken", Source: broken, Rank: 16})
	d := n.deployment(pb.Residency_RESIDENCY_UNSPECIFIED, 2, ads)
	n.publish(d)
	url := n.front()
	if code, _, msg := ask(t, url, "broken", ""); code != http.StatusServiceUnavailable || !strings.Contains(msg, "adapter broken of model chat could not be loaded") {
		t.Fatalf("adapter that fails to load: %d %q, want 503 saying why", code, msg)
	}
	for _, tenant := range []string{"", "beta", "acmex"} {
		for _, model := range []string{"secret", "chat:secret"} {
			code, _, msg := ask(t, url, model, tenant)
			if code != http.StatusNotFound || msg != fmt.Sprintf("The model `%s` does not exist.", model) {
				t.Fatalf("tenant %q asking for %s: %d %q, want 404 like an unknown adapter", tenant, model, code, msg)
			}
		}
	}
	if code, _, msg := ask(t, url, "nosuch", "beta"); code != http.StatusNotFound || msg != "The model `nosuch` does not exist." {
		t.Fatalf("unknown adapter: %d %q", code, msg)
	}
	if code, _, _ := ask(t, url, "other:a001", ""); code != http.StatusNotFound {
		t.Fatalf("another base's name with an adapter: %d, want 404", code)
	}
	for _, d := range func() []residency.NodeDecision { ds, _ := n.journal.Decisions(0); return ds }() {
		if d.Action == residency.ActLoadAdapter && strings.Contains(d.Reason, "secret") {
			t.Fatalf("secret was loaded for a tenant that may not use it: %s", d.Reason)
		}
	}
	if code, got, msg := ask(t, url, "chat:secret", "acme"); code != http.StatusOK || got != "secret" {
		t.Fatalf("acme asking for its adapter: %d %q %s", code, got, msg)
	}
	// Loaded now, still refused to others.
	if code, _, _ := ask(t, url, "secret", "beta"); code != http.StatusNotFound {
		t.Fatalf("beta asking for acme's loaded adapter: %d, want 404", code)
	}
	if code, got, _ := ask(t, url, "a001", "beta"); code != http.StatusOK || got != "a001" {
		t.Fatalf("public adapter: %d %q", code, got)
	}
	pid := 0
	for _, e := range n.ex.Engines() {
		pid = e.PID
	}

	// apply: a001 leaves, a009 arrives; same generation.
	d.Spec.Adapters = append([]*pb.Adapter{ads[0], ads[2], ads[3]}, &pb.Adapter{Name: "a009", Source: "/adapters/a009", Rank: 16})
	n.publish(d)
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, _, _ := ask(t, url, "a001", "beta")
		if code == http.StatusNotFound {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a001 still answered %d after it was removed", code)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if code, got, msg := ask(t, url, "chat:a009", "beta"); code != http.StatusOK || got != "a009" {
		t.Fatalf("added adapter: %d %q %s", code, got, msg)
	}
	for _, e := range n.ex.Engines() {
		if e.PID != pid {
			t.Fatalf("the base's engine changed from pid %d to %d: adding adapters restarted it", pid, e.PID)
		}
	}
	if code, got, _ := ask(t, url, "chat", ""); code != http.StatusOK || got != "chat" {
		t.Fatalf("the base itself: %d %q", code, got)
	}
}

// TestRemovedAdapterWhileLoading: a request waiting for an adapter that an
// apply removes is answered 404 like any adapter that does not exist, not
// left to wait out the front's deadline with a 503.
func TestRemovedAdapterWhileLoading(t *testing.T) {
	n := newAdapterNode(t)
	ads := adapterList(3, 16)
	d := n.deployment(pb.Residency_RESIDENCY_UNSPECIFIED, 2, ads)
	d.Spec.Engine.Args = append(d.Spec.Engine.Args, "--lora-load-scale", "1", "--lora-load-time", "20s")
	n.publish(d)
	url := n.front()
	if code, got, msg := ask(t, url, "chat", ""); code != http.StatusOK || got != "chat" {
		t.Fatalf("the base: %d %q %s", code, got, msg)
	}
	type answer struct {
		code int
		msg  string
	}
	done := make(chan answer, 1)
	go func() {
		code, _, msg := ask(t, url, "chat:a002", "")
		done <- answer{code, msg}
	}()
	// The request is counted (its adapter starts loading) before the
	// apply removes the adapter.
	testutil.Eventually(t, 30*time.Second, "a002's load decided", func() error {
		ds, _ := n.journal.Decisions(0)
		for _, d := range ds {
			if d.Action == residency.ActLoadAdapter && strings.Contains(d.Reason, "a002") {
				return nil
			}
		}
		return errors.New("not yet")
	})
	d.Spec.Adapters = ads[:2]
	n.publish(d)
	a := <-done
	if a.code != http.StatusNotFound || a.msg != "The model `chat:a002` does not exist." {
		t.Fatalf("request for the removed adapter: %d %q, want 404", a.code, a.msg)
	}
}

// TestRejectedRequestIsToldAtOnce: a request the controller rejects as it
// arrives (an onDemand base that cannot fit beside a pinned model) is
// answered 503 with the controller's reason at once, not left to wait out
// the front's deadline: the rejection its own arrival causes counts.
func TestRejectedRequestIsToldAtOnce(t *testing.T) {
	n := newAdapterNode(t)
	chat := n.deployment(pb.Residency_RESIDENCY_ON_DEMAND, 2, adapterList(2, 16))
	big := n.deployment(pb.Residency_RESIDENCY_UNSPECIFIED, 0, nil)
	big.Replica.Model, big.Replica.MemoryMib = "big", n.card.GetMemoryMib()*70/100
	big.Spec.Model, big.Spec.ServedModelName, big.Spec.Engine.MemoryPercent = "sim://big", "big", 70
	n.publish(big, chat)
	url := n.front()
	for _, model := range []string{"chat:a001", "chat"} {
		start := time.Now()
		code, _, msg := ask(t, url, model, "")
		if code != http.StatusServiceUnavailable || !strings.HasPrefix(msg, "model chat cannot be loaded now: reject chat/0: needs ") {
			t.Fatalf("request for %s, which cannot fit: %d %q after %v, want 503 with the controller's reason", model, code, msg, time.Since(start))
		}
	}
}

// TestDemandBeforePlacedLoads: a gateway's request for a replica that the
// Manager has not placed yet (its demand comes between the executor's Hold
// and Placed) counts once the replica is placed: the cold onDemand model
// is loaded for it, with no other request.
func TestDemandBeforePlacedLoads(t *testing.T) {
	n := newAdapterNode(t)
	done := n.mgr.Demand("chat", 0)
	n.publish(n.deployment(pb.Residency_RESIDENCY_ON_DEMAND, 0, nil))
	testutil.Eventually(t, 30*time.Second, "chat loaded for the request that came before it was placed", func() error {
		ready, url, _, ok := n.mgr.Serving("chat", 0)
		if !ok || !ready || url == "" {
			return fmt.Errorf("serving: ok %v, ready %v, engine %q", ok, ready, url)
		}
		return nil
	})
	done(0, time.Second)
}

// TestAdapterRequestBeforeThePlacementIsApplied: the executor may serve a
// replica's front (Hold) before the manager has applied its placement
// (Placed); a request for an adapter arriving then waits for the
// placement and is answered by its adapter, not 404 as if the adapter did
// not exist.
func TestAdapterRequestBeforeThePlacementIsApplied(t *testing.T) {
	n := newAdapterNode(t)
	d := n.deployment(pb.Residency_RESIDENCY_ON_DEMAND, 2, adapterList(2, 16))
	url, _ := n.mgr.Hold(d)
	if url == "" {
		t.Fatal("no front")
	}
	n.mgr.mu.Lock()
	f := n.mgr.fronts[rkey{"chat", 0}]
	n.mgr.mu.Unlock()
	type answer struct {
		code       int
		model, msg string
	}
	done := make(chan answer, 1)
	go func() {
		code, model, msg := ask(t, url, "chat:a001", "")
		done <- answer{code, model, msg}
	}()
	deadline := time.Now().Add(15 * time.Second)
	for {
		f.mu.Lock()
		early := f.early
		f.mu.Unlock()
		if early > 0 {
			break
		}
		select {
		case a := <-done:
			t.Fatalf("request for chat:a001 before the placement was applied: %d %q %s, want it to wait", a.code, a.model, a.msg)
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Error("the request never waited for the placement")
			break
		}
	}
	n.publish(d)
	if a := <-done; a.code != http.StatusOK || a.model != "a001" {
		t.Fatalf("request for chat:a001: %d %q %s, want 200 from a001", a.code, a.model, a.msg)
	}
}

// TestAdaptersAfterSleepAndWakeOnStrictVLLM (issue 33, point 1): a warm
// base on a sim engine speaking vLLM strictly (adapters stay registered
// through a sleep, a second load of one answers 400 "has already been
// loaded") serves its adapters after the base slept and woke, twice: the
// manager reconciles with the engine's /v1/models instead of failing the
// load and backing off.
func TestAdaptersAfterSleepAndWakeOnStrictVLLM(t *testing.T) {
	n := newAdapterNodeWith(t, func(c *residency.Config) { c.IdleSleep = 500 * time.Millisecond })
	d := n.deployment(pb.Residency_RESIDENCY_WARM, 2, adapterList(3, 8))
	d.Spec.Engine.Args = append(d.Spec.Engine.Args, "--dialect", "vllm")
	n.publish(d)
	url := n.front()
	for cycle := range 3 {
		for _, a := range []string{"a000", "a001"} {
			if code, model, msg := ask(t, url, a, ""); code != http.StatusOK || model != a {
				t.Fatalf("cycle %d: request for %s: %d %q %s", cycle, a, code, model, msg)
			}
		}
		if got := simAdapters(t, n); len(got) != 2 {
			t.Fatalf("cycle %d: the engine holds %v, want a000 and a001", cycle, got)
		}
		// Idle, the base sleeps; vLLM keeps the adapters registered.
		deadline := time.Now().Add(30 * time.Second)
		for simStatus(t, n).State != "asleep" {
			if time.Now().After(deadline) {
				t.Fatalf("cycle %d: the idle base never slept (state %q)", cycle, simStatus(t, n).State)
			}
			time.Sleep(50 * time.Millisecond)
		}
		if got := simAdapters(t, n); len(got) != 2 {
			t.Fatalf("cycle %d: asleep, the engine lists %v; the vllm dialect keeps them", cycle, got)
		}
	}
}

// TestAdoptedVLLMEngineKeepsItsAdapters (issue 33, point 1): an agent
// restarted on the same data dir adopts a running engine speaking vLLM
// strictly, whose adapter is still registered; the new agent's controller
// starts with the adapter on disk, and a request for it is answered (the
// engine's /v1/models says it is there; a load would be vLLM's 400).
func TestAdoptedVLLMEngineKeepsItsAdapters(t *testing.T) {
	dataDir := t.TempDir()
	first := newAdapterNodeAt(t, dataDir, nil, true)
	d := first.deployment(pb.Residency_RESIDENCY_PINNED, 2, adapterList(2, 8))
	d.Spec.Engine.Args = append(d.Spec.Engine.Args, "--dialect", "vllm")
	first.publish(d)
	if code, model, msg := ask(t, first.front(), "a000", ""); code != http.StatusOK || model != "a000" {
		t.Fatalf("request for a000: %d %q %s", code, model, msg)
	}
	first.kill()

	second := newAdapterNodeAt(t, dataDir, nil, false)
	second.publish(d)
	url := second.front()
	// The engine was adopted, not restarted: it still has a000.
	deadline := time.Now().Add(30 * time.Second)
	for got := simAdapters(t, second); !slices.Equal(got, []string{"a000"}); got = simAdapters(t, second) {
		if time.Now().After(deadline) {
			t.Fatalf("the adopted engine lists %v, want a000", got)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, a := range []string{"a000", "a001"} {
		if code, model, msg := ask(t, url, a, ""); code != http.StatusOK || model != a {
			t.Fatalf("after the restart, request for %s: %d %q %s", a, code, model, msg)
		}
	}
}
