package executor

import (
	"context"
	"sync"
	"syscall"
	"testing"
	"time"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// gate is the test's Gate: it holds the replicas of the models in held and
// records what the executor tells it.
type gate struct {
	held map[string]bool

	mu     sync.Mutex
	placed [][]Desired
	urls   map[string]string
}

const frontURL = "http://127.0.0.1:1"

func (g *gate) Hold(d Desired) (string, bool) {
	if g.held[d.Replica.GetModel()] {
		return frontURL, true
	}
	return "", false
}

func (g *gate) Placed(ds []Desired) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.placed = append(g.placed, ds)
}

func (g *gate) Engine(model string, _ uint32, state pb.ReplicaState, url string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if state == pb.ReplicaState_REPLICA_STATE_RUNNING {
		g.urls[model] = url
	}
}

func (g *gate) url(model string) string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.urls[model]
}

// TestGateHoldsReplicas: a held replica is placed without an engine and
// reported Cold at the Gate's endpoint; StartEngine runs its engine (which
// serves at the address the Gate is told), StopEngine stops it and leaves
// the replica placed and Cold with the reason given; a held engine that
// crashes is reported Failed and left for the Gate to start again. A
// replica the Gate does not hold runs as ever.
func TestGateHoldsReplicas(t *testing.T) {
	g := &gate{held: map[string]bool{"held": true}, urls: map[string]string{}}
	h := newHarness(t, t.TempDir(), func(o *Options) {
		o.Gate = g
		o.RestartDelay, o.MaxRestartDelay = time.Millisecond, time.Millisecond
	})
	ctx := context.Background()
	h.want(10, sim("free", 1), sim("held", 1))
	h.waitState("free", pb.ReplicaState_REPLICA_STATE_RUNNING, 30*time.Second)
	cold := h.waitState("held", pb.ReplicaState_REPLICA_STATE_PLACED, 30*time.Second)
	if cold.Residency != pb.ReplicaResidency_REPLICA_RESIDENCY_COLD || cold.Endpoint != frontURL {
		t.Fatalf("held replica reported %v, want Placed, Cold at %s", cold, frontURL)
	}
	if pids := engines(t, "held"); len(pids) != 0 {
		t.Fatalf("held replica has engines %v before StartEngine", pids)
	}
	g.mu.Lock()
	placed := len(g.placed) > 0 && len(g.placed[0]) == 2
	g.mu.Unlock()
	if !placed {
		t.Fatalf("Gate told of placements %v, want both replicas", g.placed)
	}

	if err := h.exec.StartEngine("held", 0, "load held: 1 request waiting"); err != nil {
		t.Fatal(err)
	}
	run := h.waitState("held", pb.ReplicaState_REPLICA_STATE_RUNNING, 30*time.Second)
	if run.Residency != pb.ReplicaResidency_REPLICA_RESIDENCY_RESIDENT || run.ResidencyReason != "engine running: loaded on demand" || run.Endpoint != frontURL {
		t.Fatalf("running report %v: want Resident, loaded on demand, at %s", run, frontURL)
	}
	if got := chat(t, g.url("held"), "held", false); got == "" {
		t.Fatal("the engine the Gate was told of does not answer")
	}

	const why = "evict held: value 0.1 < other 3.2"
	if err := h.exec.StopEngine(ctx, "held", 0, why); err != nil {
		t.Fatal(err)
	}
	if pids := engines(t, "held"); len(pids) != 0 {
		t.Fatalf("held replica has engines %v after StopEngine returned", pids)
	}
	if st := h.rep.last("held"); st.State != pb.ReplicaState_REPLICA_STATE_PLACED || st.Residency != pb.ReplicaResidency_REPLICA_RESIDENCY_COLD || st.ResidencyReason != why {
		t.Fatalf("after StopEngine: %v, want Placed, Cold: %s", st, why)
	}

	if err := h.exec.StartEngine("held", 0, "load held again"); err != nil {
		t.Fatal(err)
	}
	h.waitState("held", pb.ReplicaState_REPLICA_STATE_RUNNING, 30*time.Second)
	if err := syscall.Kill(onePID(t, "held"), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	h.waitState("held", pb.ReplicaState_REPLICA_STATE_FAILED, 30*time.Second)
	// Unheld engines restart after 1ms here; a held one waits for the
	// Gate, however long.
	time.Sleep(500 * time.Millisecond)
	if st := h.rep.last("held"); st.State != pb.ReplicaState_REPLICA_STATE_FAILED || len(engines(t, "held")) != 0 {
		t.Fatalf("held engine restarted by the executor: %v", st)
	}
	if err := h.exec.StartEngine("held", 0, "load held after the crash"); err != nil {
		t.Fatal(err)
	}
	h.waitState("held", pb.ReplicaState_REPLICA_STATE_RUNNING, 30*time.Second)
}
