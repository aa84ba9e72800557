package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/internal/porttest"
	"github.com/gpuplane/gpuplane/internal/realengine"
	"github.com/gpuplane/gpuplane/internal/tinygguf"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// The Ollama driver against the real `ollama serve` (realengine: the build
// in ../shared/engines, Ollama 0.24.0): each test starts it from the
// command the driver builds, with its own model store and home, and drives
// it as the executor and the residency controller do.

// realOllama is one `ollama serve` started from the driver's command.
type realOllama struct {
	base  string
	cmd   Command
	proc  *exec.Cmd
	done  <-chan struct{}
	store string
}

// ollamaSpec is an Ollama deployment of model whose engine keeps its
// models in store (and its keys under home).
func ollamaSpec(model, store, home string) *pb.ModelSpec {
	return &pb.ModelSpec{Model: model, ServedModelName: "chat", Engine: &pb.EngineSpec{Kind: KindOllama,
		Env: map[string]string{"OLLAMA_MODELS": store, "HOME": home, "OLLAMA_NUM_PARALLEL": "1"}}}
}

// startRealOllama runs the command Build makes for spec with the real
// binary and waits until its health path answers 200. store and home are
// the test's own (ollamaSpec).
func startRealOllama(t *testing.T, spec *pb.ModelSpec) *realOllama {
	t.Helper()
	bin := realengine.Ollama(t)
	port := porttest.Free(t)
	p := Params{Model: "chat", Spec: spec, Host: "127.0.0.1", Port: port,
		Replica: &pb.Replica{Model: "chat", Cards: []uint32{0}},
		Cards:   []*pb.Card{{Index: 0, Uuid: "GPU-00000000-0000-0000-0000-000000000000", MemoryMib: 1024}}}
	cmd, err := Build(p, Enforcement{Mode: ModeNone})
	if err != nil {
		t.Fatal(err)
	}
	// Start runs it in a process group of its own, as the executor starts
	// engines: a kill reaches the runners `ollama serve` starts.
	proc := exec.Command(bin, cmd.Args...)
	proc.Env = append(os.Environ(), cmd.Env...)
	base := "http://127.0.0.1:" + strconv.Itoa(port)
	started := realengine.Start(t, proc, base+cmd.HealthPath)
	return &realOllama{base: base, cmd: cmd, proc: proc, done: started.Done, store: spec.GetEngine().GetEnv()["OLLAMA_MODELS"]}
}

// call sends method path with a JSON body ("" for none); status 0 when
// nothing answered.
func (o *realOllama) call(t *testing.T, method, path, body string) (int, string) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, o.base+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(data)
}

// ps is what /api/ps lists: each model's name.
func (o *realOllama) ps(t *testing.T) []string {
	t.Helper()
	code, body := o.call(t, "GET", "/api/ps", "")
	if code != http.StatusOK {
		t.Fatalf("GET /api/ps: %d %s", code, body)
	}
	var out struct {
		Models []struct {
			Name string `json:"name"`
		} `json:"models"`
	}
	if err := json.Unmarshal([]byte(body), &out); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range out.Models {
		names = append(names, m.Name)
	}
	return names
}

// preload runs the driver's preload as the executor does, with a bound.
func (o *realOllama) preload(t *testing.T) ([]string, error) {
	t.Helper()
	if o.cmd.Preload == nil {
		t.Fatal("the Ollama driver's command has no preload")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var steps []string
	err := o.cmd.Preload.Run(ctx, o.base, func(s string) { steps = append(steps, s) })
	return steps, err
}

// controls are the controls the residency controller drives o with.
func (o *realOllama) controls(t *testing.T, spec *pb.ModelSpec) Controls {
	t.Helper()
	ctl, err := ControlsFor(ControlKind(spec.GetEngine()), Target{BaseURL: o.base, Model: Params{Model: "chat", Spec: spec}.ControlModel()})
	if err != nil {
		t.Fatal(err)
	}
	return ctl
}

// runners are the live processes of o's process group besides `ollama
// serve` itself: its model runners.
func (o *realOllama) runners() []int {
	var out []int
	dirs, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, d := range dirs {
		data, err := os.ReadFile(d)
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp ...
		rest := string(data[bytes.LastIndexByte(data, ')')+2:])
		f := strings.Fields(rest)
		pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(d)))
		if len(f) > 2 && f[2] == strconv.Itoa(o.proc.Process.Pid) && pid != o.proc.Process.Pid && f[0] != "Z" {
			out = append(out, pid)
		}
	}
	return out
}

// TestRealOllamaGGUFPathLifecycle: a deployment whose model is a GGUF file.
// `ollama serve` answers its health path before any model is loaded (the
// replica is not ready then: /api/ps is empty); the driver's preload
// creates the model in Ollama's own store from the file and loads it;
// requests by the driver's name are answered; a keep_alive sleep empties
// /api/ps and stops the runner while `ollama serve` stays, and a wake loads
// it again; a second start finds the model in the store and skips the
// copy; SIGTERM stops `ollama serve` and its runner.
func TestRealOllamaGGUFPathLifecycle(t *testing.T) {
	files := tinygguf.Write(t)
	dir := t.TempDir()
	spec := ollamaSpec(files.Model, filepath.Join(dir, "models"), dir)
	o := startRealOllama(t, spec)
	if names := o.ps(t); len(names) != 0 {
		t.Fatalf("before the preload /api/ps lists %v; want nothing loaded", names)
	}
	name := EngineModel(spec)
	if !strings.HasPrefix(name, "tiny:") {
		t.Fatalf("EngineModel = %q, want tiny:<path hash>", name)
	}
	steps, err := o.preload(t)
	if err != nil {
		t.Fatalf("preload: %v (steps %q)", err, steps)
	}
	if !hasSteps(steps, "copying", "creating", "loading") {
		t.Fatalf("preload steps %q; want a copy into the store, a create and a load", steps)
	}
	if names := o.ps(t); len(names) != 1 || !strings.EqualFold(names[0], name) {
		t.Fatalf("after the preload /api/ps lists %v; want %s", names, name)
	}
	if code, body := o.call(t, "GET", "/api/tags", ""); code != http.StatusOK || !strings.Contains(body, `"name":"`+name+`"`) {
		t.Fatalf("GET /api/tags: %d %s; want %s in Ollama's store", code, body, name)
	}
	chat := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hi"}],"max_tokens":4,"temperature":0}`, name)
	code, body := o.call(t, "POST", "/v1/chat/completions", chat)
	if code != http.StatusOK || !strings.Contains(body, `"completion_tokens":`) {
		t.Fatalf("chat by the driver's name: %d %s", code, body)
	}

	ctl := o.controls(t, spec)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := ctl.Sleep(ctx, SleepDiscard); err != nil {
		t.Fatal(err)
	}
	if names := o.ps(t); len(names) != 0 {
		t.Fatalf("Sleep returned while /api/ps lists %v", names)
	}
	if asleep, err := ctl.IsSleeping(ctx); err != nil || !asleep {
		t.Fatalf("IsSleeping after Sleep = %t, %v", asleep, err)
	}
	if r := o.runners(); len(r) != 0 {
		t.Fatalf("asleep, but `ollama serve` still has runner processes %v", r)
	}
	if err := ctl.Wake(ctx); err != nil {
		t.Fatal(err)
	}
	if asleep, err := ctl.IsSleeping(ctx); err != nil || asleep {
		t.Fatalf("IsSleeping after Wake = %t, %v", asleep, err)
	}
	if r := o.runners(); len(r) == 0 {
		t.Fatal("awake, but `ollama serve` runs no runner")
	}

	// The next start of the same deployment finds the file's blob in the
	// store: no second copy.
	o.proc.Process.Signal(syscall.SIGTERM)
	select {
	case <-o.done:
	case <-time.After(10 * time.Second):
		t.Fatal("`ollama serve` did not stop within 10s of SIGTERM")
	}
	o2 := startRealOllama(t, spec)
	steps, err = o2.preload(t)
	if err != nil || hasSteps(steps, "copying") || !hasSteps(steps, "creating", "loading") {
		t.Fatalf("second start's preload: %v, steps %q; want a create and a load without a copy", err, steps)
	}
}

// hasSteps says whether some step begins with each of the prefixes.
func hasSteps(steps []string, prefixes ...string) bool {
	for _, p := range prefixes {
		found := false
		for _, s := range steps {
			found = found || strings.HasPrefix(s, p)
		}
		if !found {
			return false
		}
	}
	return true
}

// TestRealOllamaMissingModelFailsAtOnce: a model that is not in Ollama's
// store fails the preload at once, not at the start deadline, with a
// reason that names the model, the store and the fix.
func TestRealOllamaMissingModelFailsAtOnce(t *testing.T) {
	dir := t.TempDir()
	store := filepath.Join(dir, "models")
	spec := ollamaSpec("tiny:1b", store, dir)
	o := startRealOllama(t, spec)
	start := time.Now()
	_, err := o.preload(t)
	var se *StartError
	if !errors.As(err, &se) {
		t.Fatalf("preload of a missing model: %v; want a StartError", err)
	}
	for _, want := range []string{`"tiny:1b"`, store, "ollama pull tiny:1b", "GGUF", "model 'tiny:1b' not found"} {
		if !strings.Contains(se.Reason, want) {
			t.Errorf("reason %q does not say %q", se.Reason, want)
		}
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("the preload took %s to fail", took)
	}

	missing := filepath.Join(dir, "nosuch.gguf")
	spec = ollamaSpec(missing, store, dir)
	o = startRealOllama(t, spec)
	if _, err := o.preload(t); !errors.As(err, &se) || !strings.Contains(se.Reason, missing) {
		t.Fatalf("preload of a GGUF file that is not there: %v; want a StartError naming it", err)
	}
}

// TestRealOllamaTagNamesAsOllamaMatchesThem: a model already in the store
// is used as is, whatever case and defaults the spec names it with;
// /api/ps lists it as it is stored ("Tiny:1b"), which the controls match
// as Ollama does, so IsSleeping sees it loaded and Sleep waits for the
// runner to go. Ollama's errors keep their shapes: a 404 for an unknown
// model (native and OpenAI), gin's text 404 for /health.
func TestRealOllamaTagNamesAsOllamaMatchesThem(t *testing.T) {
	files := tinygguf.Write(t)
	dir := t.TempDir()
	store := filepath.Join(dir, "models")
	first := startRealOllama(t, ollamaSpec("Tiny:1b", store, dir))
	realengine.CreateOllamaModel(t, first.base, "Tiny:1b", files.Model)
	if code, body := first.call(t, "GET", "/health", ""); code != http.StatusNotFound || body != "404 page not found" {
		t.Errorf("GET /health: %d %q, want gin's text 404", code, body)
	}
	code, body := first.call(t, "POST", "/v1/chat/completions", `{"model":"nosuch","messages":[{"role":"user","content":"hi"}]}`)
	if code != http.StatusNotFound || !strings.Contains(body, `"message":"model 'nosuch' not found","type":"not_found_error"`) {
		t.Errorf("chat with an unknown model: %d %s, want Ollama's OpenAI 404", code, body)
	}
	if code, body := first.call(t, "POST", "/api/generate", `{"model":"nosuch"}`); code != http.StatusNotFound || body != `{"error":"model 'nosuch' not found"}` {
		t.Errorf("generate with an unknown model: %d %s, want Ollama's native 404", code, body)
	}
	first.proc.Process.Signal(syscall.SIGTERM)
	<-first.done

	for _, model := range []string{"tiny:1b", "library/TINY:1b", "registry.ollama.ai/library/tiny:1B"} {
		spec := ollamaSpec(model, store, dir)
		o := startRealOllama(t, spec)
		steps, err := o.preload(t)
		if err != nil || hasSteps(steps, "creating") {
			t.Fatalf("%s: preload %v, steps %q; want the stored model loaded as is", model, err, steps)
		}
		if names := o.ps(t); len(names) != 1 || names[0] != "Tiny:1b" {
			t.Fatalf("%s: /api/ps lists %v; want the stored name Tiny:1b", model, names)
		}
		ctl := o.controls(t, spec)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		if asleep, err := ctl.IsSleeping(ctx); err != nil || asleep {
			t.Fatalf("%s: loaded (/api/ps lists Tiny:1b), but IsSleeping = %t, %v", model, asleep, err)
		}
		if err := ctl.Sleep(ctx, SleepDiscard); err != nil {
			t.Fatal(err)
		}
		cancel()
		if names := o.ps(t); len(names) != 0 {
			t.Fatalf("%s: Sleep returned while /api/ps lists %v", model, names)
		}
		o.proc.Process.Signal(syscall.SIGTERM)
		<-o.done
	}
}

// TestRealOllamaEmbeddingModel: Ollama refuses to generate with an
// embedding model, so the /api/generate load answers 400; the driver's
// preload loads it through /api/embed, the model then embeds, and the
// controls sleep and wake it.
func TestRealOllamaEmbeddingModel(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "tiny-embed.gguf")
	if err := tinygguf.WriteModel(path, tinygguf.ModelOptions{Pooling: 1, Name: "tiny-embed"}); err != nil {
		t.Fatal(err)
	}
	spec := ollamaSpec(path, filepath.Join(dir, "models"), dir)
	o := startRealOllama(t, spec)
	name := EngineModel(spec)
	if _, err := o.preload(t); err != nil {
		t.Fatalf("preload of an embedding model: %v", err)
	}
	if names := o.ps(t); len(names) != 1 {
		t.Fatalf("after the preload /api/ps lists %v; want the embedding model", names)
	}
	code, body := o.call(t, "POST", "/api/generate", fmt.Sprintf(`{"model":%q,"keep_alive":-1}`, name))
	if code != http.StatusBadRequest || !strings.Contains(body, "does not support generate") {
		t.Fatalf("the /api/generate load of an embedding model: %d %s; want Ollama's 400", code, body)
	}
	code, body = o.call(t, "POST", "/v1/embeddings", fmt.Sprintf(`{"model":%q,"input":["hello","the"]}`, name))
	if code != http.StatusOK || strings.Count(body, `"embedding":[`) != 2 {
		t.Fatalf("embeddings: %d %s", code, body)
	}
	ctl := o.controls(t, spec)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := ctl.Sleep(ctx, SleepDiscard); err != nil {
		t.Fatal(err)
	}
	if err := ctl.Wake(ctx); err != nil {
		t.Fatalf("wake of an embedding model: %v", err)
	}
	if names := o.ps(t); len(names) != 1 {
		t.Fatalf("after the wake /api/ps lists %v", names)
	}
}
