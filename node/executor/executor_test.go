package executor

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"github.com/gpuplane/gpuplane/internal/testbin"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/gpuplane/gpuplane/internal/testutil"
	"github.com/gpuplane/gpuplane/node/inventory"
	"github.com/gpuplane/gpuplane/node/procfs"
	"github.com/gpuplane/gpuplane/node/watchdog"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// bin is the gpuplane binary TestMain builds: the sim engines are real
// processes of it.
var bin string

func TestMain(m *testing.M) {
	testbin.Main(m, filepath.Join("..", ".."), "executor-test-", &bin)
}

const node = "node-a"

// source is the test's Source: the snapshots it is given, in order.
type source struct {
	// mu guards ch against Watch: resume replaces it.
	mu sync.Mutex
	ch chan Snapshot
}

func (s *source) Watch(ctx context.Context, n string, from uint64) (<-chan Snapshot, error) {
	if n != node {
		return nil, fmt.Errorf("watch of node %q, want %q", n, node)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ch, nil
}

// resume breaks the stream and starts the next watch with snap.
func (s *source) resume(snap Snapshot) {
	s.mu.Lock()
	old := s.ch
	s.ch = make(chan Snapshot, 8)
	s.ch <- snap
	s.mu.Unlock()
	close(old)
}

// reporter is the test's Reporter: every report, with when it came.
type reporter struct {
	mu      sync.Mutex
	reports []*pb.ReplicaStatus
	at      []time.Time
	// hook, when set, sees each report as it is made, before it is
	// recorded and before the executor goes on.
	hook func(*pb.ReplicaStatus)
}

func (r *reporter) Report(_ context.Context, st *pb.ReplicaStatus) error {
	r.mu.Lock()
	hook := r.hook
	r.mu.Unlock()
	if hook != nil {
		hook(st)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reports = append(r.reports, proto.Clone(st).(*pb.ReplicaStatus))
	r.at = append(r.at, time.Now())
	return nil
}

// of returns the reports about one replica.
func (r *reporter) of(model string) []*pb.ReplicaStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*pb.ReplicaStatus
	for _, st := range r.reports {
		if st.Model == model {
			out = append(out, st)
		}
	}
	return out
}

func (r *reporter) last(model string) *pb.ReplicaStatus {
	all := r.of(model)
	if len(all) == 0 {
		return nil
	}
	return all[len(all)-1]
}

// harness runs an executor and a watchdog over one simulated l4 card.
type harness struct {
	t       *testing.T
	dataDir string
	card    *pb.Card
	usage   *inventory.SimUsage
	nvml    *inventory.SimNVML
	src     *source
	rep     *reporter
	exec    *Executor
	stop    context.CancelFunc
	done    chan struct{}
}

func newHarness(t *testing.T, dataDir string, tweak func(*Options)) *harness {
	t.Helper()
	cards, err := inventory.Simulated(node, "l4=1")
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, dataDir: dataDir, card: cards[0], src: &source{ch: make(chan Snapshot, 8)}, rep: &reporter{}}
	usageDir := filepath.Join(dataDir, "sim-nvml")
	h.usage = inventory.NewSimUsage(usageDir)
	h.nvml = inventory.NewSimNVML(cards, h.usage)
	opts := Options{
		Node: node, DataDir: dataDir, Cards: cards, Self: bin, SimUsageDir: usageDir, NVML: h.nvml,
		BindHost: "127.0.0.1", AdvertiseHost: "127.0.0.1",
		GracePeriod: 2 * time.Second, HealthInterval: 50 * time.Millisecond,
		RestartDelay: 300 * time.Millisecond, MaxRestartDelay: 2 * time.Second,
		Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	if tweak != nil {
		tweak(&opts)
	}
	h.exec, err = New(h.src, h.rep, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h.stop, h.done = cancel, make(chan struct{})
	wd := watchdog.New(h.nvml, h.exec, watchdog.Options{Interval: 100 * time.Millisecond, Logger: opts.Logger})
	var wg sync.WaitGroup
	wg.Go(func() { wd.Run(ctx) })
	wg.Go(func() {
		if err := h.exec.Run(ctx); err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	go func() { wg.Wait(); close(h.done) }()
	t.Cleanup(h.close)
	return h
}

// close stops the executor (and, unless it keeps them, its engines).
func (h *harness) close() {
	h.stop()
	select {
	case <-h.done:
	case <-time.After(10 * time.Second):
		h.t.Error("executor did not stop within 10s")
	}
}

// want sends the replicas the node should run.
func (h *harness) want(index uint64, ds ...Desired) {
	h.src.mu.Lock()
	ch := h.src.ch
	h.src.mu.Unlock()
	ch <- Snapshot{Index: index, Replicas: ds}
}

// sim is a replica of a sim deployment named model at 40 % of card 0.
func sim(model string, generation uint64, args ...string) Desired {
	return Desired{
		Replica: &pb.Replica{Model: model, Index: 0, Generation: generation, Node: node, Accelerator: "shared",
			Cards: []uint32{0}, MemoryMib: 9213, PlacedIndex: 7,
			State: pb.ReplicaState_REPLICA_STATE_PLACED},
		Spec: &pb.ModelSpec{Model: "sim://" + model, ServedModelName: model, Replicas: 1,
			Engine: &pb.EngineSpec{Kind: "sim", MemoryPercent: 40,
				Args: append([]string{"--load-seconds", "0.2", "--tokens-per-second", "0"}, args...)}},
	}
}

func (h *harness) waitState(model string, state pb.ReplicaState, timeout time.Duration) *pb.ReplicaStatus {
	h.t.Helper()
	var last *pb.ReplicaStatus
	testutil.Eventually(h.t, timeout, fmt.Sprintf("replica %s/0 is not %s", model, state), func() error {
		last = h.rep.last(model)
		if last != nil && last.State == state {
			return nil
		}
		return fmt.Errorf("reports: %v", h.rep.of(model))
	})
	return last
}

// engines returns the live sim engine processes of this test's binary that
// serve model, found through /proc, not through the executor.
func engines(t *testing.T, model string) []int {
	t.Helper()
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	var out []int
	for _, d := range dirs {
		pid, _ := strconv.Atoi(filepath.Base(d))
		raw, err := os.ReadFile(filepath.Join(d, "cmdline"))
		if err != nil || len(raw) == 0 {
			continue
		}
		argv := strings.Split(strings.TrimSuffix(string(raw), "\x00"), "\x00")
		i := slices.Index(argv, "--served-model-name")
		if argv[0] != bin || i < 0 || i+1 >= len(argv) || argv[i+1] != model {
			continue
		}
		if st, err := procfs.ReadStat(pid); err == nil && st.Alive() {
			out = append(out, pid)
		}
	}
	return out
}

func onePID(t *testing.T, model string) int {
	t.Helper()
	pids := engines(t, model)
	if len(pids) != 1 {
		t.Fatalf("%d engine processes serve %s, want exactly 1: %v", len(pids), model, pids)
	}
	return pids[0]
}

// environ reads a process's environment.
func environ(t *testing.T, pid int) map[string]string {
	t.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	for kv := range strings.SplitSeq(string(raw), "\x00") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			env[k] = v
		}
	}
	return env
}

func cmdline(t *testing.T, pid int) string {
	t.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		t.Fatal(err)
	}
	return strings.ReplaceAll(strings.TrimSuffix(string(raw), "\x00"), "\x00", " ")
}

// chat posts a chat completion to endpoint and returns the reply's text,
// streamed or not.
func chat(t *testing.T, endpoint, model string, stream bool) string {
	t.Helper()
	body := fmt.Sprintf(`{"model":%q,"stream":%t,"max_tokens":4,"messages":[{"role":"user","content":"hello"}]}`, model, stream)
	resp, err := http.Post(endpoint+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("chat completion at %s: %s", endpoint, resp.Status)
	}
	if !stream {
		var out struct {
			Choices []struct{ Message struct{ Content string } } `json:"choices"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || len(out.Choices) != 1 {
			t.Fatalf("chat completion at %s: %+v, %v", endpoint, out, err)
		}
		return out.Choices[0].Message.Content
	}
	var text strings.Builder
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var chunk struct {
			Choices []struct{ Delta struct{ Content string } } `json:"choices"`
		}
		if err := json.Unmarshal([]byte(data), &chunk); err != nil {
			t.Fatalf("stream chunk %q: %v", data, err)
		}
		text.WriteString(chunk.Choices[0].Delta.Content)
	}
	return text.String()
}

func states(reports []*pb.ReplicaStatus) []string {
	out := make([]string, len(reports))
	for i, r := range reports {
		out[i] = strings.TrimPrefix(r.State.String(), "REPLICA_STATE_")
	}
	return out
}

// 1. Two replicas at 40 % of one card both run, started side by side (their
// shares fit the card together), each with the card in
// CUDA_VISIBLE_DEVICES and its share as flags, and each answers chat
// completions at its endpoint.
func TestTwoReplicasShareACard(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	h.want(10, sim("alpha", 1), sim("beta", 1))
	a := h.waitState("alpha", pb.ReplicaState_REPLICA_STATE_RUNNING, 30*time.Second)
	b := h.waitState("beta", pb.ReplicaState_REPLICA_STATE_RUNNING, 30*time.Second)

	// Neither waited for the other: sim engines start beside any start
	// whose share fits the card with theirs.
	for _, m := range []string{"alpha", "beta"} {
		if got := states(h.rep.of(m)); !slices.Equal(got, []string{"STARTING", "RUNNING"}) {
			t.Errorf("%s reported %v, want [STARTING RUNNING]", m, got)
		}
	}

	for _, st := range []*pb.ReplicaStatus{a, b} {
		if st.Node != node || st.Generation != 1 || !strings.HasPrefix(st.Endpoint, "http://127.0.0.1:") {
			t.Errorf("report %v: want node %s, generation 1 and an endpoint", st, node)
		}
		pid := onePID(t, st.Model)
		env := environ(t, pid)
		if got := env["CUDA_VISIBLE_DEVICES"]; got != h.card.GetUuid() {
			t.Errorf("%s: CUDA_VISIBLE_DEVICES=%q, want the card's UUID %s", st.Model, got, h.card.GetUuid())
		}
		if env[inventory.EnvSimUsageDir] == "" {
			t.Errorf("%s: no %s in its environment", st.Model, inventory.EnvSimUsageDir)
		}
		cl := cmdline(t, pid)
		for _, want := range []string{"engine sim", "--memory-mib 9213", "--card-uuids " + h.card.GetUuid(), "--served-model-name " + st.Model} {
			if !strings.Contains(cl, want) {
				t.Errorf("%s: command line %q lacks %q", st.Model, cl, want)
			}
		}
		if got := chat(t, st.Endpoint, st.Model, false); len(strings.Fields(got)) != 4 {
			t.Errorf("%s answered %q, want 4 words", st.Model, got)
		}
		if got := chat(t, st.Endpoint, st.Model, true); len(strings.Fields(got)) != 4 {
			t.Errorf("%s streamed %q, want 4 words", st.Model, got)
		}
	}
	// The simulated NVML sees both engines' shares on the card.
	used, err := watchdog.ProcessMemory(h.nvml, h.card.GetUuid())
	if err != nil || len(used) != 2 || used[onePID(t, "alpha")] != 9213 || used[onePID(t, "beta")] != 9213 {
		t.Errorf("NVML per-process memory = %v, %v; want both engines at 9213 MiB", used, err)
	}
}

// 2. An engine killed with SIGKILL is restarted; the restart count grows and
// every transition is reported; its log survives the restart.
func TestKilledEngineRestarts(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	h.want(10, sim("alpha", 1))
	h.waitState("alpha", pb.ReplicaState_REPLICA_STATE_RUNNING, 30*time.Second)
	old := onePID(t, "alpha")
	if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testutil.Until(t, 30*time.Second, "alpha did not run again after kill -9", func() bool {
		st := h.rep.last("alpha")
		return st.State == pb.ReplicaState_REPLICA_STATE_RUNNING && st.Restarts == 1
	})
	got := h.rep.of("alpha")
	if s := states(got); !slices.Equal(s, []string{"STARTING", "RUNNING", "FAILED", "STARTING", "RUNNING"}) {
		t.Fatalf("alpha reported %v", s)
	}
	if f := got[2]; f.Reason != "engine killed by signal killed" || f.Restarts != 1 {
		t.Errorf("failure report %v: want reason %q and restarts 1", f, "engine killed by signal killed")
	}
	if got[3].Restarts != 1 || got[3].Endpoint == "" {
		t.Errorf("restart report %v: want restarts 1 and an endpoint", got[3])
	}
	if now := onePID(t, "alpha"); now == old {
		t.Errorf("the engine still has pid %d", old)
	}
	var logs bytes.Buffer
	if err := ReadLogs(context.Background(), h.dataDir, "alpha", 0, false, &logs); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(logs.String(), "--- gpuplane:"); n != 2 || !strings.Contains(logs.String(), "sim engine loaded") {
		t.Errorf("engine log has %d start lines, want 2, and the engine's own lines:\n%s", n, logs.String())
	}
}

// 3. An engine using more than its share is stopped by the watchdog and its
// replica reported Failed; the backoff spaces its restarts; the other
// replica on the card keeps running untouched.
func TestWatchdogStopsAnEngineAboveItsShare(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	h.want(10, sim("alpha", 1), sim("greedy", 1, "--memory-mib", "20000"))
	h.waitState("alpha", pb.ReplicaState_REPLICA_STATE_RUNNING, 30*time.Second)
	alpha := onePID(t, "alpha")
	const reason = "exceeded memory share (used 20000 MiB, share 9213 MiB)"
	testutil.Until(t, 30*time.Second, "greedy was not stopped twice for its memory", func() bool {
		n := 0
		for _, st := range h.rep.of("greedy") {
			if st.State == pb.ReplicaState_REPLICA_STATE_FAILED && st.Reason == reason {
				n++
			}
		}
		return n >= 2
	})
	// No tight loop: each restart waited for its backoff (0.3 s ± 20 %, then doubling).
	h.rep.mu.Lock()
	var failedAt time.Time
	for i, st := range h.rep.reports {
		switch {
		case st.Model != "greedy":
		case st.State == pb.ReplicaState_REPLICA_STATE_FAILED:
			failedAt = h.rep.at[i]
		case st.State == pb.ReplicaState_REPLICA_STATE_STARTING && !failedAt.IsZero():
			if d := h.rep.at[i].Sub(failedAt); d < 200*time.Millisecond {
				t.Errorf("greedy restarted %s after failing, want at least its backoff", d)
			}
		}
	}
	h.rep.mu.Unlock()
	if s := states(h.rep.of("alpha")); !slices.Equal(s, []string{"STARTING", "RUNNING"}) && !slices.Equal(s, []string{"PLACED", "STARTING", "RUNNING"}) {
		t.Errorf("alpha reported %v, want only Starting and Running (after waiting for the card)", s)
	}
	if now := onePID(t, "alpha"); now != alpha {
		t.Errorf("alpha's engine changed from pid %d to %d", alpha, now)
	}
}

// 4. Replicas that leave the node have their engines stopped within the
// grace period, leaving no process, record or registered memory.
func TestRemovedReplicasStop(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	h.want(10, sim("alpha", 1), sim("beta", 1))
	h.waitState("alpha", pb.ReplicaState_REPLICA_STATE_RUNNING, 30*time.Second)
	h.waitState("beta", pb.ReplicaState_REPLICA_STATE_RUNNING, 30*time.Second)
	onePID(t, "alpha")
	onePID(t, "beta")
	removed := time.Now()
	h.want(11)
	// The grace period is 2s; the deadline allows for a loaded machine
	// (the time taken is logged).
	testutil.Until(t, 15*time.Second, "engines still run after the grace period", func() bool {
		return len(engines(t, "alpha"))+len(engines(t, "beta")) == 0
	})
	t.Logf("engines stopped %s after their replicas left", time.Since(removed).Round(time.Millisecond))
	// The supervisors clean up just after their processes are gone.
	testutil.Until(t, 30*time.Second, "supervisors still hold stopped engines", func() bool { return len(h.exec.Engines()) == 0 })
	for _, m := range []string{"alpha", "beta"} {
		if _, err := os.Stat(filepath.Join(ReplicaDir(h.dataDir, m, 0), pidFile)); !os.IsNotExist(err) {
			t.Errorf("%s: pid.json remains (%v)", m, err)
		}
	}
	if procs, _ := h.usage.Processes(h.card.GetUuid()); len(procs) != 0 {
		t.Errorf("memory still registered on the card: %v", procs)
	}
	if len(h.exec.Engines()) != 0 {
		t.Errorf("the watchdog still sees %v", h.exec.Engines())
	}
}

// 5. An executor abandoned without stopping its engines (the agent killed
// with SIGKILL) and a new one on the same data dir: the engine still wanted
// as it was is adopted, the one whose generation changed is replaced, the
// one no longer wanted is stopped; exactly one process per replica remains,
// and an adopted engine that dies is restarted.
func TestRestartedExecutorAdoptsOrReplacesEngines(t *testing.T) {
	dataDir := t.TempDir()
	first := newHarness(t, dataDir, func(o *Options) { o.KeepEngines = true })
	first.want(10, sim("alpha", 1), sim("beta", 1), sim("gamma", 1))
	for _, m := range []string{"alpha", "beta", "gamma"} {
		first.waitState(m, pb.ReplicaState_REPLICA_STATE_RUNNING, 30*time.Second)
	}
	alpha, beta, gamma := onePID(t, "alpha"), onePID(t, "beta"), onePID(t, "gamma")
	first.close()
	for m, pid := range map[string]int{"alpha": alpha, "beta": beta, "gamma": gamma} {
		if got := onePID(t, m); got != pid {
			t.Fatalf("%s's engine did not outlive its executor", m)
		}
	}

	second := newHarness(t, dataDir, nil)
	second.want(12, sim("alpha", 1), sim("beta", 2))
	second.waitState("alpha", pb.ReplicaState_REPLICA_STATE_RUNNING, 30*time.Second)
	testutil.Until(t, 30*time.Second, "beta did not run at generation 2", func() bool {
		st := second.rep.last("beta")
		return st != nil && st.State == pb.ReplicaState_REPLICA_STATE_RUNNING && st.Generation == 2
	})
	if got := onePID(t, "alpha"); got != alpha {
		t.Errorf("alpha: pid %d, want its engine %d adopted", got, alpha)
	}
	if got := onePID(t, "beta"); got == beta {
		t.Errorf("beta still runs generation 1's engine %d", beta)
	}
	testutil.Until(t, 15*time.Second, "gamma, no longer wanted, still runs", func() bool { return len(engines(t, "gamma")) == 0 })
	if s := states(second.rep.of("alpha")); !slices.Equal(s, []string{"RUNNING"}) {
		t.Errorf("adopted alpha reported %v, want [RUNNING]", s)
	}

	// The adopted engine is not the new executor's child: it is followed
	// through /proc, and restarted when it dies.
	if err := syscall.Kill(alpha, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testutil.Until(t, 30*time.Second, "alpha did not run again after its adopted engine died", func() bool {
		st := second.rep.last("alpha")
		return st.State == pb.ReplicaState_REPLICA_STATE_RUNNING && st.Restarts == 1
	})
	if got := onePID(t, "alpha"); got == alpha {
		t.Errorf("alpha still reports the dead pid %d", alpha)
	}
	onePID(t, "beta")

	second.close()
	for _, m := range []string{"alpha", "beta", "gamma"} {
		if pids := engines(t, m); len(pids) != 0 {
			t.Errorf("%s: engines %v remain after the executor stopped", m, pids)
		}
	}
	if st := second.rep.last("beta"); st.State != pb.ReplicaState_REPLICA_STATE_STOPPED || st.Reason != "node agent stopped" {
		t.Errorf("beta's last report %v, want Stopped: node agent stopped", st)
	}
}

// withStartTimeout sets a deployment's spec.engine.startTimeout.
func withStartTimeout(d Desired, seconds uint32) Desired {
	d.Spec.Engine.StartTimeoutSeconds = seconds
	return d
}

// command is a replica of a command engine deployment named model at 40 %
// of card 0, running argv (templates allowed, e.g. {{.Port}}).
func command(model string, argv ...string) Desired {
	d := sim(model, 1)
	d.Spec.Model = "/models/" + model
	d.Spec.Engine = &pb.EngineSpec{Kind: "command", MemoryPercent: 40, Args: argv}
	return d
}

// reportsWith returns the reports about model in state.
func (r *reporter) reportsWith(model string, state pb.ReplicaState) []*pb.ReplicaStatus {
	var out []*pb.ReplicaStatus
	for _, st := range r.of(model) {
		if st.State == state {
			out = append(out, st)
		}
	}
	return out
}

// 6. An engine that never becomes ready does not hold a card past its start
// deadline, even for an engine that must start alone (a command engine):
// the replica waiting for it says whom it waits for and why, the stuck one
// is Failed at its start deadline with a reason that says so, and the
// waiting one then starts and runs.
func TestStartDeadlineFreesTheCard(t *testing.T) {
	// A long backoff keeps the stuck replica Failed once it has failed.
	h := newHarness(t, t.TempDir(), func(o *Options) { o.RestartDelay, o.MaxRestartDelay = time.Minute, time.Minute })
	stuck := withStartTimeout(command("stuck", "sh", "-c", "exec sleep 1000"), 3)
	h.want(10, stuck)
	st := h.waitState("stuck", pb.ReplicaState_REPLICA_STATE_STARTING, 30*time.Second)
	h.want(11, stuck, listener("chat"))

	waited := h.waitState("chat", pb.ReplicaState_REPLICA_STATE_PLACED, 30*time.Second)
	if !strings.HasPrefix(waited.Reason, "waiting for card 0: stuck/0 is starting (") ||
		!strings.HasSuffix(waited.Reason, " of 3s), and a command engine starts alone") {
		t.Errorf("chat waits with reason %q, want it to name stuck/0, its 3s deadline and why", waited.Reason)
	}
	h.waitState("chat", pb.ReplicaState_REPLICA_STATE_RUNNING, 30*time.Second)

	failed := h.rep.reportsWith("stuck", pb.ReplicaState_REPLICA_STATE_FAILED)
	port := strings.TrimPrefix(st.Endpoint, "http://127.0.0.1:")
	want := "engine not ready within its start timeout of 3s (spec.engine.startTimeout): nothing listened on port " + port
	if len(failed) != 1 || failed[0].Reason != want {
		t.Fatalf("stuck reported failures %v, want one: %q", failed, want)
	}
	if last := h.rep.last("stuck"); last.State != pb.ReplicaState_REPLICA_STATE_FAILED {
		t.Errorf("stuck is %v, want Failed until its backoff ends", last)
	}
	// chat started only once stuck had failed and freed the card.
	if failedAt, startedAt := h.rep.index("stuck", pb.ReplicaState_REPLICA_STATE_FAILED), h.rep.index("chat", pb.ReplicaState_REPLICA_STATE_STARTING); startedAt < failedAt {
		t.Errorf("chat started before stuck failed: %v", h.rep.reports)
	}
}

// listener is a command engine that serves at once: the sim engine's
// binary standing for a user's server.
func listener(model string) Desired {
	return command(model, bin, "engine", "sim", "--host", "{{.Host}}", "--port", "{{.Port}}",
		"--served-model-name", "{{.ServedModelName}}", "--load-seconds", "0", "--tokens-per-second", "0")
}

// index is the position of model's first report in state among all
// reports, -1 if none.
func (r *reporter) index(model string, state pb.ReplicaState) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, st := range r.reports {
		if st.Model == model && st.State == state {
			return i
		}
	}
	return -1
}

// 6b. A replica behind a never-healthy engine on the same card starts at
// once when both shares fit the card (sim engines start side by side), and
// the engine that shows no progress (its health probe finds the same, it
// prints nothing, its memory does not grow) is declared stuck and stopped
// after StartStallTimeout, long before its 2-minute start timeout.
func TestStuckStartDoesNotHoldTheCard(t *testing.T) {
	const stall = 10 * time.Second
	h := newHarness(t, t.TempDir(), func(o *Options) {
		o.RestartDelay, o.MaxRestartDelay, o.StartStallTimeout = time.Minute, time.Minute, stall
	})
	stuck := sim("stuck", 1, "--load-seconds", "100000")
	h.want(10, stuck)
	st := h.waitState("stuck", pb.ReplicaState_REPLICA_STATE_STARTING, 30*time.Second)
	h.want(11, stuck, sim("chat", 1))
	h.waitState("chat", pb.ReplicaState_REPLICA_STATE_RUNNING, 30*time.Second)
	if got := states(h.rep.of("chat")); !slices.Equal(got, []string{"STARTING", "RUNNING"}) {
		t.Errorf("chat reported %v, want [STARTING RUNNING]: it waited for the stuck engine", got)
	}

	failed := h.waitState("stuck", pb.ReplicaState_REPLICA_STATE_FAILED, 90*time.Second)
	port := strings.TrimPrefix(st.Endpoint, "http://127.0.0.1:")
	want := "engine stuck while starting: no progress for 10s (no health change: GET /health on port " + port +
		" answered 503 Service Unavailable; no log output; no memory growth); stopped "
	if !strings.HasPrefix(failed.Reason, want) || !strings.HasSuffix(failed.Reason, " into its start timeout of 2m0s") {
		t.Errorf("stuck failed with %q, want %q…into its start timeout of 2m0s", failed.Reason, want)
	}
	t.Logf("stuck: %s", failed.Reason)
	if pids := engines(t, "stuck"); len(pids) != 0 {
		t.Errorf("the stuck engine still runs: %v", pids)
	}
	// chat ran while stuck was still starting.
	if running, failedAt := h.rep.index("chat", pb.ReplicaState_REPLICA_STATE_RUNNING), h.rep.index("stuck", pb.ReplicaState_REPLICA_STATE_FAILED); running > failedAt {
		t.Errorf("chat ran only after stuck failed: %v", h.rep.reports)
	}
}

// 6c. A replica waiting behind an engine that starts alone says how long
// that start has run, counting up, and starts once the other is declared
// stuck, long before its 5-minute start timeout.
func TestWaitingReasonCountsUp(t *testing.T) {
	h := newHarness(t, t.TempDir(), func(o *Options) {
		o.RestartDelay, o.MaxRestartDelay, o.StartStallTimeout = time.Minute, time.Minute, 2*waitReport+time.Second
	})
	sleeper := command("sleeper", "sh", "-c", "exec sleep 1000")
	h.want(10, sleeper)
	h.waitState("sleeper", pb.ReplicaState_REPLICA_STATE_STARTING, 30*time.Second)
	h.want(11, sleeper, listener("chat"))
	h.waitState("chat", pb.ReplicaState_REPLICA_STATE_RUNNING, 90*time.Second)

	var seconds []int
	for _, r := range h.rep.reportsWith("chat", pb.ReplicaState_REPLICA_STATE_PLACED) {
		var d string
		if _, err := fmt.Sscanf(r.Reason, "waiting for card 0: sleeper/0 is starting (%s", &d); err != nil ||
			!strings.HasSuffix(r.Reason, " of 5m0s), and a command engine starts alone") {
			t.Fatalf("chat waited with reason %q", r.Reason)
		}
		ran, err := time.ParseDuration(d)
		if err != nil {
			t.Fatalf("chat waited with reason %q: %v", r.Reason, err)
		}
		seconds = append(seconds, int(ran.Seconds()))
		t.Logf("chat: %s", r.Reason)
	}
	if len(seconds) < 2 || !slices.IsSorted(seconds) || seconds[0] == seconds[len(seconds)-1] {
		t.Errorf("chat's waiting reasons say the other start ran %v seconds: want them counting up", seconds)
	}
	failed := h.rep.reportsWith("sleeper", pb.ReplicaState_REPLICA_STATE_FAILED)
	if len(failed) != 1 || !strings.HasPrefix(failed[0].Reason, "engine stuck while starting: no progress for 11s (no health change: nothing listened on port ") {
		t.Errorf("sleeper failures %v, want one: engine stuck", failed)
	}
}

// 7. A command engine is Running only once it listens:
// one that never listens fails at its start deadline with a reason saying
// nothing listened on its port; one that listens after a second runs, and
// not before it listens.
func TestCommandEngineRunsOnlyOnceItListens(t *testing.T) {
	h := newHarness(t, t.TempDir(), func(o *Options) { o.RestartDelay, o.MaxRestartDelay = time.Minute, time.Minute })
	h.want(10, withStartTimeout(command("sleeper", "sh", "-c", "exec sleep 1000"), 2))
	st := h.waitState("sleeper", pb.ReplicaState_REPLICA_STATE_STARTING, 30*time.Second)
	failed := h.waitState("sleeper", pb.ReplicaState_REPLICA_STATE_FAILED, 20*time.Second)
	port := strings.TrimPrefix(st.Endpoint, "http://127.0.0.1:")
	if want := "engine not ready within its start timeout of 2s (spec.engine.startTimeout): nothing listened on port " + port; failed.Reason != want {
		t.Errorf("sleeper failed with %q, want %q", failed.Reason, want)
	}
	if s := states(h.rep.of("sleeper")); slices.Contains(s, "RUNNING") {
		t.Errorf("sleeper reported %v: Running while nothing listened", s)
	}

	// The sim engine's binary stands for a user's server that takes a
	// second before it listens. When it is reported Running, its endpoint
	// accepts connections.
	var refused error
	h.rep.mu.Lock()
	h.rep.hook = func(st *pb.ReplicaStatus) {
		if st.Model == "listener" && st.State == pb.ReplicaState_REPLICA_STATE_RUNNING {
			conn, err := net.Dial("tcp", strings.TrimPrefix(st.Endpoint, "http://"))
			if err != nil {
				refused = err
				return
			}
			conn.Close()
		}
	}
	h.rep.mu.Unlock()
	h.want(11, command("listener", "sh", "-c", "sleep 1; exec "+bin+
		" engine sim --host {{.Host}} --port {{.Port}} --served-model-name {{.ServedModelName}} --load-seconds 0 --tokens-per-second 0"))
	running := h.waitState("listener", pb.ReplicaState_REPLICA_STATE_RUNNING, 20*time.Second)
	if s := states(h.rep.of("listener")); !slices.Equal(s, []string{"STARTING", "RUNNING"}) || refused != nil {
		t.Errorf("listener reported %v; its endpoint refused connections when it was reported Running: %v", s, refused)
	}
	if got := chat(t, running.Endpoint, "listener", false); len(strings.Fields(got)) != 4 {
		t.Errorf("listener answered %q", got)
	}
}

// 8. An engine that exits at once is never recorded
// Running, however its exit and the health checks interleave: checks far
// more frequent than the restarts leave a tick waiting at every launch.
func TestEngineThatExitsAtOnceIsNeverRunning(t *testing.T) {
	h := newHarness(t, t.TempDir(), func(o *Options) {
		o.HealthInterval, o.RestartDelay, o.MaxRestartDelay = 5*time.Millisecond, 30*time.Millisecond, 60*time.Millisecond
	})
	h.want(10, command("crasher", "sh", "-c", "exit 3"))
	testutil.Until(t, 30*time.Second, "crasher did not crash 10 times", func() bool {
		return len(h.rep.reportsWith("crasher", pb.ReplicaState_REPLICA_STATE_FAILED)) >= 10
	})
	for _, st := range h.rep.of("crasher") {
		switch st.State {
		case pb.ReplicaState_REPLICA_STATE_RUNNING:
			t.Errorf("crasher recorded Running (restart %d): %v", st.Restarts, states(h.rep.of("crasher")))
		case pb.ReplicaState_REPLICA_STATE_FAILED:
			if st.Reason != "engine exited with status 3" {
				t.Errorf("crasher failed with %q, want %q", st.Reason, "engine exited with status 3")
			}
		}
	}
}

// 9. After an agent restart, a replica whose engine died
// while no executor watched it is first reported Failed, with its restart
// count carried on from the cluster's record, then started again; a replica
// stopped with the previous agent keeps its count too.
func TestEngineDiedWhileTheAgentWasDown(t *testing.T) {
	dataDir := t.TempDir()
	first := newHarness(t, dataDir, func(o *Options) { o.KeepEngines = true })
	first.want(10, sim("alpha", 1))
	first.waitState("alpha", pb.ReplicaState_REPLICA_STATE_RUNNING, 30*time.Second)
	pid := onePID(t, "alpha")
	first.close()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// Wait for the process itself, not its command line: an exiting
	// process has an empty cmdline before it is a zombie, and the next
	// agent would still find it alive and adopt it.
	testutil.Until(t, 30*time.Second, "alpha's engine outlived SIGKILL", func() bool {
		st, err := procfs.ReadStat(pid)
		return err != nil || !st.Alive()
	})

	// The cluster still says what the previous agent reported: Running,
	// after two restarts; beta Stopped with the agent, after four.
	alpha, beta := sim("alpha", 1), sim("beta", 1)
	alpha.Replica.State, alpha.Replica.Restarts = pb.ReplicaState_REPLICA_STATE_RUNNING, 2
	beta.Replica.State, beta.Replica.Restarts, beta.Replica.Reason = pb.ReplicaState_REPLICA_STATE_STOPPED, 4, "node agent stopped"
	beta.Replica.Cards = []uint32{0}
	second := newHarness(t, dataDir, nil)
	second.want(12, alpha, beta)
	second.waitState("alpha", pb.ReplicaState_REPLICA_STATE_RUNNING, 20*time.Second)
	second.waitState("beta", pb.ReplicaState_REPLICA_STATE_RUNNING, 20*time.Second)

	got := second.rep.of("alpha")
	if got[0].State != pb.ReplicaState_REPLICA_STATE_FAILED || got[0].Reason != "engine exited while the node agent was down" || got[0].Restarts != 3 {
		t.Errorf("alpha's first report after the restart is %v, want Failed: engine exited while the node agent was down, restarts 3", got[0])
	}
	for _, st := range got {
		if st.Restarts != 3 {
			t.Errorf("alpha reported %v, want restarts 3 throughout", st)
		}
	}
	for _, st := range second.rep.of("beta") {
		if st.Restarts != 4 || st.State == pb.ReplicaState_REPLICA_STATE_FAILED {
			t.Errorf("beta reported %v, want restarts 4 and no failure", st)
		}
	}
	onePID(t, "alpha")
}

// 10. An engine is Running only if the port it was told to listen on is
// held by the engine: one that never listens, while another process (this
// test) answers on its port, fails at its start deadline with a reason
// naming that process; one whose listener is a descendant in a session of
// its own (setsid) runs.
func TestEngineMustHoldItsPort(t *testing.T) {
	h := newHarness(t, t.TempDir(), func(o *Options) { o.RestartDelay, o.MaxRestartDelay = time.Minute, time.Minute })
	portFile := filepath.Join(t.TempDir(), "port")
	h.want(10, withStartTimeout(command("squatted", "sh", "-c", "echo {{.Port}} > "+portFile+"; exec sleep 1000"), 5))
	var port int
	testutil.Until(t, 30*time.Second, "the engine did not write its port", func() bool {
		raw, err := os.ReadFile(portFile)
		port, _ = strconv.Atoi(strings.TrimSpace(string(raw)))
		return err == nil && port > 0
	})
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	failed := h.waitState("squatted", pb.ReplicaState_REPLICA_STATE_FAILED, 30*time.Second)
	want := fmt.Sprintf("engine not ready within its start timeout of 5s (spec.engine.startTimeout): port %d is held by pid %d (%s), not by the engine",
		port, os.Getpid(), procfs.Comm(os.Getpid()))
	if failed.Reason != want {
		t.Errorf("squatted failed with %q, want %q", failed.Reason, want)
	}
	if s := states(h.rep.of("squatted")); slices.Contains(s, "RUNNING") {
		t.Errorf("squatted reported %v: Running while another process held its port", s)
	}

	// The child is found in the engine's cgroup where there is one, and
	// by its engine id without cgroups.
	child := command("child", "sh", "-c", "setsid "+bin+
		" engine sim --host {{.Host}} --port {{.Port}} --served-model-name {{.ServedModelName}} --load-seconds 0 --tokens-per-second 0 & wait")
	h.want(11, child)
	running := h.waitState("child", pb.ReplicaState_REPLICA_STATE_RUNNING, 30*time.Second)
	if got := chat(t, running.Endpoint, "child", false); len(strings.Fields(got)) != 4 {
		t.Errorf("child answered %q", got)
	}
	h.close()
	pg := newHarness(t, t.TempDir(), func(o *Options) { o.Containment = ContainProcessGroup })
	pg.want(10, child)
	running = pg.waitState("child", pb.ReplicaState_REPLICA_STATE_RUNNING, 30*time.Second)
	if got := chat(t, running.Endpoint, "child", false); len(strings.Fields(got)) != 4 {
		t.Errorf("child without cgroups answered %q", got)
	}
}

// TestReconcileOnResume breaks the node's stream after its replica was
// reported Running and resumes it with the cluster's record still
// Starting, as when the Running report was lost while the stream was
// down: the executor must report Running again, with nothing changed on
// the node.
func TestReconcileOnResume(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	d := sim("rec", 1)
	h.want(1, d)
	running := h.waitState("rec", pb.ReplicaState_REPLICA_STATE_RUNNING, 30*time.Second)
	sent := len(h.rep.of("rec"))

	rec := proto.Clone(d.Replica).(*pb.Replica)
	rec.State, rec.Endpoint = pb.ReplicaState_REPLICA_STATE_STARTING, running.GetEndpoint()
	h.src.resume(Snapshot{Index: 9, Replicas: []Desired{{Replica: rec, Spec: d.Spec}}})
	testutil.Eventually(t, 30*time.Second, "Running reported again", func() error {
		all := h.rep.of("rec")
		if len(all) <= sent || all[len(all)-1].GetState() != pb.ReplicaState_REPLICA_STATE_RUNNING {
			return fmt.Errorf("reports: %v", all)
		}
		return nil
	})
}
