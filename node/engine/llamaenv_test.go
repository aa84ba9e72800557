package engine

import (
	"testing"

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
