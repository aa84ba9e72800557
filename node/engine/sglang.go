package engine

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/gpuplane/gpuplane/internal/engines"
)

// sglang runs SGLang's server, `python3 -m sglang.launch_server`
// (docs/engines.md; flags from python/sglang/srt/server_args.py). Its
// --mem-fraction-static is a fraction of the whole card that everything on
// the card must stay within once SGLang has its weights and KV pool (it
// sizes the pool from the free memory it measures, so its neighbours'
// memory is inside the fraction): the driver gives it the share plus what
// the card's other replicas reserve.
type sglang struct{}

func (sglang) Kind() string { return KindSGLang }

func (sglang) Command(p Params) (Command, error) {
	e := p.Spec.GetEngine()
	tensor, pipeline := p.parallel()
	args := []string{"-m", "sglang.launch_server",
		"--model-path", p.Spec.GetModel(),
		"--host", p.host(),
		"--port", strconv.Itoa(p.Port),
		"--served-model-name", p.servedName(),
		"--tp-size", u32(tensor),
		"--pp-size", u32(pipeline),
	}
	if !p.wholeCard() {
		f, err := p.sglangFraction()
		if err != nil {
			return Command{}, err
		}
		args = append(args, "--mem-fraction-static", f)
	}
	if n := e.GetMaxModelLen(); n > 0 {
		args = append(args, "--context-length", u32(n))
	}
	args = append(args, sglangControlFlags(p)...)
	args = append(args, e.GetArgs()...)
	r, _ := engines.Lookup(KindSGLang)
	return Command{Path: "python3", Args: args, HealthPath: r.HealthPath}, nil
}

// sglangControlFlags turn on the SGLang APIs the node drives; the sim's
// sglang dialect gets the same, and refuses (or, as SGLang does, frees
// nothing) without them. --enable-metrics serves the gauges the agent
// reads; the memory saver makes /release_memory_occupation free the
// weights and KV cache, and its CPU backup keeps the weights in host RAM
// for the wake (without it a wake finds them gone); --enable-lora with a
// pool of maxAdapters slots of the largest rank, for every module, since
// no adapter is named at start (--lora-target-modules all).
func sglangControlFlags(p Params) []string {
	args := []string{"--enable-metrics"}
	if p.MaySleep {
		r, _ := engines.Lookup(KindSGLang)
		args = append(args, r.SleepFlags...)
	}
	if len(p.Spec.GetAdapters()) > 0 {
		args = append(args, "--enable-lora", "--max-loras-per-batch", u32(maxAdapters(p.Spec.GetEngine())),
			"--max-lora-rank", u32(maxRank(p.Spec)), "--lora-target-modules", "all")
	}
	return args
}

// sglangFraction is --mem-fraction-static for a shared card: the knob
// (the share less SGLang's overshoot, none measured) plus the memory the
// card's other replicas reserve, as a fraction of the card by the one
// rounding rule of every fraction knob (fractionOfCard: no whole MiB more).
func (p Params) sglangFraction() (string, error) {
	knob, err := p.knobMiB()
	if err != nil {
		return "", err
	}
	card := p.smallestCardMiB()
	return fractionOfCard(min(knob+p.NeighbourMiB, card), card), nil
}

// sglangControls drive SGLang's memory occupation routes
// (python/sglang/srt/entrypoints/http_server.py): POST
// /release_memory_occupation frees the weights and KV cache (weights kept
// in host RAM by --enable-weights-cpu-backup), POST
// /resume_memory_occupation brings them back. Both take {"tags": null}
// for everything (managers/io_struct.py) and answer once done.
type sglangControls struct{ caller }

// NewSGLangControls drives SGLang's release and resume of its memory.
func NewSGLangControls(t Target) Controls { return &sglangControls{caller{t}} }

// Caps: one level, the weights in host RAM (the CPU backup); the process
// stays.
func (*sglangControls) Caps() Capabilities {
	return Capabilities{Levels: []int{SleepOffload}, KeepsProcess: true}
}

func (s *sglangControls) Sleep(ctx context.Context, level int) error {
	if err := checkLevel(s.Caps(), level); err != nil {
		return err
	}
	if err := s.call(ctx, http.MethodPost, "/release_memory_occupation", map[string]any{"tags": nil}, nil); err != nil {
		return fmt.Errorf("sglang release memory: %w", err)
	}
	return nil
}

func (s *sglangControls) Wake(ctx context.Context) error {
	if err := s.call(ctx, http.MethodPost, "/resume_memory_occupation", map[string]any{"tags": nil}, nil); err != nil {
		return fmt.Errorf("sglang resume memory: %w", err)
	}
	return nil
}

// IsSleeping: SGLang has no route that says whether its memory is
// released.
func (*sglangControls) IsSleeping(context.Context) (bool, error) {
	return false, errors.New("sglang: no route says whether the engine's memory is released")
}

// sglangAdapters load and unload adapters through SGLang's
// /load_lora_adapter {"lora_name","lora_path"} and /unload_lora_adapter
// {"lora_name"}, which answer {"success", "error_message",
// "loaded_adapters"} (400 when success is false); SGLang lists its
// adapters in /v1/models with their base as "parent", as vLLM does.
type sglangAdapters struct {
	vllmControls
	load, unload string
}

func newSGLangAdapters(r engines.Engine, t Target) *sglangAdapters {
	return &sglangAdapters{vllmControls: vllmControls{caller: caller{t}}, load: r.LoadPath, unload: r.UnloadPath}
}

// LoadAdapter: a load of a name SGLang already has fails (400); the
// adapter is served, which is what the load was for, once /v1/models
// lists it.
func (a *sglangAdapters) LoadAdapter(ctx context.Context, name, source string) error {
	err := a.result(a.call(ctx, http.MethodPost, a.load, map[string]string{"lora_name": name, "lora_path": source}, nil))
	if err == nil {
		return nil
	}
	if have, lerr := a.Adapters(ctx); lerr == nil && slices.Contains(have, name) {
		return nil
	}
	return err
}

// UnloadAdapter: an adapter SGLang does not have is unloaded already.
func (a *sglangAdapters) UnloadAdapter(ctx context.Context, name string) error {
	err := a.result(a.call(ctx, http.MethodPost, a.unload, map[string]string{"lora_name": name}, nil))
	if err == nil {
		return nil
	}
	if have, lerr := a.Adapters(ctx); lerr == nil && !slices.Contains(have, name) {
		return nil
	}
	return err
}

// result names SGLang's error_message of a failed call.
func (a *sglangAdapters) result(err error) error {
	var se *statusError
	if errors.As(err, &se) && strings.Contains(se.Body, "error_message") {
		return fmt.Errorf("sglang %s: %s", se.Path, se.Body)
	}
	return err
}
