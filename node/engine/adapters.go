package engine

import (
	"context"
	"fmt"
)

// AdapterControls load and unload LoRA adapters in a running engine (docs/engines.md): vLLM's runtime LoRA API (--enable-lora with
// VLLM_ALLOW_RUNTIME_LORA_UPDATING=True, see the vllm driver), which the
// sim engine speaks too. Both calls are synchronous: LoadAdapter returns
// once the engine serves the adapter under name, UnloadAdapter once it no
// longer holds it.
type AdapterControls interface {
	LoadAdapter(ctx context.Context, name, source string) error
	UnloadAdapter(ctx context.Context, name string) error
}

// AdaptersFor returns the adapter controls of an engine of kind, or an
// error for a kind that cannot load adapters at run time.
func AdaptersFor(kind string, t Target) (AdapterControls, error) {
	switch kind {
	case KindVLLM, KindSim:
		return &vllmControls{caller: caller{t}}, nil
	}
	return nil, fmt.Errorf("engine %s cannot load LoRA adapters at run time", kind)
}

// LoadAdapter is POST /v1/load_lora_adapter {"lora_name","lora_path"}.
func (v *vllmControls) LoadAdapter(ctx context.Context, name, source string) error {
	return v.call(ctx, "POST", "/v1/load_lora_adapter", map[string]string{"lora_name": name, "lora_path": source}, nil)
}

// UnloadAdapter is POST /v1/unload_lora_adapter {"lora_name"}.
func (v *vllmControls) UnloadAdapter(ctx context.Context, name string) error {
	return v.call(ctx, "POST", "/v1/unload_lora_adapter", map[string]string{"lora_name": name}, nil)
}
