package engine

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"github.com/gpuplane/gpuplane/internal/testbin"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuplane/gpuplane/node/inventory"
	simengine "github.com/gpuplane/gpuplane/node/sim"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// The tests below run `gpuplane engine sim` as real processes: the engines
// on one simulated card are separate processes that share it only through
// the simulated NVML's directory, as they do under the executor.

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// gpuplaneBin builds the gpuplane binary once per test run.
func gpuplaneBin(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		binPath, _, buildErr = testbin.Build(filepath.Join("..", ".."), "engine-test-")
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// card is one simulated l4 and the SimNVML the watchdog would read it with.
type card struct {
	uuid  string
	usage *inventory.SimUsage
	dir   string
	nvml  *inventory.SimNVML
}

func newCard(t *testing.T) *card {
	t.Helper()
	cards, err := inventory.Simulated("node-a", "l4=1")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	usage := inventory.NewSimUsage(dir)
	return &card{uuid: cards[0].GetUuid(), usage: usage, dir: dir, nvml: inventory.NewSimNVML(cards, usage)}
}

// usedMiB is what NVML reports process pid using on the card (0 when it is
// not listed), read the way the watchdog reads it.
func (c *card) usedMiB(t *testing.T, pid int) uint64 {
	t.Helper()
	dev, ret := c.nvml.DeviceGetHandleByUUID(c.uuid)
	if ret != nvml.SUCCESS {
		t.Fatalf("device: %v", ret)
	}
	procs, ret := dev.GetComputeRunningProcesses()
	if ret != nvml.SUCCESS {
		t.Fatalf("processes: %v", ret)
	}
	for _, p := range procs {
		if int(p.Pid) == pid {
			return p.UsedGpuMemory >> 20
		}
	}
	return 0
}

// waitUsed polls until the card reports pid using want MiB.
func (c *card) waitUsed(t *testing.T, pid int, want uint64, why string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got := c.usedMiB(t, pid)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: NVML reports %d MiB, want %d", why, got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// simProc is one running sim engine.
type simProc struct {
	base string
	pid  int
}

var addrRE = regexp.MustCompile(`addr=(127\.0\.0\.1:\d+)`)

// startSim runs `gpuplane engine sim` on c with args (after the name and
// card) and returns once it listens; it is stopped with SIGTERM at cleanup.
func startSim(t *testing.T, c *card, name string, args ...string) *simProc {
	t.Helper()
	return launchSim(t, c, name, args...)()
}

// launchSim starts the process and returns a function that waits until it
// listens, so that several engines can start together.
func launchSim(t *testing.T, c *card, name string, args ...string) func() *simProc {
	t.Helper()
	return launchProc(t, c, name, append([]string{"engine", "sim", "--port", "0",
		"--served-model-name", name, "--card-uuids", c.uuid}, args...), nil)
}

// launchProc runs the gpuplane binary with args and env added to the
// test's environment (a driver's Command), on card c.
func launchProc(t *testing.T, c *card, name string, args, env []string) func() *simProc {
	t.Helper()
	cmd := exec.Command(gpuplaneBin(t), args...)
	cmd.Env = append(append(os.Environ(), env...), inventory.EnvSimUsageDir+"="+c.dir)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sent := false
		for sc.Scan() {
			log.WriteString(sc.Text() + "\n")
			if m := addrRE.FindStringSubmatch(sc.Text()); m != nil && !sent {
				addr <- m[1]
				sent = true
			}
		}
		close(addr)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	})
	return func() *simProc {
		t.Helper()
		a, ok := <-addr
		if !ok {
			t.Fatalf("sim engine %s exited before listening", name)
		}
		return &simProc{base: "http://" + a, pid: cmd.Process.Pid}
	}
}

// waitHealthy polls /health until 200.
func (p *simProc) waitHealthy(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get(p.base + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("sim engine never became healthy")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (p *simProc) status(t *testing.T) simengine.Status {
	t.Helper()
	resp, err := http.Get(p.base + "/sim/status")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st simengine.Status
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	return st
}

// chat sends a short chat request and returns the status code and body.
func (p *simProc) chat(t *testing.T, model string) (int, string) {
	t.Helper()
	resp, err := http.Post(p.base+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"`+model+`","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	return resp.StatusCode, b.String()
}

// stream is one long streaming completion whose token arrival times are
// recorded until it is stopped.
type stream struct {
	mu     sync.Mutex
	times  []time.Time
	cancel context.CancelFunc
	done   chan struct{}
}

func startStream(t *testing.T, p *simProc, model string) *stream {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.base+"/v1/completions",
		strings.NewReader(`{"model":"`+model+`","prompt":"go","max_tokens":1000000,"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	s := &stream{cancel: cancel, done: make(chan struct{})}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("stream: %s", resp.Status)
	}
	go func() {
		defer close(s.done)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "data: {") {
				s.mu.Lock()
				s.times = append(s.times, time.Now())
				s.mu.Unlock()
			}
		}
	}()
	t.Cleanup(s.stop)
	return s
}

func (s *stream) stop() {
	s.cancel()
	<-s.done
}

func (s *stream) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.times)
}

// in counts the tokens that arrived in [from, to).
func (s *stream) in(from, to time.Time) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, at := range s.times {
		if !at.Before(from) && at.Before(to) {
			n++
		}
	}
	return n
}

// waitTokens waits until the stream has n tokens.
func (s *stream) waitTokens(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for s.count() < n {
		if time.Now().After(deadline) {
			t.Fatalf("stream has %d tokens, want %d", s.count(), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestVLLMControlsSleepAndWakeASimEngine drives a real sim engine process
// through the vLLM driver and reads its memory the way the watchdog does:
// KV grows with tokens in flight up to its pool; asleep the engine holds
// only its residual and refuses requests; a level-1 wake copies the weights
// back (the wake time), a level-2 wake reloads them (the load time).
func TestVLLMControlsSleepAndWakeASimEngine(t *testing.T) {
	c := newCard(t)
	// 6000 MiB peak: 500 overhead, 4500 weights, 1000 KV pool at 1 MiB a token.
	p := startSim(t, c, "chat", "--memory-mib", "6000", "--overhead-mib", "500", "--kv-pool-mib", "1000",
		"--kv-kib-per-token", "1024", "--sleep-residual-mib", "300", "--load-seconds", "1.5",
		"--wake-seconds", "0.3", "--tokens-per-second", "400")
	p.waitHealthy(t)
	c.waitUsed(t, p.pid, 5000, "awake and idle")

	ctl, err := ControlsFor(KindSim, Target{BaseURL: p.base})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if asleep, err := ctl.IsSleeping(ctx); err != nil || asleep {
		t.Fatalf("IsSleeping of a loaded engine = %t, %v", asleep, err)
	}

	// KV: memory grows with the tokens in flight, stops at the pool and
	// is freed when the request ends.
	s := startStream(t, p, "chat")
	s.waitTokens(t, 50)
	if used := c.usedMiB(t, p.pid); used <= 5000 || used > 6000 {
		// The report may lag a tick behind the first tokens; poll once more.
		time.Sleep(100 * time.Millisecond)
		if used = c.usedMiB(t, p.pid); used <= 5000 || used > 6000 {
			t.Fatalf("with %d tokens in flight NVML reports %d MiB, want between 5001 and 6000", s.count(), used)
		}
	}
	s.waitTokens(t, 1100)
	c.waitUsed(t, p.pid, 6000, "KV cache at its pool")
	if used := c.usedMiB(t, p.pid); used > 6000 {
		t.Fatalf("KV grew past its pool: %d MiB", used)
	}
	s.stop()
	c.waitUsed(t, p.pid, 5000, "request ended")

	// Level 1: down to the residual at once, weights in host RAM.
	if err := ctl.Sleep(ctx, SleepOffload); err != nil {
		t.Fatal(err)
	}
	if used := c.usedMiB(t, p.pid); used != 300 {
		t.Fatalf("asleep at level 1 NVML reports %d MiB, want the 300 MiB residual", used)
	}
	if st := p.status(t); st.State != "asleep" || st.HostMiB != 4500 {
		t.Fatalf("status asleep at level 1 = %+v, want the 4500 MiB of weights in host RAM", st)
	}
	if asleep, err := ctl.IsSleeping(ctx); err != nil || !asleep {
		t.Fatalf("IsSleeping after Sleep = %t, %v", asleep, err)
	}
	if code, body := p.chat(t, "chat"); code != http.StatusServiceUnavailable || !strings.Contains(body, "sleeping") {
		t.Fatalf("request to a sleeping engine: %d %s; want 503 saying it sleeps", code, body)
	}
	start := time.Now()
	if err := ctl.Wake(ctx); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < 300*time.Millisecond {
		t.Fatalf("level-1 wake took %v, less than the 0.3 s wake time", took)
	}
	// The engine's report to the simulated NVML may land a moment after
	// its answer to the wake.
	c.waitUsed(t, p.pid, 5000, "awake again")
	if code, body := p.chat(t, "chat"); code != http.StatusOK {
		t.Fatalf("request after waking: %d %s", code, body)
	}

	// Level 2: the weights are gone, so waking reloads them.
	if err := ctl.Sleep(ctx, SleepDiscard); err != nil {
		t.Fatal(err)
	}
	if used, st := c.usedMiB(t, p.pid), p.status(t); used != 300 || st.HostMiB != 0 {
		t.Fatalf("asleep at level 2: NVML %d MiB, host %d MiB; want 300 and 0", used, st.HostMiB)
	}
	start = time.Now()
	if err := ctl.Wake(ctx); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < 1500*time.Millisecond {
		t.Fatalf("level-2 wake took %v, less than the 1.5 s reload", took)
	}
	if code, body := p.chat(t, "chat"); code != http.StatusOK {
		t.Fatalf("request after a level-2 wake: %d %s", code, body)
	}
	if err := ctl.Sleep(ctx, 3); err == nil || !strings.Contains(err.Error(), "supports [1 2]") {
		t.Fatalf("Sleep(3) = %v, want an error naming the levels", err)
	}
}

// TestVLLMWakeAfterAnUnseenLevel2Sleep: a driver that did not put the
// engine to sleep (an agent restarted) wakes it the level-2 way, which
// reloads the weights, and the engine serves again.
func TestVLLMWakeAfterAnUnseenLevel2Sleep(t *testing.T) {
	c := newCard(t)
	p := startSim(t, c, "chat", "--memory-mib", "2000", "--load-seconds", "0.2", "--tokens-per-second", "0")
	p.waitHealthy(t)
	ctx := context.Background()
	if err := NewVLLMControls(Target{BaseURL: p.base}).Sleep(ctx, SleepDiscard); err != nil {
		t.Fatal(err)
	}
	fresh := NewVLLMControls(Target{BaseURL: p.base})
	if err := fresh.Wake(ctx); err != nil {
		t.Fatal(err)
	}
	if code, body := p.chat(t, "chat"); code != http.StatusOK {
		t.Fatalf("request after waking: %d %s", code, body)
	}
	c.waitUsed(t, p.pid, 2000, "awake")
}

// TestLlamaCppAndOllamaControlsAgainstASimEngine: the sim engine answers
// llama.cpp's router and Ollama's keep_alive calls, so their drivers run
// against a real process: unloading frees the card, loading (a cold start:
// runtime init and weight load) brings the memory back.
func TestLlamaCppAndOllamaControlsAgainstASimEngine(t *testing.T) {
	c := newCard(t)
	p := startSim(t, c, "qwen3:8b", "--memory-mib", "3000", "--overhead-mib", "400",
		"--init-seconds", "0.2", "--load-seconds", "0.3", "--tokens-per-second", "0")
	p.waitHealthy(t)
	c.waitUsed(t, p.pid, 3000, "loaded")
	ctx := context.Background()

	for _, kind := range []string{KindLlamaCpp, KindOllama} {
		t.Run(kind, func(t *testing.T) {
			spec := &pb.ModelSpec{Model: "qwen3:8b", ServedModelName: "qwen3:8b", Engine: &pb.EngineSpec{Kind: kind}}
			ctl, err := ControlsFor(kind, Target{BaseURL: p.base, Model: Params{Model: "qwen", Spec: spec}.ControlModel()})
			if err != nil {
				t.Fatal(err)
			}
			// Ollama's unload keeps `ollama serve`; llama.cpp's router
			// stops the model's process.
			if caps := ctl.Caps(); caps.KeepsProcess != (kind == KindOllama) || len(caps.Levels) != 1 || caps.Levels[0] != SleepDiscard {
				t.Fatalf("caps = %+v, want level 2 only, keeping the process only for Ollama", caps)
			}
			if err := ctl.Sleep(ctx, SleepOffload); err == nil {
				t.Fatal("Sleep(1) succeeded on an engine without host offload")
			}
			if err := ctl.Sleep(ctx, SleepDiscard); err != nil {
				t.Fatal(err)
			}
			if used := c.usedMiB(t, p.pid); used != 0 {
				t.Fatalf("unloaded: NVML reports %d MiB, want none", used)
			}
			if asleep, err := ctl.IsSleeping(ctx); err != nil || !asleep {
				t.Fatalf("IsSleeping after unload = %t, %v", asleep, err)
			}
			start := time.Now()
			if err := ctl.Wake(ctx); err != nil {
				t.Fatal(err)
			}
			if took := time.Since(start); took < 500*time.Millisecond {
				t.Fatalf("load took %v, less than init + weight load (0.5 s)", took)
			}
			if used := c.usedMiB(t, p.pid); used != 3000 {
				t.Fatalf("loaded again: NVML reports %d MiB, want 3000", used)
			}
			if asleep, err := ctl.IsSleeping(ctx); err != nil || asleep {
				t.Fatalf("IsSleeping after load = %t, %v", asleep, err)
			}
		})
	}

	// Unlike vLLM's sleep, an unloaded llama.cpp or Ollama model is loaded
	// by the next request.
	if err := NewLlamaCppControls(Target{BaseURL: p.base, Model: "qwen3:8b"}).Sleep(ctx, SleepDiscard); err != nil {
		t.Fatal(err)
	}
	if code, body := p.chat(t, "qwen3:8b"); code != http.StatusOK {
		t.Fatalf("request to an unloaded model: %d %s; want it loaded and served", code, body)
	}
	c.waitUsed(t, p.pid, 3000, "loaded by a request")
}

// TestSimEnginesOnACardShareItsCompute: two busy sim engines on one card
// each serve fewer tokens than one alone, in proportion to their compute
// shares, while together they keep the card busy. Token counts in a window
// are compared within the test, so a slow machine slows both sides.
func TestSimEnginesOnACardShareItsCompute(t *testing.T) {
	c := newCard(t)
	args := []string{"--memory-mib", "1000", "--load-seconds", "0", "--tokens-per-second", "100"}
	a := startSim(t, c, "a", append(args, "--compute-percent", "50")...)
	b := startSim(t, c, "b", append(args, "--compute-percent", "50")...)
	a.waitHealthy(t)
	b.waitHealthy(t)
	const window = 2 * time.Second

	// measure lets the streams settle (the neighbours' records are read
	// every tick), then counts tokens in one window.
	measure := func(streams ...*stream) []int {
		for _, s := range streams {
			s.waitTokens(t, 5)
		}
		time.Sleep(200 * time.Millisecond)
		from := time.Now()
		time.Sleep(window)
		to := time.Now()
		counts := make([]int, len(streams))
		for i, s := range streams {
			counts[i] = s.in(from, to)
		}
		return counts
	}

	solo := startStream(t, a, "a")
	alone := measure(solo)[0]
	solo.stop()

	sa, sb := startStream(t, a, "a"), startStream(t, b, "b")
	both := measure(sa, sb)
	sa.stop()
	sb.stop()
	t.Logf("tokens in %v: a alone %d; a and b busy together %d and %d", window, alone, both[0], both[1])
	if alone < 50 {
		t.Fatalf("a alone served %d tokens in %v at 100 tokens/s", alone, window)
	}
	for i, n := range both {
		if float64(n) > 0.75*float64(alone) {
			t.Errorf("engine %d served %d tokens beside a busy neighbour, %d alone: want at most 75%%", i, n, alone)
		}
	}
	if sum := both[0] + both[1]; float64(sum) < 0.6*float64(alone) {
		t.Errorf("together they served %d tokens, alone %d: the card's compute went missing", sum, alone)
	}
}

// TestComputeSharesWeighTheSplit: busy engines split the card by their
// compute shares (75 % and 25 %).
func TestComputeSharesWeighTheSplit(t *testing.T) {
	c := newCard(t)
	args := []string{"--memory-mib", "1000", "--load-seconds", "0", "--tokens-per-second", "100"}
	big := startSim(t, c, "big", append(args, "--compute-percent", "75")...)
	small := startSim(t, c, "small", append(args, "--compute-percent", "25")...)
	big.waitHealthy(t)
	small.waitHealthy(t)
	sb, ss := startStream(t, big, "big"), startStream(t, small, "small")
	sb.waitTokens(t, 5)
	ss.waitTokens(t, 2)
	time.Sleep(200 * time.Millisecond)
	from := time.Now()
	time.Sleep(2 * time.Second)
	to := time.Now()
	nb, ns := sb.in(from, to), ss.in(from, to)
	t.Logf("tokens in 2s: 75%% share %d, 25%% share %d", nb, ns)
	if nb < 2*ns || ns == 0 {
		t.Fatalf("75%% share served %d tokens, 25%% share %d: want the larger share at least twice as fast, the smaller not starved", nb, ns)
	}
}

// TestConcurrentLoadsOnACardAreSlower: weight loads share the card's copy
// bandwidth, so two engines loading at once each take longer than one
// alone. The durations are the engines' own (GET /sim/status), which do
// not include process start. Two loads of L seconds started D apart each
// take 2L-D: 2 s loads stay above 1.4 times alone while the second
// process starts up to 1.2 s after the first (a loaded CI).
func TestConcurrentLoadsOnACardAreSlower(t *testing.T) {
	args := []string{"--memory-mib", "1000", "--load-seconds", "2", "--tokens-per-second", "0"}
	c1 := newCard(t)
	solo := startSim(t, c1, "solo", args...)
	solo.waitHealthy(t)
	alone := solo.status(t).LastLoadSecs

	// Started together, they overlap for all but the moments between two
	// process starts.
	c2 := newCard(t)
	wait0, wait1 := launchSim(t, c2, "m0", args...), launchSim(t, c2, "m1", args...)
	procs := []*simProc{wait0(), wait1()}
	for i, p := range procs {
		p.waitHealthy(t)
		took := p.status(t).LastLoadSecs
		t.Logf("load %d beside another took %.2fs; alone %.2fs", i, took, alone)
		if took < 1.4*alone {
			t.Errorf("load %d beside another took %.2fs, alone %.2fs: want at least 1.4 times as long", i, took, alone)
		}
	}
}

// execProcess runs a sim engine as the executor would: the start/stop
// fallback's Process, over a real process.
type execProcess struct {
	t    *testing.T
	card *card
	args []string
	mu   sync.Mutex
	cmd  *exec.Cmd
	pid  int
}

func (e *execProcess) Start(ctx context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	cmd := exec.CommandContext(ctx, gpuplaneBin(e.t), append([]string{"engine", "sim", "--port", "0",
		"--served-model-name", "job", "--card-uuids", e.card.uuid}, e.args...)...)
	cmd.Env = append(os.Environ(), inventory.EnvSimUsageDir+"="+e.card.dir)
	if err := cmd.Start(); err != nil {
		return err
	}
	e.cmd, e.pid = cmd, cmd.Process.Pid
	return nil
}

func (e *execProcess) Stop(context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.cmd == nil {
		return nil
	}
	_ = e.cmd.Process.Signal(syscall.SIGTERM)
	_ = e.cmd.Wait()
	e.cmd = nil
	return nil
}

func (e *execProcess) Running() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.cmd != nil
}

// TestStartStopControls: an engine without controls (command) sleeps by
// stopping its process, which frees the card, and wakes by starting it.
func TestStartStopControls(t *testing.T) {
	c := newCard(t)
	proc := &execProcess{t: t, card: c, args: []string{"--memory-mib", "1500", "--load-seconds", "0"}}
	t.Cleanup(func() { _ = proc.Stop(context.Background()) })
	ctx := context.Background()
	if _, err := ControlsFor(KindCommand, Target{}); err == nil {
		t.Fatal("start/stop controls without a process were accepted")
	}
	ctl, err := ControlsFor(KindCommand, Target{Process: proc})
	if err != nil {
		t.Fatal(err)
	}
	if err := ctl.Wake(ctx); err != nil {
		t.Fatal(err)
	}
	c.waitUsed(t, proc.pid, 1500, "started")
	pid := proc.pid
	if err := ctl.Sleep(ctx, SleepDiscard); err != nil {
		t.Fatal(err)
	}
	if used := c.usedMiB(t, pid); used != 0 {
		t.Fatalf("stopped engine still uses %d MiB", used)
	}
	if asleep, err := ctl.IsSleeping(ctx); err != nil || !asleep {
		t.Fatalf("IsSleeping of a stopped engine = %t, %v", asleep, err)
	}
	if err := ctl.Wake(ctx); err != nil {
		t.Fatal(err)
	}
	c.waitUsed(t, proc.pid, 1500, "started again")
	if err := ctl.Sleep(ctx, SleepOffload); err == nil {
		t.Fatal("Sleep(1) succeeded on an engine without controls")
	}
}
