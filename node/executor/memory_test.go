package executor

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/internal/testutil"
	"github.com/gpuplane/gpuplane/node/watchdog"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// simAt is a replica of a sim deployment named model at percent % of the
// harness's card.
func (h *harness) simAt(model string, percent uint32, args ...string) Desired {
	d := sim(model, 1, args...)
	d.Replica.MemoryMib = h.card.GetMemoryMib() * uint64(percent) / 100
	d.Spec.Engine.MemoryPercent = percent
	return d
}

// vLLM's process holds about 1.4 GiB above what --gpu-memory-utilization
// asks (docs/engines.md); the strict vllm dialect does too. A vLLM replica
// at 10 % of an L4 (2303 MiB) next to a busy neighbour is given its knob
// below its share by that much, so it lives through 300 watchdog checks
// (10 minutes at the watchdog's default 2 s interval; the sim's memory is
// steady once it serves), while one that really takes more than its share
// is still stopped.
func TestVLLMSmallShareLivesBesideABusyNeighbour(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	h.want(10, h.simAt("busy", 40, "--tokens-per-second", "50"))
	busy := h.waitState("busy", pb.ReplicaState_REPLICA_STATE_RUNNING, 30*time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		// The neighbour decodes a long answer the whole time.
		body := `{"model":"busy","messages":[{"role":"user","content":"go"}],"max_tokens":100000,"stream":true}`
		req, _ := http.NewRequestWithContext(ctx, "POST", busy.Endpoint+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if resp, err := http.DefaultClient.Do(req); err == nil {
			defer resp.Body.Close()
			_, _ = resp.Body.Read(make([]byte, 1))
			<-ctx.Done()
		}
	}()
	small := h.simAt("small", 10, "--dialect", "vllm", "--tokens-per-second", "0")
	h.want(11, h.simAt("busy", 40, "--tokens-per-second", "50"), small)
	h.waitState("small", pb.ReplicaState_REPLICA_STATE_RUNNING, 30*time.Second)
	pid := onePID(t, "small")

	wd := watchdog.New(h.nvml, h.exec, watchdog.Options{})
	for i := range 300 {
		for _, v := range wd.Check() {
			t.Fatalf("check %d: the watchdog stops %s/%d: %s", i, v.Engine.Model, v.Engine.Replica, v.Reason)
		}
		time.Sleep(2 * time.Millisecond)
	}
	used, err := watchdog.ProcessMemory(h.nvml, h.card.GetUuid())
	if err != nil {
		t.Fatal(err)
	}
	share := small.Replica.GetMemoryMib()
	if used[pid] == 0 || used[pid] > share {
		t.Errorf("the vLLM replica holds %d MiB on the card, want at most its share of %d MiB", used[pid], share)
	}
	if st := h.rep.last("small"); st.State != pb.ReplicaState_REPLICA_STATE_RUNNING {
		t.Errorf("small is %s (%s), want Running", st.State, st.Reason)
	}

	// A vLLM replica told to use twice its share is stopped.
	hog := h.simAt("hog", 10, "--dialect", "vllm", "--tokens-per-second", "0", "--memory-mib", "4606")
	h.want(12, h.simAt("busy", 40, "--tokens-per-second", "50"), small, hog)
	testutil.Until(t, 30*time.Second, "the hog was not stopped for its memory", func() bool {
		for _, st := range h.rep.of("hog") {
			if st.State == pb.ReplicaState_REPLICA_STATE_FAILED && strings.HasPrefix(st.Reason, "exceeded memory share (used 6040 MiB, share 2303 MiB)") {
				return true
			}
		}
		return false
	})
	if st := h.rep.last("small"); st.State != pb.ReplicaState_REPLICA_STATE_RUNNING {
		t.Errorf("small is %s (%s) beside the hog, want Running", st.State, st.Reason)
	}
}
