package engine

import (
	"context"
	"net/http"
	"strings"
	"testing"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// TestAdapterControlsAgainstASimEngine: the vLLM runtime LoRA calls load
// and unload an adapter in a real sim process: the adapter is served only
// while loaded, its memory is on the simulated card while it is, and
// engines that cannot load adapters have no such controls.
func TestAdapterControlsAgainstASimEngine(t *testing.T) {
	c := newCard(t)
	p := startSim(t, c, "chat", "--memory-mib", "2000", "--load-seconds", "0.1", "--tokens-per-second", "0",
		"--max-loras", "1", "--lora-mib-per-rank", "2", "--lora-load-time", "100ms")
	p.waitHealthy(t)
	c.waitUsed(t, p.pid, 2000, "loaded")
	ctl, err := AdaptersFor(KindSim, Target{BaseURL: p.base})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if code, _ := p.chat(t, "sql"); code != http.StatusNotFound {
		t.Fatalf("request for an adapter not loaded: %d, want 404", code)
	}
	if err := ctl.LoadAdapter(ctx, "sql", "/adapters/sql"); err != nil {
		t.Fatal(err)
	}
	c.waitUsed(t, p.pid, 2000+16*2, "adapter loaded")
	if code, body := p.chat(t, "sql"); code != http.StatusOK {
		t.Fatalf("request for loaded sql: %d %s", code, body)
	}
	if err := ctl.LoadAdapter(ctx, "law", "/adapters/law"); err == nil || !strings.Contains(err.Error(), "--max-loras 1") {
		t.Fatalf("a second adapter with --max-loras 1: %v", err)
	}
	if err := ctl.UnloadAdapter(ctx, "sql"); err != nil {
		t.Fatal(err)
	}
	c.waitUsed(t, p.pid, 2000, "adapter unloaded")
	if code, _ := p.chat(t, "sql"); code != http.StatusNotFound {
		t.Fatalf("request for unloaded sql: %d, want 404", code)
	}
	for _, kind := range []string{KindOllama, KindLlamaCpp, KindCommand} {
		if _, err := AdaptersFor(kind, Target{}); err == nil {
			t.Errorf("%s has adapter controls", kind)
		}
	}
}

// TestVLLMCommandEnablesRuntimeLoRA: a vLLM deployment with adapters
// starts with the runtime LoRA API on, --max-loras from maxAdapters and a
// --max-lora-rank that holds its largest adapter.
func TestVLLMCommandEnablesRuntimeLoRA(t *testing.T) {
	spec := &pb.ModelSpec{Model: "/m", Engine: &pb.EngineSpec{Kind: KindVLLM, MaxAdapters: 6},
		Adapters: []*pb.Adapter{{Name: "a", Source: "/a", Rank: 8}, {Name: "b", Source: "/b", Rank: 40}}}
	cmd, err := For(KindVLLM)
	if err != nil {
		t.Fatal(err)
	}
	got, err := cmd.Command(Params{Spec: spec, Replica: &pb.Replica{Model: "m"}, Port: 8000})
	if err != nil {
		t.Fatal(err)
	}
	args := strings.Join(got.Args, " ")
	if !strings.Contains(args, "--enable-lora --max-loras 6 --max-lora-rank 64") {
		t.Errorf("args %q lack the runtime LoRA flags", args)
	}
	if !strings.Contains(strings.Join(got.Env, " "), "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True") {
		t.Errorf("env %q lacks VLLM_ALLOW_RUNTIME_LORA_UPDATING", got.Env)
	}
}
