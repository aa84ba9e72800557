package gateway

import (
	"testing"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// A llama.cpp deployment's slot count is its --parallel (or -np), else
// llama-server's auto, 4; a sim speaking llama.cpp
// counts the same; other engines have none.
func TestSlotsOf(t *testing.T) {
	for _, c := range []struct {
		kind string
		args []string
		want int
	}{
		{"llamacpp", nil, 4},
		{"llamacpp", []string{"--parallel", "4"}, 4},
		{"llamacpp", []string{"--parallel=3"}, 3},
		{"llamacpp", []string{"-c", "8192", "-np", "2"}, 2},
		{"llamacpp", []string{"-np", "-1"}, 4},
		{"sim", []string{"--dialect", "llamacpp"}, 4},
		{"sim", []string{"--dialect=llamacpp", "--parallel", "2"}, 2},
		{"sim", []string{"--parallel", "2"}, 0},
		{"vllm", []string{"--parallel", "4"}, 0},
	} {
		if got := slotsOf(&pb.EngineSpec{Kind: c.kind, Args: c.args}); got != c.want {
			t.Errorf("slotsOf(%s %v) = %d, want %d", c.kind, c.args, got, c.want)
		}
	}
}

// The gateway's cap of requests in flight on an engine follows what the
// engine runs at once: a sim speaking llama.cpp has its slots (not
// vLLM's --max-num-seqs, which it does not read), as llama.cpp does; a
// spec's maxInFlight wins over both.
func TestMaxInFlightOf(t *testing.T) {
	for _, c := range []struct {
		kind string
		args []string
		mif  uint32
		want int
	}{
		{"sim", []string{"--dialect", "llamacpp", "--parallel", "2", "--max-num-seqs", "8"}, 0, 2},
		{"sim", []string{"--dialect", "llamacpp"}, 0, 4},
		{"llamacpp", []string{"-np", "3"}, 0, 3},
		{"sim", []string{"--max-num-seqs", "8"}, 0, 8},
		{"vllm", []string{"--max-num-seqs", "16"}, 0, 16},
		{"sim", []string{"--dialect", "llamacpp", "--parallel", "2"}, 5, 5},
	} {
		if got := maxInFlightOf(&pb.EngineSpec{Kind: c.kind, Args: c.args, MaxInFlight: c.mif}); got != c.want {
			t.Errorf("maxInFlightOf(%s %v, maxInFlight %d) = %d, want %d", c.kind, c.args, c.mif, got, c.want)
		}
	}
	// A sim speaking another engine is read as that engine, by its
	// spec.engine.dialect as by a --dialect argument: Ollama runs
	// OLLAMA_NUM_PARALLEL at once (1 unless set), whatever --max-num-seqs
	// the sim's own arguments hold.
	for _, c := range []struct {
		e    *pb.EngineSpec
		want int
	}{
		{&pb.EngineSpec{Kind: "sim", Dialect: "ollama", Args: []string{"--max-num-seqs", "8"}}, 1},
		{&pb.EngineSpec{Kind: "sim", Dialect: "ollama", Env: map[string]string{"OLLAMA_NUM_PARALLEL": "3"}}, 3},
		{&pb.EngineSpec{Kind: "sim", Args: []string{"--dialect", "ollama", "--max-num-seqs", "8"}}, 1},
		{&pb.EngineSpec{Kind: "sim", Dialect: "llamacpp", Args: []string{"--max-num-seqs", "8"}}, 4},
		{&pb.EngineSpec{Kind: "sim", Dialect: "vllm", Args: []string{"--max-num-seqs", "8"}}, 8},
	} {
		if got := maxInFlightOf(c.e); got != c.want {
			t.Errorf("maxInFlightOf(%v) = %d, want %d", c.e, got, c.want)
		}
		if slots := slotsOf(c.e); slots > 0 && slots != maxInFlightOf(c.e) {
			t.Errorf("%v: %d slots but %d in flight", c.e, slots, maxInFlightOf(c.e))
		}
	}
}

// ModelOf serves a deployment under its served name (its own name when
// none), leaves out replicas on no node or card, and says of a warm
// replica whether its node reports it resident, of a pinned one whether it
// runs, and why a pinned one failed.
func TestModelOf(t *testing.T) {
	warm := &pb.ModelDeployment{Name: "chat", Spec: &pb.ModelSpec{Residency: pb.Residency_RESIDENCY_WARM,
		Engine: &pb.EngineSpec{Kind: "sim", Args: []string{"--kv-pool-mib", "64", "--kv-kib-per-token", "128"}}}}
	m := ModelOf(warm, []*pb.Replica{
		{Index: 0, Node: "n1", Cards: []uint32{2}, State: pb.ReplicaState_REPLICA_STATE_RUNNING, Residency: pb.ReplicaResidency_REPLICA_RESIDENCY_RESIDENT},
		{Index: 1, Node: "n2", Cards: []uint32{0}, State: pb.ReplicaState_REPLICA_STATE_RUNNING},
		{Index: 2, Node: "", Cards: nil},
	})
	if m.Served != "chat" || len(m.Replicas) != 2 {
		t.Fatalf("model %+v", m)
	}
	if r := m.Replicas[0]; !r.Fronted || !r.Resident || r.Card != 2 || r.KVTokens != 512 {
		t.Errorf("resident warm replica %+v", r)
	}
	if r := m.Replicas[1]; !r.Fronted || r.Resident {
		t.Errorf("warm replica not reported resident: %+v", r)
	}
	pinned := &pb.ModelDeployment{Name: "embed", Spec: &pb.ModelSpec{ServedModelName: "e5",
		Engine: &pb.EngineSpec{Kind: "vllm", Args: []string{"--runner", "pooling"}}}}
	m = ModelOf(pinned, []*pb.Replica{{Node: "n1", Cards: []uint32{0}, State: pb.ReplicaState_REPLICA_STATE_FAILED, Reason: "exited 1"}})
	if m.Served != "e5" || m.Task != TaskEmbed || len(m.Replicas) != 1 {
		t.Fatalf("model %+v", m)
	}
	if r := m.Replicas[0]; r.Fronted || r.Resident || r.Running || r.Failed != "exited 1" {
		t.Errorf("failed pinned replica %+v", r)
	}
}
