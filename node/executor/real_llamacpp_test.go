package executor

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/internal/realengine"
	"github.com/gpuplane/gpuplane/internal/testutil"
	"github.com/gpuplane/gpuplane/internal/tinygguf"
	"github.com/gpuplane/gpuplane/node/engine"
	"github.com/gpuplane/gpuplane/node/procfs"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// realLlamaOnPath puts the real llama-server first on PATH, where the
// llamacpp driver's command ("llama-server") is looked up.
func realLlamaOnPath(t *testing.T) {
	t.Helper()
	bin := realengine.LlamaServer(t)
	dir := t.TempDir()
	if err := os.Symlink(bin, filepath.Join(dir, "llama-server")); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
}

// llamaReplica is a llamacpp deployment of the tiny model at 40 % of card 0.
func llamaReplica(model, file string, generation uint64, e *pb.EngineSpec) Desired {
	e.Kind, e.MemoryPercent = engine.KindLlamaCpp, 40
	e.Args = append(e.Args, "--threads", "1", "--no-webui")
	return Desired{
		Replica: &pb.Replica{Model: model, Index: 0, Generation: generation, Node: node, Accelerator: "shared",
			Cards: []uint32{0}, MemoryMib: 9213, PlacedIndex: 7,
			State: pb.ReplicaState_REPLICA_STATE_PLACED},
		Spec: &pb.ModelSpec{Model: file, ServedModelName: model, Replicas: 1, Engine: e},
	}
}

// llamaPIDs are the live llama-server processes serving model (its --alias).
func llamaPIDs(t *testing.T, model string) []int {
	t.Helper()
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	var out []int
	for _, d := range dirs {
		pid, _ := strconv.Atoi(filepath.Base(d))
		raw, err := os.ReadFile(filepath.Join(d, "cmdline"))
		if err != nil {
			continue
		}
		argv := strings.Split(string(raw), "\x00")
		if filepath.Base(argv[0]) != "llama-server" || !strings.Contains(string(raw), "\x00--alias\x00"+model+"\x00") {
			continue
		}
		if st, err := procfs.ReadStat(pid); err == nil && st.Alive() {
			out = append(out, pid)
		}
	}
	return out
}

// TestRealLlamaCppDriver: the executor runs the real llama-server as the
// llamacpp driver starts it. It is Running only once the engine answers
// (a completion at once); the slots the gateway admits (engine.LlamaSlots,
// from --parallel, LLAMA_ARG_N_PARALLEL or the auto 4) are the engine's
// /props total_slots; /metrics has what ReadLoad reads; kill -9 restarts
// it; a replica removed stops it.
func TestRealLlamaCppDriver(t *testing.T) {
	realLlamaOnPath(t)
	f := tinygguf.Write(t)
	h := newHarness(t, t.TempDir(), nil)
	specs := map[string]*pb.EngineSpec{
		"explicit": {MaxModelLen: 256, Args: []string{"--parallel", "2"}},
		"env":      {MaxModelLen: 256, Env: map[string]string{"LLAMA_ARG_N_PARALLEL": "3"}},
		"auto":     {MaxModelLen: 256},
	}
	var want []Desired
	for name, e := range specs {
		want = append(want, llamaReplica(name, f.Model, 1, e))
	}
	// No maxModelLen, a model trained on 1Mi tokens, a share of 8 MiB:
	// the driver's -c is what the share holds (some 13k tokens at 512
	// bytes a token), not llama-server's default of the trained context.
	long := filepath.Join(t.TempDir(), "long.gguf")
	if err := tinygguf.WriteModel(long, tinygguf.ModelOptions{Context: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	share := llamaReplica("share", long, 1, &pb.EngineSpec{})
	share.Replica.MemoryMib = 8
	want = append(want, share)
	h.want(10, want...)
	st := h.waitState("share", pb.ReplicaState_REPLICA_STATE_RUNNING, 30*time.Second)
	if n := propsOf(t, st.GetEndpoint()).Settings.NCtx; n < 4096 || n > 16384 {
		t.Errorf("a llama-server at 8 MiB of a shared card without maxModelLen holds %d tokens a slot; want its share's ~13k", n)
	}
	for name, e := range specs {
		st := h.waitState(name, pb.ReplicaState_REPLICA_STATE_RUNNING, 30*time.Second)
		base := st.GetEndpoint()
		resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"hi","max_tokens":2}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%s: a completion as soon as Running: %d", name, resp.StatusCode)
		}
		props := propsOf(t, base)
		if got := engine.LlamaSlots(e); props.TotalSlots != got {
			t.Errorf("%s: llama-server runs %d slots, the gateway admits %d (engine.LlamaSlots)", name, props.TotalSlots, got)
		}
		if props.Settings.NCtx < 256 {
			t.Errorf("%s: a slot holds %d tokens, less than maxModelLen 256", name, props.Settings.NCtx)
		}
		load, err := engine.ReadLoad(context.Background(), http.DefaultClient, engine.KindLlamaCpp, base, "")
		if err != nil || load.Running != 0 || load.Waiting != 0 {
			t.Errorf("%s: ReadLoad of an idle engine: %+v, %v", name, load, err)
		}
	}
	old := llamaPIDs(t, "explicit")
	if len(old) != 1 {
		t.Fatalf("llama-server processes for explicit: %v, want 1", old)
	}
	if err := syscall.Kill(old[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testutil.Until(t, 30*time.Second, "the killed llama-server did not run again", func() bool {
		st := h.rep.last("explicit")
		return st.State == pb.ReplicaState_REPLICA_STATE_RUNNING && st.Restarts == 1
	})
	if now := llamaPIDs(t, "explicit"); len(now) != 1 || now[0] == old[0] {
		t.Errorf("after kill -9 of %d: llama-server processes %v", old[0], now)
	}
	h.want(11)
	testutil.Until(t, 15*time.Second, "llama-server still runs after its replica left", func() bool {
		return len(llamaPIDs(t, "explicit"))+len(llamaPIDs(t, "env"))+len(llamaPIDs(t, "auto")) == 0
	})
}

// llamaProps is what TestRealLlamaCppDriver reads of llama-server's /props.
type llamaProps struct {
	TotalSlots int `json:"total_slots"`
	Settings   struct {
		NCtx int `json:"n_ctx"`
	} `json:"default_generation_settings"`
}

func propsOf(t *testing.T, base string) llamaProps {
	t.Helper()
	var props llamaProps
	resp, err := http.Get(base + "/props")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&props); err != nil {
		t.Fatal(err)
	}
	return props
}

// TestRealLlamaCppEngineKey: with engine keys, the executor starts the real
// llama-server with its key in its environment (not on its command line):
// it is Running (its /health needs no key), a completion or /metrics
// without the key is refused 401, with it answered, and ReadLoad reads the
// metrics with it.
func TestRealLlamaCppEngineKey(t *testing.T) {
	realLlamaOnPath(t)
	f := tinygguf.Write(t)
	keys := engine.NewKeys([]byte("0123456789abcdef0123456789abcdef"))
	h := newHarness(t, t.TempDir(), func(o *Options) { o.EngineKeys = keys })
	h.want(10, llamaReplica("keyed", f.Model, 1, &pb.EngineSpec{MaxModelLen: 256, Args: []string{"--parallel", "1"}}))
	base := h.waitState("keyed", pb.ReplicaState_REPLICA_STATE_RUNNING, 30*time.Second).GetEndpoint()
	key := keys.For("keyed", 0)
	for _, path := range []string{"/v1/completions", "/metrics", "/props"} {
		for _, withKey := range []bool{false, true} {
			method, body := http.MethodGet, ""
			if path == "/v1/completions" {
				method, body = http.MethodPost, `{"prompt":"hi","max_tokens":1}`
			}
			req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
			if withKey {
				engine.Authorize(req.Header, key)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if want := map[bool]int{false: http.StatusUnauthorized, true: http.StatusOK}[withKey]; resp.StatusCode != want {
				t.Errorf("%s %s with the key: %v: %d, want %d", method, path, withKey, resp.StatusCode, want)
			}
		}
	}
	if _, err := engine.ReadLoad(context.Background(), http.DefaultClient, engine.KindLlamaCpp, base, key); err != nil {
		t.Errorf("ReadLoad with the key: %v", err)
	}
	pids := llamaPIDs(t, "keyed")
	if len(pids) != 1 {
		t.Fatalf("llama-server processes: %v", pids)
	}
	cmdline, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pids[0]), "cmdline"))
	environ, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pids[0]), "environ"))
	if strings.Contains(string(cmdline), key) || !strings.Contains(string(environ), "LLAMA_API_KEY="+key) {
		t.Errorf("the key is on the command line (%v) or not in the environment (%v)", strings.Contains(string(cmdline), key), strings.Contains(string(environ), key))
	}
}
