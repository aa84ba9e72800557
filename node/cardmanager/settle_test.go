package cardmanager

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/node/executor"
	"github.com/gpuplane/gpuplane/node/residency"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// vLLM charges every change of its card's free memory during its start to
// itself (docs/engines.md): a neighbour waking meanwhile takes the memory
// its KV cache was to have, and the strict vllm dialect fails its start
// with "No available memory for the cache blocks", as vLLM does. A wake
// asked for during a vLLM start waits until the start is done, says so in
// the plan and the decision log, and both succeed.
func TestNeighbourWakeWaitsForVLLMStart(t *testing.T) {
	n := newAdapterNodeWith(t, func(c *residency.Config) { c.IdleSleep = 300 * time.Millisecond })
	chat := n.deployment(pb.Residency_RESIDENCY_WARM, 0, nil)
	n.publish(chat)
	url := n.front()
	if code, _, msg := ask(t, url, "chat", ""); code != http.StatusOK {
		t.Fatalf("first request: %d %s", code, msg)
	}
	deadline := time.Now().Add(30 * time.Second)
	for st := controllerState(n); st != residency.Sleeping; st = controllerState(n) {
		if time.Now().After(deadline) {
			t.Fatalf("the controller holds chat %s, want Sleeping", st)
		}
		time.Sleep(20 * time.Millisecond)
	}

	// A pinned vLLM replica at 40 % whose start profiles for 3 s, with a
	// KV pool of 1000 MiB: chat's wake takes 9213 MiB.
	vl := executor.Desired{
		Replica: &pb.Replica{Model: "vl", Generation: 1, Node: node, Accelerator: "shared",
			Cards: []uint32{0}, MemoryMib: chat.Replica.GetMemoryMib(), PlacedIndex: 2, State: pb.ReplicaState_REPLICA_STATE_PLACED},
		Spec: &pb.ModelSpec{Model: "sim://vl", ServedModelName: "vl", Replicas: 1,
			Engine: &pb.EngineSpec{Kind: "sim", MemoryPercent: 40,
				Args: []string{"--dialect", "vllm", "--init-seconds", "3", "--load-seconds", "0.2", "--kv-pool-mib", "1000", "--tokens-per-second", "0"}}},
	}
	n.publish(chat, vl)
	vlState := func() pb.ReplicaState {
		done := make(chan pb.ReplicaState, 1)
		n.mgr.post(func() { done <- n.mgr.engines[rkey{"vl", 0}].state })
		return <-done
	}
	deadline = time.Now().Add(30 * time.Second)
	for vlState() != pb.ReplicaState_REPLICA_STATE_STARTING {
		if time.Now().After(deadline) {
			t.Fatalf("vl is %s, want Starting", vlState())
		}
		time.Sleep(10 * time.Millisecond)
	}
	answered := make(chan int, 1)
	go func() {
		// A long answer keeps chat awake past vl's start.
		body := `{"model":"chat","messages":[{"role":"user","content":"hi"}],"max_tokens":2000}`
		resp, err := (&http.Client{Timeout: 2 * time.Minute}).Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			answered <- 0
			return
		}
		resp.Body.Close()
		answered <- resp.StatusCode
	}()
	var waitedInPlan bool
	deadline = time.Now().Add(60 * time.Second)
	for st := vlState(); st != pb.ReplicaState_REPLICA_STATE_RUNNING; st = vlState() {
		if st == pb.ReplicaState_REPLICA_STATE_FAILED || time.Now().After(deadline) {
			t.Fatalf("vl is %s, want Running: chat's wake changed the card's memory while vLLM profiled it", st)
		}
		for _, c := range n.journal.Cards() {
			for _, p := range c.Plan {
				if p.Model == (rkey{"chat", 0}).id() && strings.HasPrefix(p.Reason, "waits: wake of chat/0") {
					waitedInPlan = true
				}
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	if code := <-answered; code != http.StatusOK {
		t.Fatalf("chat's request during vl's start: %d, want 200 once vl started", code)
	}
	if !waitedInPlan {
		t.Error("the plan never said that chat's wake waits for vl's start")
	}
	ds, _ := n.journal.Decisions(0)
	var logged bool
	for _, d := range ds {
		if d.Model == (rkey{"chat", 0}).id() && strings.Contains(d.Reason, "while vl/0 profiles it at start") {
			logged = true
		}
	}
	if !logged {
		t.Error("the decision log has no wait of chat's wake for vl's start")
	}
	// Nothing failed meanwhile, and chat is awake.
	if st := vlState(); st != pb.ReplicaState_REPLICA_STATE_RUNNING {
		t.Errorf("vl is %s after chat's wake, want Running", st)
	}
}

// vLLM's sleep asserts that its card's free memory did not fall while it
// offloaded ("Memory usage increased after sleeping."); the strict vllm
// dialect answers such a sleep 500, and the manager stops an engine whose
// sleep failed. A pinned neighbour placed while a vLLM engine goes to
// sleep starts only once the sleep is done: the engine sleeps (the same
// process, Sleeping) and the neighbour runs.
func TestStartWaitsForAVLLMSleep(t *testing.T) {
	n := newAdapterNodeWith(t, func(c *residency.Config) { c.IdleSleep = 300 * time.Millisecond })
	chat := n.deployment(pb.Residency_RESIDENCY_WARM, 0, nil)
	// A level-1 sleep copies the weights to host RAM for 3 s.
	chat.Spec.Engine.Args = append(chat.Spec.Engine.Args, "--dialect", "vllm", "--wake-seconds", "3")
	n.publish(chat)
	url := n.front()
	if code, _, msg := ask(t, url, "chat", ""); code != http.StatusOK {
		t.Fatalf("first request: %d %s", code, msg)
	}
	pid := engineFor(t, n)
	awaitState(t, n, "asleep")
	// A pinned neighbour at 50 % (11517 MiB): more than chat's sleep frees.
	pin := executor.Desired{
		Replica: &pb.Replica{Model: "pin", Generation: 1, Node: node, Accelerator: "shared",
			Cards: []uint32{0}, MemoryMib: n.card.GetMemoryMib() / 2, PlacedIndex: 2, State: pb.ReplicaState_REPLICA_STATE_PLACED},
		Spec: &pb.ModelSpec{Model: "sim://pin", ServedModelName: "pin", Replicas: 1,
			Engine: &pb.EngineSpec{Kind: "sim", MemoryPercent: 50, Args: []string{"--load-seconds", "0.2", "--tokens-per-second", "0"}}},
	}
	n.publish(chat, pin)
	deadline := time.Now().Add(30 * time.Second)
	for controllerState(n) != residency.Sleeping {
		if time.Now().After(deadline) {
			t.Fatalf("the controller holds chat %s, want Sleeping: its sleep failed while pin started", controllerState(n))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := engineFor(t, n); got != pid {
		t.Fatalf("chat's engine is process %d, was %d: its sleep failed and the engine was stopped", got, pid)
	}
	deadline = time.Now().Add(30 * time.Second)
	for {
		done := make(chan pb.ReplicaState, 1)
		n.mgr.post(func() { done <- n.mgr.engines[rkey{"pin", 0}].state })
		if <-done == pb.ReplicaState_REPLICA_STATE_RUNNING {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("pin never ran after chat's sleep")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
