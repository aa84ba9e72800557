package engine

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/gpuplane/gpuplane/internal/tinygguf"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// A llama.cpp engine's slots and per-request context read what
// llama-server reads: flags first, then its LLAMA_ARG_* environment, then
// its defaults (auto 4 slots over a unified cache). Each row was checked
// against the real llama-server's /props (total_slots,
// default_generation_settings.n_ctx): TestRealLlamaCppDriver runs the
// slot rows.
func TestLlamaSlotsAndContext(t *testing.T) {
	for _, c := range []struct {
		args       []string
		env        map[string]string
		maxLen     uint32
		slots, ctx int
	}{
		{nil, nil, 0, 4, 0},
		{nil, nil, 1000, 4, 1000},
		{[]string{"--parallel", "2"}, nil, 1000, 2, 1000},
		{nil, map[string]string{"LLAMA_ARG_N_PARALLEL": "3"}, 1000, 3, 1000},
		{[]string{"--parallel", "2"}, map[string]string{"LLAMA_ARG_N_PARALLEL": "3"}, 0, 2, 0},
		{nil, map[string]string{"LLAMA_ARG_CTX_SIZE": "2048"}, 0, 4, 2048},
		{nil, map[string]string{"LLAMA_ARG_CTX_SIZE": "2048", "LLAMA_ARG_N_PARALLEL": "2"}, 0, 2, 1024},
		{[]string{"-c", "1000", "--parallel", "2"}, map[string]string{"LLAMA_ARG_CTX_SIZE": "4096"}, 0, 2, 500},
		{[]string{"--ctx-size=4096", "-np", "4", "--kv-unified"}, nil, 0, 4, 4096},
		{[]string{"-c", "4096", "-np", "4"}, map[string]string{"LLAMA_ARG_KV_UNIFIED": "true"}, 0, 4, 4096},
	} {
		e := &pb.EngineSpec{Kind: KindLlamaCpp, Args: c.args, Env: c.env, MaxModelLen: c.maxLen}
		if got := LlamaSlots(e); got != c.slots {
			t.Errorf("args %v env %v: LlamaSlots %d, want %d", c.args, c.env, got, c.slots)
		}
		if got := LlamaContext(e); got != c.ctx {
			t.Errorf("args %v env %v maxModelLen %d: LlamaContext %d, want %d", c.args, c.env, c.maxLen, got, c.ctx)
		}
	}
}

// Without maxModelLen, a llama.cpp replica on a shared card gets a -c its
// share holds: the share less the weights (the file) and a tenth, over
// the KV bytes per token its GGUF metadata gives, at most the trained
// context per slot; a file the agent cannot read gets 4096 per slot; a
// -c of the deployment's own, or a whole card, is left alone.
func TestLlamaContextFromTheShare(t *testing.T) {
	dir := t.TempDir()
	model := filepath.Join(dir, "long.gguf")
	// 2 layers, 4 KV heads of 16: 2 × 2 × 4 × (16 + 16) = 512 bytes a token.
	if err := tinygguf.WriteModel(model, tinygguf.ModelOptions{Context: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	g, err := readGGUFShape(model)
	if err != nil {
		t.Fatal(err)
	}
	if g.KVBytesPerToken() != 512 || g.ContextLength != 1<<20 || g.Arch != "llama" {
		t.Fatalf("shape %+v: want 512 KV bytes a token, context 1Mi, llama", g)
	}
	fi, _ := os.Stat(model)
	share := uint64(8) // MiB
	want := (share<<20 - uint64(fi.Size()) - (share<<20)/10) / 512 / 256 * 256
	for _, c := range []struct {
		name  string
		model string
		share uint64
		card  uint64 // MiB
		args  []string
		env   map[string]string
		want  string // -c, "" none
	}{
		{"share-sized", model, share, 4 << 20, nil, nil, u64(want)},
		{"explicit slots share it", model, share, 4 << 20, []string{"--parallel", "2"}, nil, u64(want)},
		{"trained context per slot", model, 1 << 20, 4 << 20, []string{"--parallel", "2"}, nil, u64(2 << 20)},
		{"unreadable file", filepath.Join(dir, "nosuch.gguf"), share, 4 << 20, []string{"-np", "3"}, nil, "12288"},
		{"the deployment's -c", model, share, 4 << 20, []string{"-c", "999"}, nil, ""},
		{"the deployment's LLAMA_ARG_CTX_SIZE", model, share, 4 << 20, nil, map[string]string{"LLAMA_ARG_CTX_SIZE": "999"}, ""},
		{"a whole card", model, share, share, nil, nil, ""},
	} {
		p := Params{Model: "m", Spec: &pb.ModelSpec{Model: c.model, Engine: &pb.EngineSpec{Kind: KindLlamaCpp, Args: c.args, Env: c.env}},
			Replica: &pb.Replica{Cards: []uint32{0}, MemoryMib: c.share}, Cards: []*pb.Card{{Index: 0, MemoryMib: c.card}}}
		got := ""
		if a := llamaBoundedContext(p); len(a) == 2 {
			got = a[1]
		}
		if got != c.want {
			t.Errorf("%s: -c %q, want %q", c.name, got, c.want)
		}
	}
}
