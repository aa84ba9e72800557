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
