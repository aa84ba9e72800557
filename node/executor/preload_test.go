package executor

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// TestOllamaIsRunningOnlyOnceItsModelIsLoaded (issue 33 point 5): an
// engine speaking Ollama answers /api/version before any model is loaded;
// the executor sends the driver's preload and reports the replica Running
// only once it answered, so the model is loaded (in /api/ps) by then and
// the first request does not pay the load.
func TestOllamaIsRunningOnlyOnceItsModelIsLoaded(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	d := sim("tags", 1, "--dialect", "ollama", "--load-seconds", "1")
	d.Spec.Model = "llama3.2:1b"
	h.want(10, d)
	st := h.waitState("tags", pb.ReplicaState_REPLICA_STATE_RUNNING, 30*time.Second)
	resp, err := http.Get(st.GetEndpoint() + "/api/ps")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), `"name":"llama3.2:1b"`) {
		t.Fatalf("Running, but /api/ps lists %s: the model is not loaded", body)
	}
}

// TestNeighbourMiB (issue 33 point 4): what the other replicas reserve on
// a replica's cards, the most on any one, is what an Ollama engine will
// find missing from the free memory it sizes itself by.
func TestNeighbourMiB(t *testing.T) {
	e := &Executor{sups: map[key]*supervisor{}}
	place := func(model string, mib uint64, cards ...uint32) *pb.Replica {
		r := &pb.Replica{Model: model, Cards: cards, MemoryMib: mib}
		e.sups[key{model, 0}] = &supervisor{desired: Desired{Replica: r}}
		return r
	}
	me := place("me", 5000, 0, 1)
	place("a", 3000, 0)
	place("b", 2000, 0)
	place("c", 7000, 1)
	place("d", 9000, 2)
	if got := e.neighbourMiB(key{"me", 0}, me); got != 7000 {
		t.Fatalf("neighbourMiB = %d, want 7000 (card 1's; card 0 holds 5000)", got)
	}
	if got := e.neighbourMiB(key{"d", 0}, &pb.Replica{Cards: []uint32{2}}); got != 0 {
		t.Fatalf("alone on card 2: neighbourMiB = %d, want 0", got)
	}
}
