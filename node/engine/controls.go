package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gpuplane/gpuplane/internal/engines"
	"github.com/gpuplane/gpuplane/internal/ollamaname"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// Sleep levels, as vLLM numbers them.
const (
	// SleepOffload keeps the weights in host RAM: a wake copies them back.
	SleepOffload = 1
	// SleepDiscard drops the weights: a wake reloads them.
	SleepDiscard = 2
)

// Controls drives the residency of one running engine (docs/engines.md): the
// residency controller sleeps and wakes replicas through it, whatever the
// engine kind. Every call is synchronous: Sleep returns once the memory is
// released, Wake once the engine serves again.
type Controls interface {
	// Caps says what the engine can do.
	Caps() Capabilities
	// Sleep releases the engine's card memory at level, one of Caps().Levels.
	// Requests in flight are cut off (vLLM's default mode=abort): the
	// controller drains first (docs/residency.md I3).
	Sleep(ctx context.Context, level int) error
	// Wake brings a sleeping engine back; waking an awake engine does
	// nothing.
	Wake(ctx context.Context) error
	// IsSleeping asks the engine whether it is asleep (or unloaded).
	IsSleeping(ctx context.Context) (bool, error)
}

// Capabilities are what an engine's controls can do.
type Capabilities struct {
	// Levels are the sleep levels Sleep accepts, lightest first.
	Levels []int
	// KeepsProcess says the engine's process and runtime survive a sleep,
	// so a wake skips process start and runtime initialisation.
	KeepsProcess bool
}

// Process starts and stops a replica's engine process: the executor's side
// of the start/stop fallback for engines without controls.
type Process interface {
	Start(ctx context.Context) error
	Stop(ctx context.Context) error
	Running() bool
}

// Target is the running engine that controls drive.
type Target struct {
	// BaseURL is the engine's address, e.g. "http://127.0.0.1:8100".
	BaseURL string
	// Model is the name the engine's model controls take (ControlModel).
	Model string
	// Client makes the calls; nil uses a client without a timeout, so the
	// calls' contexts bound them.
	Client *http.Client
	// Process is needed only by the start/stop fallback.
	Process Process
	// APIKey is the engine's key (Keys.For), sent as a bearer token with
	// every call; "" for none.
	APIKey string
	// SleepLevel is the level the engine sleeps at when the caller knows
	// it (the node's choice, SleepLevel), 0 when not: a vLLM wake from
	// level 1 must not read the weights from disk again.
	SleepLevel int
}

// ControlModel is the name an engine's controls know the replica's model
// by: Ollama's model name, else the served name.
func (p Params) ControlModel() string {
	if m := EngineModel(p.Spec); m != "" {
		return m
	}
	return p.servedName()
}

// ControlsFor returns the controls of an engine of kind: vLLM's sleep mode
// (also for the sim engine, which speaks it), llama.cpp's router
// load/unload, Ollama's keep_alive, and start/stop for command engines.
func ControlsFor(kind string, t Target) (Controls, error) {
	switch kind {
	case KindVLLM, KindSim:
		return NewVLLMControls(t), nil
	case KindLlamaCpp:
		return NewLlamaCppControls(t), nil
	case KindOllama:
		return NewOllamaControls(t), nil
	case KindSGLang:
		return NewSGLangControls(t), nil
	case KindCommand:
		return NewStartStopControls(t.Process)
	}
	_, err := engines.Lookup(kind)
	if err == nil {
		err = fmt.Errorf("engine kind %q has no controls on this node", kind)
	}
	return nil, err
}

// SleepLevel is the level the node's residency controller puts a replica
// of spec to sleep at, 0 for an engine it stops and starts instead: vLLM's
// (and the sim's, unless its dialect is another engine's)
// spec.engine.sleepLevel, 1 by default; Ollama's keep_alive unload, which
// discards the weights but keeps `ollama serve` (SleepDiscard); none for
// llama.cpp, whose router controls need llama-server without -m, which
// the driver never runs, nor for command engines.
func SleepLevel(spec *pb.ModelSpec) int {
	e := spec.GetEngine()
	r, _ := engines.Speaks(e)
	switch r.Sleep {
	case engines.SleepVLLM:
		if e.GetSleepLevel() == SleepDiscard {
			return SleepDiscard
		}
		return SleepOffload
	case engines.SleepKeepAlive:
		return SleepDiscard
	case engines.SleepMemoryOccupation:
		return SleepOffload
	}
	return 0
}

// checkLevel refuses a level the engine does not have, naming the ones it has.
func checkLevel(c Capabilities, level int) error {
	if !slices.Contains(c.Levels, level) {
		return fmt.Errorf("sleep level %d: this engine supports %v", level, c.Levels)
	}
	return nil
}

// caller makes the HTTP calls of one engine's controls.
type caller struct{ t Target }

func (c caller) client() *http.Client {
	if c.t.Client != nil {
		return c.t.Client
	}
	return http.DefaultClient
}

// call sends method path (with a JSON body unless nil) and decodes a JSON
// answer into out unless nil; anything but 2xx is an error with the body.
func (c caller) call(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		data, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.url(path), rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	Authorize(req.Header, c.t.APIKey)
	resp, err := c.client().Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		return &statusError{Method: method, Path: path, Code: resp.StatusCode, Status: resp.Status, Body: strings.TrimSpace(string(data))}
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("%s %s: unexpected answer %q: %w", method, path, data, err)
		}
	}
	return nil
}

// url is path on the engine.
func (c caller) url(path string) string { return strings.TrimSuffix(c.t.BaseURL, "/") + path }

// statusError is an engine's answer other than 2xx.
type statusError struct {
	Method, Path string
	Code         int
	Status, Body string
}

func (e *statusError) Error() string {
	return fmt.Sprintf("%s %s: %s: %s", e.Method, e.Path, e.Status, e.Body)
}

// vllmControls drive vLLM's sleep mode (VLLM_SERVER_DEV_MODE=1 and
// --enable-sleep-mode, see the vllm driver).
type vllmControls struct {
	caller
	mu sync.Mutex
	// level is the level this driver put the engine to sleep at; 0 when
	// unknown (say, after an agent restart).
	level int
}

// NewVLLMControls drives vLLM's /sleep, /wake_up and /is_sleeping.
func NewVLLMControls(t Target) Controls { return &vllmControls{caller: caller{t}} }

func (*vllmControls) Caps() Capabilities {
	return Capabilities{Levels: []int{SleepOffload, SleepDiscard}, KeepsProcess: true}
}

func (v *vllmControls) Sleep(ctx context.Context, level int) error {
	if err := checkLevel(v.Caps(), level); err != nil {
		return err
	}
	if err := v.call(ctx, http.MethodPost, "/sleep?level="+strconv.Itoa(level), nil, nil); err != nil {
		return fmt.Errorf("vllm sleep: %w", err)
	}
	v.mu.Lock()
	v.level = level
	v.mu.Unlock()
	return nil
}

// Wake wakes from level 1 with one /wake_up. From level 2 the weights must
// be reloaded before the KV cache comes back (docs/features/sleep_mode.md):
// wake the weights, reload_weights, reset the prefix cache, then wake the
// KV cache. A sleep at a level neither this driver nor its target knows
// is woken the level-2 way, which is right for both levels (at the price
// of a read from disk after level 1).
func (v *vllmControls) Wake(ctx context.Context) error {
	sleeping, err := v.IsSleeping(ctx)
	if err != nil || !sleeping {
		return err
	}
	v.mu.Lock()
	level := v.level
	v.mu.Unlock()
	if level == 0 {
		level = v.t.SleepLevel
	}
	steps := []struct {
		path string
		body any
	}{{"/wake_up", nil}}
	if level != SleepOffload {
		steps = []struct {
			path string
			body any
		}{
			{"/wake_up?tags=weights", nil},
			{"/collective_rpc", map[string]string{"method": "reload_weights"}},
			{"/reset_prefix_cache", nil},
			{"/wake_up?tags=kv_cache", nil},
		}
	}
	for _, s := range steps {
		if err := v.call(ctx, http.MethodPost, s.path, s.body, nil); err != nil {
			return fmt.Errorf("vllm wake: %w", err)
		}
	}
	v.mu.Lock()
	v.level = 0
	v.mu.Unlock()
	return nil
}

func (v *vllmControls) IsSleeping(ctx context.Context) (bool, error) {
	var out struct {
		IsSleeping *bool `json:"is_sleeping"`
	}
	if err := v.call(ctx, http.MethodGet, "/is_sleeping", nil, &out); err != nil {
		return false, fmt.Errorf("vllm is_sleeping: %w", err)
	}
	if out.IsSleeping == nil {
		return false, errors.New("vllm is_sleeping: the answer has no is_sleeping")
	}
	return *out.IsSleeping, nil
}

// pollInterval is how often a wake that returns before the engine serves
// (llama.cpp's router load) asks again.
const pollInterval = 50 * time.Millisecond

// llamaCppControls drive llama-server's router mode: unloading a model
// stops its process, loading starts it again (tools/server/README.md).
type llamaCppControls struct{ caller }

// NewLlamaCppControls drives llama.cpp's POST /models/load, /models/unload
// and GET /models.
func NewLlamaCppControls(t Target) Controls { return &llamaCppControls{caller{t}} }

func (*llamaCppControls) Caps() Capabilities { return Capabilities{Levels: []int{SleepDiscard}} }

func (l *llamaCppControls) Sleep(ctx context.Context, level int) error {
	if err := checkLevel(l.Caps(), level); err != nil {
		return err
	}
	if err := l.call(ctx, http.MethodPost, "/models/unload", map[string]string{"model": l.t.Model}, nil); err != nil {
		return fmt.Errorf("llama.cpp unload: %w", err)
	}
	return nil
}

// Wake asks the router to load the model, which it does in the background,
// and waits until GET /models says it is loaded.
func (l *llamaCppControls) Wake(ctx context.Context) error {
	status, err := l.status(ctx)
	if err != nil {
		return err
	}
	if status == "loaded" {
		return nil
	}
	if status != "loading" {
		if err := l.call(ctx, http.MethodPost, "/models/load", map[string]string{"model": l.t.Model}, nil); err != nil {
			return fmt.Errorf("llama.cpp load: %w", err)
		}
	}
	t := time.NewTicker(pollInterval)
	defer t.Stop()
	for {
		status, err := l.status(ctx)
		switch {
		case err != nil:
			return err
		case status == "loaded":
			return nil
		case status == "unloaded":
			return fmt.Errorf("llama.cpp load of %s failed: the router lists it unloaded", l.t.Model)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("llama.cpp load of %s: %w (last status %s)", l.t.Model, ctx.Err(), status)
		case <-t.C:
		}
	}
}

func (l *llamaCppControls) IsSleeping(ctx context.Context) (bool, error) {
	status, err := l.status(ctx)
	return status != "loaded", err
}

// status is the model's status value in the router's GET /models.
func (l *llamaCppControls) status(ctx context.Context) (string, error) {
	var out struct {
		Data []struct {
			ID     string `json:"id"`
			Status struct {
				Value string `json:"value"`
			} `json:"status"`
		} `json:"data"`
	}
	if err := l.call(ctx, http.MethodGet, "/models", nil, &out); err != nil {
		return "", fmt.Errorf("llama.cpp models: %w", err)
	}
	for _, m := range out.Data {
		if m.ID == l.t.Model {
			return m.Status.Value, nil
		}
	}
	return "", fmt.Errorf("llama.cpp models: the router does not list %q", l.t.Model)
}

// ollamaControls load and unload through keep_alive (docs/api.md): a
// load without a prompt loads (ollamaLoad), keep_alive 0 unloads.
type ollamaControls struct{ caller }

// NewOllamaControls drives Ollama's keep_alive and GET /api/ps.
func NewOllamaControls(t Target) Controls { return &ollamaControls{caller{t}} }

// Caps: an unload stops Ollama's runner, freeing the card, while `ollama
// serve` keeps running: a load skips the server's start.
func (*ollamaControls) Caps() Capabilities {
	return Capabilities{Levels: []int{SleepDiscard}, KeepsProcess: true}
}

func (o *ollamaControls) Sleep(ctx context.Context, level int) error {
	if err := checkLevel(o.Caps(), level); err != nil {
		return err
	}
	// Ollama unloads before it looks at what the model can do: this works
	// for embedding models too.
	var out struct {
		Done       bool   `json:"done"`
		DoneReason string `json:"done_reason"`
	}
	if err := o.call(ctx, http.MethodPost, "/api/generate", map[string]any{"model": o.t.Model, "keep_alive": 0}, &out); err != nil {
		return fmt.Errorf("ollama unload: %w", err)
	}
	if !out.Done || out.DoneReason != "unload" {
		return fmt.Errorf("ollama unload: answered done=%t done_reason=%q, want \"unload\"", out.Done, out.DoneReason)
	}
	// Ollama answers once it has expired the runner (server/sched.go
	// expireRunner); its scheduler unloads it afterwards and lists the
	// model in /api/ps until then: the memory is free once it is gone.
	t := time.NewTicker(pollInterval)
	defer t.Stop()
	for {
		asleep, err := o.IsSleeping(ctx)
		if err != nil || asleep {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("ollama unload of %s: %w (still listed in /api/ps)", o.t.Model, ctx.Err())
		case <-t.C:
		}
	}
}

// Wake loads the model and keeps it loaded (keep_alive -1): unloading is
// the controller's decision, not a timer's.
func (o *ollamaControls) Wake(ctx context.Context) error {
	if err := o.ollamaLoad(ctx, o.t.Model); err != nil {
		return fmt.Errorf("ollama load: %w", err)
	}
	return nil
}

// IsSleeping says whether /api/ps lists the model. It lists the name the
// model is stored under, in its stored case and without Ollama's defaults
// ("Tiny:1b" for "library/tiny:1b"), so names are compared as Ollama
// compares them.
func (o *ollamaControls) IsSleeping(ctx context.Context) (bool, error) {
	var out struct {
		Models []struct {
			Name  string `json:"name"`
			Model string `json:"model"`
		} `json:"models"`
	}
	if err := o.call(ctx, http.MethodGet, "/api/ps", nil, &out); err != nil {
		return false, fmt.Errorf("ollama ps: %w", err)
	}
	for _, m := range out.Models {
		if ollamaname.Same(m.Name, o.t.Model) || ollamaname.Same(m.Model, o.t.Model) {
			return false, nil
		}
	}
	return true, nil
}

// startStop is the fallback for engines without controls: sleeping stops
// the process, waking starts it again (a cold load).
type startStop struct{ p Process }

// NewStartStopControls sleeps and wakes an engine by stopping and starting
// its process.
func NewStartStopControls(p Process) (Controls, error) {
	if p == nil {
		return nil, errors.New("start/stop controls need the engine's process")
	}
	return startStop{p}, nil
}

func (startStop) Caps() Capabilities { return Capabilities{Levels: []int{SleepDiscard}} }

func (s startStop) Sleep(ctx context.Context, level int) error {
	if err := checkLevel(s.Caps(), level); err != nil {
		return err
	}
	return s.p.Stop(ctx)
}

func (s startStop) Wake(ctx context.Context) error {
	if s.p.Running() {
		return nil
	}
	return s.p.Start(ctx)
}

func (s startStop) IsSleeping(context.Context) (bool, error) { return !s.p.Running(), nil }
