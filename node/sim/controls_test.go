package sim

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/internal/testutil"
	"github.com/gpuplane/gpuplane/node/inventory"
)

// startEngine runs an engine in this process and waits until it serves.
func startEngine(t *testing.T, cfg Config) (string, *inventory.SimUsage) {
	t.Helper()
	usage := inventory.NewSimUsage(t.TempDir())
	addrc := make(chan net.Addr, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	cfg.Host, cfg.CardUUIDs, cfg.Usage = "127.0.0.1", []string{"GPU-a"}, usage
	cfg.Ready = func(a net.Addr) { addrc <- a }
	go func() { done <- Run(ctx, cfg) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	var base string
	select {
	case a := <-addrc:
		base = "http://" + a.String()
	case err := <-done:
		t.Fatalf("Run: %v", err)
	}
	testutil.Until(t, 20*time.Second, "healthy", func() bool { return get(t, base+"/health") == http.StatusOK })
	return base, usage
}

func usedMiB(t *testing.T, usage *inventory.SimUsage) uint64 {
	t.Helper()
	procs, err := usage.Processes("GPU-a")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range procs {
		if p.PID == os.Getpid() {
			return p.UsedMiB
		}
	}
	return 0
}

// call sends method url with body and returns the status and body.
func call(t *testing.T, method, url, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(data)
}

func isSleeping(t *testing.T, base string) bool {
	t.Helper()
	var v struct {
		IsSleeping bool `json:"is_sleeping"`
	}
	getJSON(t, base+"/is_sleeping", &v)
	return v.IsSleeping
}

// A sleep in vLLM's default mode cuts off a stream in flight: it ends with
// finish_reason "abort" and [DONE], and the sleep answers 200 with an empty
// body as vLLM's does.
func TestSleepAbortsStreamsInFlight(t *testing.T) {
	base, _ := startEngine(t, Config{ServedModelName: "chat", MemoryMiB: 1000, TokensPerSecond: 100})
	resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"x","max_tokens":100000,"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	if !sc.Scan() {
		t.Fatal("no first token")
	}
	if code, body := call(t, http.MethodPost, base+"/sleep", ""); code != http.StatusOK || body != "" {
		t.Fatalf("POST /sleep = %d %q, want 200 and no body", code, body)
	}
	var finish, last string
	for sc.Scan() {
		line := sc.Text()
		if strings.Contains(line, `"finish_reason":"abort"`) {
			finish = "abort"
		}
		if line != "" {
			last = line
		}
	}
	if finish != "abort" || last != "data: [DONE]" {
		t.Fatalf("stream ended with finish %q, last line %q; want abort and [DONE]", finish, last)
	}
}

// mode=wait lets a request in flight finish before the engine sleeps.
func TestSleepWaitLetsRequestsFinish(t *testing.T) {
	base, usage := startEngine(t, Config{ServedModelName: "chat", MemoryMiB: 1000, ResidualMiB: 100, TokensPerSecond: 50})
	type answer struct {
		code int
		body string
	}
	got := make(chan answer, 1)
	go func() {
		code, body := call(t, http.MethodPost, base+"/v1/completions", `{"prompt":"x","max_tokens":20}`)
		got <- answer{code, body}
	}()
	testutil.Until(t, 20*time.Second, "busy", func() bool {
		var st Status
		getJSON(t, base+"/sim/status", &st)
		return st.InFlight == 1
	})
	if code, body := call(t, http.MethodPost, base+"/sleep?level=1&mode=wait", ""); code != http.StatusOK {
		t.Fatalf("POST /sleep?mode=wait = %d %s", code, body)
	}
	// The answer may reach this client a moment after the sleep's does;
	// what matters is that the request ran to its end, not cut off.
	select {
	case a := <-got:
		if a.code != http.StatusOK || !strings.Contains(a.body, `"completion_tokens":20`) || strings.Contains(a.body, `"abort"`) {
			t.Fatalf("request in flight during a waiting sleep answered %d %s; want all 20 tokens", a.code, a.body)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the request in flight during a waiting sleep never got its answer")
	}
	if !isSleeping(t, base) || usedMiB(t, usage) != 100 {
		t.Fatalf("after the sleep: is_sleeping %t, %d MiB; want true and 100", isSleeping(t, base), usedMiB(t, usage))
	}
}

// A level-2 wake the vLLM way: weights first (a reload; the engine still
// sleeps), reload_weights, then the KV cache.
func TestWakeByTags(t *testing.T) {
	base, usage := startEngine(t, Config{ServedModelName: "chat", MemoryMiB: 1000, OverheadMiB: 200,
		KVPoolMiB: 300, ResidualMiB: 150, LoadTime: 100 * time.Millisecond})
	if code, _ := call(t, http.MethodPost, base+"/sleep?level=2", ""); code != http.StatusOK {
		t.Fatal("sleep failed")
	}
	if code, body := call(t, http.MethodPost, base+"/collective_rpc", `{"method":"reload_weights"}`); code != http.StatusConflict {
		t.Fatalf("reload_weights with no weights on the card = %d %s, want 409", code, body)
	}
	if code, _ := call(t, http.MethodPost, base+"/wake_up?tags=weights", ""); code != http.StatusOK {
		t.Fatal("wake weights failed")
	}
	if !isSleeping(t, base) || usedMiB(t, usage) != 150+500 {
		t.Fatalf("weights woken: is_sleeping %t, %d MiB; want true and 650 (residual + weights)", isSleeping(t, base), usedMiB(t, usage))
	}
	if code, body := call(t, http.MethodPost, base+"/v1/completions", `{"prompt":"x"}`); code != http.StatusServiceUnavailable {
		t.Fatalf("request with only the weights woken = %d %s, want 503", code, body)
	}
	if code, body := call(t, http.MethodPost, base+"/collective_rpc", `{"method":"reload_weights"}`); code != http.StatusOK {
		t.Fatalf("reload_weights = %d %s", code, body)
	}
	if code, _ := call(t, http.MethodPost, base+"/wake_up?tags=kv_cache", ""); code != http.StatusOK {
		t.Fatal("wake kv_cache failed")
	}
	if isSleeping(t, base) || usedMiB(t, usage) != 700 {
		t.Fatalf("fully woken: is_sleeping %t, %d MiB; want false and 700", isSleeping(t, base), usedMiB(t, usage))
	}
	if code, body := call(t, http.MethodPost, base+"/v1/completions", `{"prompt":"x"}`); code != http.StatusOK {
		t.Fatalf("request after waking = %d %s", code, body)
	}
}

// Bad control input is answered with what is wrong and changes nothing.
func TestBadControlInput(t *testing.T) {
	base, usage := startEngine(t, Config{ServedModelName: "chat", MemoryMiB: 1000})
	for _, tc := range []struct{ method, path, body, want string }{
		{http.MethodPost, "/sleep?level=3", "", `level "3"`},
		{http.MethodPost, "/sleep?level=x", "", `level "x"`},
		{http.MethodPost, "/sleep?mode=keep", "", `mode "keep"`},
		{http.MethodPost, "/wake_up?tags=optimizer", "", `tag "optimizer"`},
		{http.MethodPost, "/collective_rpc", `{"method":"save"}`, `method "save"`},
		{http.MethodPost, "/models/load", `{"model":"other"}`, `model \"other\" not found`},
		{http.MethodPost, "/models/unload", `{}`, `model \"\" not found`},
		{http.MethodPost, "/api/generate", `{"model":"chat","keep_alive":"soon"}`, "keep_alive"},
		{http.MethodPost, "/api/generate", `{"model":"chat","prompt":"hi"}`, "only to load or unload"},
	} {
		code, body := call(t, tc.method, base+tc.path, tc.body)
		if code/100 != 4 || !strings.Contains(body, tc.want) {
			t.Errorf("%s %s %s = %d %q; want 4xx mentioning %s", tc.method, tc.path, tc.body, code, body, tc.want)
		}
	}
	if isSleeping(t, base) || usedMiB(t, usage) != 1000 {
		t.Fatalf("bad input changed the engine: is_sleeping %t, %d MiB", isSleeping(t, base), usedMiB(t, usage))
	}
}

// llama.cpp's --sleep-idle-seconds: idle, the engine sleeps (the card is
// freed but for the residual) and the next request wakes it.
func TestIdleSleepWakesOnRequest(t *testing.T) {
	base, usage := startEngine(t, Config{ServedModelName: "chat", MemoryMiB: 1000, OverheadMiB: 100, ResidualMiB: 100,
		SleepIdle: 200 * time.Millisecond, LoadTime: 50 * time.Millisecond})
	testutil.Until(t, 20*time.Second, "asleep after idling", func() bool {
		var props struct {
			IsSleeping bool `json:"is_sleeping"`
		}
		getJSON(t, base+"/props", &props)
		return props.IsSleeping
	})
	// The engine reports its memory just after it says it sleeps.
	testutil.Until(t, 20*time.Second, "idle-asleep with the 100 MiB residual", func() bool { return usedMiB(t, usage) == 100 })
	if code, body := call(t, http.MethodPost, base+"/v1/completions", `{"prompt":"x","max_tokens":2}`); code != http.StatusOK {
		t.Fatalf("request to an idle-asleep engine = %d %s; want it woken and served", code, body)
	}
}

// Ollama's keep_alive: a model loaded for 300ms unloads by itself.
func TestOllamaKeepAliveExpires(t *testing.T) {
	base, usage := startEngine(t, Config{ServedModelName: "qwen3", MemoryMiB: 1000})
	if code, body := call(t, http.MethodPost, base+"/api/generate", `{"model":"qwen3","keep_alive":"300ms"}`); code != http.StatusOK || !strings.Contains(body, `"done_reason":"load"`) {
		t.Fatalf("load = %d %s", code, body)
	}
	var ps struct {
		Models []struct{ Name string } `json:"models"`
	}
	getJSON(t, base+"/api/ps", &ps)
	if len(ps.Models) != 1 || ps.Models[0].Name != "qwen3" {
		t.Fatalf("/api/ps while loaded = %+v", ps)
	}
	testutil.Until(t, 20*time.Second, "unloaded after keep_alive", func() bool { return usedMiB(t, usage) == 0 })
	getJSON(t, base+"/api/ps", &ps)
	if len(ps.Models) != 0 {
		t.Fatalf("/api/ps after keep_alive = %+v, want none", ps)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{ServedModelName: "m", MemoryMiB: 100, OverheadMiB: 60, KVPoolMiB: 50}, "--overhead-mib (60) + --kv-pool-mib (50) must not exceed --memory-mib (100)"},
		{Config{ServedModelName: "m", MemoryMiB: 100, ResidualMiB: 200}, "--sleep-residual-mib (200)"},
		{Config{ServedModelName: "m", MemoryMiB: 100, KVKiBPerToken: 64}, "--kv-kib-per-token needs a --kv-pool-mib"},
		{Config{ServedModelName: "m", MemoryMiB: 100, ComputePercent: 101}, "--compute-percent 101"},
		{Config{ServedModelName: "m", MemoryMiB: 100, WakeTime: -1}, "--wake-seconds must not be negative"},
		{Config{ServedModelName: "m", MemoryMiB: 100, Parallel: -1}, "--parallel (-1) must not be negative"},
		{Config{ServedModelName: "m", MemoryMiB: 100, Dialect: DialectLlamaCpp, CacheRAMMiB: -2}, "--cache-ram (-2) must be a size in MiB, 0 (off) or -1 (no limit)"},
		{Config{MemoryMiB: 100}, "--served-model-name is required"},
	} {
		if err := tc.cfg.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate(%+v) = %v, want %q", tc.cfg, err, tc.want)
		}
	}
}

// Continuous batching within the KV pool: a request whose prompt does not
// fit beside the one in flight waits until it ends, then is served.
func TestRequestsQueueForKVRoom(t *testing.T) {
	// A pool of 10 tokens (1 MiB each).
	base, _ := startEngine(t, Config{ServedModelName: "chat", MemoryMiB: 1000, KVPoolMiB: 10, KVKiBPerToken: 1024, TokensPerSecond: 100})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/completions", strings.NewReader(`{"prompt":"first","max_tokens":1000000,"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	first, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Body.Close()
	status := func() Status {
		var st Status
		getJSON(t, base+"/sim/status", &st)
		return st
	}
	testutil.Until(t, 20*time.Second, "the first request filling the pool", func() bool { return status().KVTokens >= 10 })
	second := make(chan int, 1)
	go func() {
		code, _ := call(t, http.MethodPost, base+"/v1/completions", `{"prompt":"second","max_tokens":1}`)
		second <- code
	}()
	testutil.Until(t, 20*time.Second, "the second request queued", func() bool { st := status(); return st.Waiting == 1 && st.InFlight == 1 })
	select {
	case code := <-second:
		t.Fatalf("the second request ended (%d) while the first filled the pool", code)
	default:
	}
	cancel()
	if code := <-second; code != http.StatusOK {
		t.Fatalf("the queued request answered %d once the pool had room, want 200", code)
	}
}

// TestStopIsNotHeldByAConnectionWithoutARequest: a client's spare
// connection (an HTTP transport dials one for a request that then got an
// idle connection, and pools it unused) has nothing in flight: stopping the
// engine must not wait for it. net/http's Shutdown waits about five
// seconds for such a connection, past the engine's own limit for stopping
// (Run then fails with "context deadline exceeded"), and holds up every
// unload that waits for the engine's process to end.
func TestStopIsNotHeldByAConnectionWithoutARequest(t *testing.T) {
	addrc := make(chan net.Addr, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Config{ServedModelName: "chat", MemoryMiB: 1000, Host: "127.0.0.1",
			Ready: func(a net.Addr) { addrc <- a }})
	}()
	var addr net.Addr
	select {
	case addr = <-addrc:
	case err := <-done:
		t.Fatalf("Run: %v", err)
	}
	base := "http://" + addr.String()
	testutil.Until(t, 20*time.Second, "healthy", func() bool { return get(t, base+"/health") == http.StatusOK })
	spare, err := net.Dial("tcp", addr.String())
	if err != nil {
		t.Fatal(err)
	}
	defer spare.Close()
	// The engine has accepted the connection once it answers a request
	// sent on a connection opened after it (accepts go in order).
	fresh := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := fresh.Get(base + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v; want a clean stop", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the engine did not stop")
	}
	// The spare connection was closed by the engine.
	_ = spare.SetReadDeadline(time.Now().Add(20 * time.Second))
	if n, err := spare.Read(make([]byte, 1)); err == nil {
		t.Fatalf("the spare connection read %d bytes after the engine stopped; want it closed", n)
	}
}
