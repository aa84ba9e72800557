package engine

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/gpuplane/gpuplane/internal/engines"
)

// AdapterControls load and unload LoRA adapters in a running engine (docs/engines.md): vLLM's runtime LoRA API (--enable-lora with
// VLLM_ALLOW_RUNTIME_LORA_UPDATING=True, see the vllm driver), which the
// sim engine speaks too. Both calls are synchronous: LoadAdapter returns
// once the engine serves the adapter under name, UnloadAdapter once it no
// longer holds it.
type AdapterControls interface {
	LoadAdapter(ctx context.Context, name, source string) error
	UnloadAdapter(ctx context.Context, name string) error
	// Adapters lists the adapters the engine has registered, from its
	// /v1/models: what it serves, whatever this node asked of it before
	// (an adapter outlives a vLLM sleep, and an agent restart).
	Adapters(ctx context.Context) ([]string, error)
}

// AdaptersFor returns the adapter controls of an engine of kind, or an
// error for a kind that cannot load adapters at run time.
func AdaptersFor(kind string, t Target) (AdapterControls, error) {
	r, err := engines.Lookup(kind) // (a sim's dialect, if any, is its kind: ControlKind)
	if err != nil {
		return nil, err
	}
	switch {
	case r.Adapters != engines.AdaptersAtRunTime:
		return nil, fmt.Errorf("engine %s cannot load LoRA adapters at run time", kind)
	case kind == KindSGLang:
		return newSGLangAdapters(r, t), nil
	}
	return &vllmControls{caller: caller{t}}, nil
}

// LoadAdapter is POST /v1/load_lora_adapter {"lora_name","lora_path"}.
// vLLM keeps an adapter registered through a sleep (and an agent restart
// leaves the engine's list as it was), so a load of one it has answers
// 400 "has already been loaded": the adapter is served, which is what the
// load was for, once /v1/models confirms it.
func (v *vllmControls) LoadAdapter(ctx context.Context, name, source string) error {
	err := v.call(ctx, "POST", "/v1/load_lora_adapter", map[string]string{"lora_name": name, "lora_path": source}, nil)
	if err == nil || !strings.Contains(err.Error(), "has already been loaded") {
		return err
	}
	have, lerr := v.Adapters(ctx)
	if lerr != nil {
		return fmt.Errorf("%w (and listing the engine's adapters: %v)", err, lerr)
	}
	if slices.Contains(have, name) {
		return nil
	}
	return err
}

// UnloadAdapter is POST /v1/unload_lora_adapter {"lora_name"}; an adapter
// the engine does not have (404) is unloaded already.
func (v *vllmControls) UnloadAdapter(ctx context.Context, name string) error {
	err := v.call(ctx, "POST", "/v1/unload_lora_adapter", map[string]string{"lora_name": name}, nil)
	if err != nil && strings.Contains(err.Error(), "404") {
		return nil
	}
	return err
}

// Adapters reads GET /v1/models: vLLM lists each registered adapter with
// its base model as "parent" (serving_models.py).
func (v *vllmControls) Adapters(ctx context.Context) ([]string, error) {
	var out struct {
		Data []struct {
			ID     string  `json:"id"`
			Parent *string `json:"parent"`
		} `json:"data"`
	}
	if err := v.call(ctx, "GET", "/v1/models", nil, &out); err != nil {
		return nil, err
	}
	var names []string
	for _, m := range out.Data {
		if m.Parent != nil && *m.Parent != "" {
			names = append(names, m.ID)
		}
	}
	slices.Sort(names)
	return names, nil
}
