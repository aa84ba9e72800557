package executor

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/internal/testutil"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// TestOllamaIsRunningOnlyOnceItsModelIsLoaded (issue 33 point 5): an
// engine speaking Ollama answers /api/version before any model is loaded;
// the executor sends the driver's preload and reports the replica Running
// only once it answered, so the model is loaded (in /api/ps) by then and
// the first request does not pay the load.
func TestOllamaIsRunningOnlyOnceItsModelIsLoaded(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	d := wholeCard(h, sim("tags", 1, "--dialect", "ollama", "--load-seconds", "1"))
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

// TestChangeDuringAPreload: Ollama's preload loads the model, which may
// take minutes; meanwhile the supervisor still answers. A replica whose
// spec changes while its engine preloads gets its new engine at once, not
// after the old one's load.
func TestChangeDuringAPreload(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	d := wholeCard(h, sim("slow", 1, "--dialect", "ollama", "--load-seconds", "100"))
	d.Spec.Model = "llama3.2:1b"
	h.want(10, d)
	testutil.Eventually(t, 30*time.Second, "the engine never started preloading its model", func() error {
		for _, e := range h.exec.Engines() {
			if e.URL == "" {
				continue
			}
			resp, err := http.Get(e.URL + "/sim/status")
			if err != nil {
				return err
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if strings.Contains(string(body), `"state":"loading"`) {
				return nil
			}
			return fmt.Errorf("status %s", body)
		}
		return errors.New("no engine yet")
	})
	// The old engine's preload would take 100 s; the new one loads in 0.2.
	fast := wholeCard(h, sim("slow", 2, "--dialect", "ollama", "--load-seconds", "0.2"))
	fast.Spec.Model = "llama3.2:1b"
	h.want(11, fast)
	h.waitState("slow", pb.ReplicaState_REPLICA_STATE_RUNNING, 30*time.Second)
}

// wholeCard places d on the whole card: Ollama (and a sim speaking it)
// runs on a share of a card only under hard limits (docs/engines.md).
func wholeCard(h *harness, d Desired) Desired {
	d.Replica.MemoryMib = h.card.GetMemoryMib()
	d.Spec.Engine.MemoryPercent = 0
	return d
}
