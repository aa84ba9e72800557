package cardmanager

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/node/engine"
	"github.com/gpuplane/gpuplane/node/residency"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// Engines put to sleep their own way (issue 33, "use what the engines
// offer"), each against the sim speaking that engine strictly.

// engineFor waits for the replica's engine and returns its process id.
func engineFor(t *testing.T, n *adapterNode) int {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		for _, e := range n.ex.Engines() {
			if e.Model == "chat" && e.Replica == 0 {
				return e.PID
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal("chat's engine never ran")
	return 0
}

// awaitState waits until the engine's own /sim/status says state.
func awaitState(t *testing.T, n *adapterNode, state string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for got := simStatus(t, n).State; got != state; got = simStatus(t, n).State {
		if time.Now().After(deadline) {
			t.Fatalf("the engine stays %q, want %q", got, state)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestOllamaSleepsThroughKeepAlive: an idle warm Ollama replica is put to
// sleep by unloading its model (keep_alive 0), not by stopping `ollama
// serve`: the same process stays up with no model loaded (/api/ps empty),
// and a request by its tag wakes it (keep_alive -1) and is answered, by
// that same process, twice over.
func TestOllamaSleepsThroughKeepAlive(t *testing.T) {
	// Ollama runs on a share of a card only under hard limits
	// (docs/engines.md): MPS holds it to its share.
	n := newAdapterNodeEnforcing(t, t.TempDir(), func(c *residency.Config) { c.IdleSleep = 500 * time.Millisecond }, false,
		engine.Enforcement{Mode: engine.ModeMPS, MPSPipeDir: t.TempDir()})
	d := n.deployment(pb.Residency_RESIDENCY_WARM, 0, nil)
	d.Spec.Model = "llama3.2:1b"
	d.Spec.Engine.Args = append(d.Spec.Engine.Args, "--dialect", "ollama")

	n.publish(d)
	url := n.front()
	if code, model, msg := ask(t, url, "llama3.2:1b", ""); code != http.StatusOK || model != "llama3.2:1b" {
		t.Fatalf("first request: %d %q %s", code, model, msg)
	}
	pid := engineFor(t, n)
	for cycle := range 2 {
		awaitState(t, n, "unloaded")
		if got := engineFor(t, n); got != pid {
			t.Fatalf("cycle %d: asleep, the engine is process %d, was %d: the sleep stopped `ollama serve`", cycle, got, pid)
		}
		if ps := ollamaPS(t, n); len(ps) != 0 {
			t.Fatalf("cycle %d: asleep, /api/ps lists %v", cycle, ps)
		}
		// The controller hears of the finished sleep just after the engine
		// unloaded.
		deadline := time.Now().Add(30 * time.Second)
		for st := controllerState(n); st != residency.Sleeping; st = controllerState(n) {
			if time.Now().After(deadline) {
				t.Fatalf("cycle %d: the controller holds the replica %s, want Sleeping", cycle, st)
			}
			time.Sleep(20 * time.Millisecond)
		}
		if code, model, msg := ask(t, url, "llama3.2:1b", ""); code != http.StatusOK || model != "llama3.2:1b" {
			t.Fatalf("cycle %d: request after the sleep: %d %q %s", cycle, code, model, msg)
		}
		if got := engineFor(t, n); got != pid {
			t.Fatalf("cycle %d: woken, the engine is process %d, was %d", cycle, got, pid)
		}
	}
}

// controllerState is the residency state chat/0's controller holds.
func controllerState(n *adapterNode) residency.State {
	done := make(chan residency.State, 1)
	n.mgr.post(func() {
		st, _ := n.mgr.ctrls[0].ctrl.Replica(rkey{"chat", 0}.id())
		done <- st.State
	})
	return <-done
}

// ollamaPS is the engine's GET /api/ps: the names of the models loaded.
func ollamaPS(t *testing.T, n *adapterNode) []string {
	done := make(chan string, 1)
	n.mgr.post(func() { done <- n.mgr.engines[rkey{"chat", 0}].url })
	url := <-done
	var out struct {
		Models []struct{ Name string }
	}
	resp, err := http.Get(url + "/api/ps")
	if err != nil {
		t.Fatalf("GET /api/ps: %v", err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatalf("GET /api/ps: %v", err)
	}
	var names []string
	for _, m := range out.Models {
		names = append(names, m.Name)
	}
	return names
}

// TestVLLMSleepLevels: a warm vLLM replica sleeps at its deployment's
// spec.engine.sleepLevel. At level 2 vLLM discards the weights: the wake
// reloads them (reload_weights) before the request, which is answered (a
// strict vllm sim refuses requests to weights never reloaded); at level 1
// the wake copies them back from host RAM and reads nothing from disk.
func TestVLLMSleepLevels(t *testing.T) {
	for _, tc := range []struct {
		level        uint32
		reloadsPerUp int
	}{{2, 1}, {0, 0}} {
		n := newAdapterNodeWith(t, func(c *residency.Config) { c.IdleSleep = 500 * time.Millisecond })
		d := n.deployment(pb.Residency_RESIDENCY_WARM, 0, nil)
		d.Spec.Engine.SleepLevel = tc.level
		d.Spec.Engine.Args = append(d.Spec.Engine.Args, "--dialect", "vllm")
		n.publish(d)
		url := n.front()
		want := int(max(tc.level, 1))
		for cycle := range 2 {
			if code, model, msg := ask(t, url, "chat", ""); code != http.StatusOK || model != "chat" {
				t.Fatalf("level %d, cycle %d: request: %d %q %s", tc.level, cycle, code, model, msg)
			}
			if got := simStatus(t, n).WeightReloads; got != cycle*tc.reloadsPerUp {
				t.Fatalf("level %d, cycle %d: the engine read its weights from disk %d times, want %d", tc.level, cycle, got, cycle*tc.reloadsPerUp)
			}
			awaitState(t, n, "asleep")
			if got := simStatus(t, n).Level; got != want {
				t.Fatalf("level %d, cycle %d: the engine sleeps at level %d, want %d", tc.level, cycle, got, want)
			}
		}
		n.publish()
	}
}
