package sim

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/internal/testutil"
)

// An answer's id carries the request's X-Request-Id, else its
// request_id, as vLLM forms it, so that a client can match each answer to
// the request that asked; without either it is the engine's own.
func TestSimAnswerIDIsTheRequests(t *testing.T) {
	base, _ := startEngine(t, Config{ServedModelName: "chat", MemoryMiB: 1024, LoadTime: time.Millisecond, TokensPerSecond: 0})
	var answer struct {
		ID string `json:"id"`
	}
	post(t, base+"/v1/completions", `{"prompt":"a b","max_tokens":2,"request_id":"r-1"}`, &answer)
	if answer.ID != "cmpl-r-1" {
		t.Fatalf("completion id %q, want cmpl-r-1", answer.ID)
	}
	post(t, base+"/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"request_id":"r-2"}`, &answer)
	if answer.ID != "chatcmpl-r-2" {
		t.Fatalf("chat id %q, want chatcmpl-r-2", answer.ID)
	}
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/completions", strings.NewReader(`{"prompt":"a","request_id":"body"}`))
	req.Header.Set("X-Request-Id", "header")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	buf := make([]byte, 4096)
	n, _ := resp.Body.Read(buf)
	b.Write(buf[:n])
	if !strings.Contains(b.String(), `"id":"cmpl-header"`) {
		t.Fatalf("with X-Request-Id header and request_id: %s, want the header's id", b.String())
	}
	post(t, base+"/v1/completions", `{"prompt":"a"}`, &answer)
	if !strings.HasPrefix(answer.ID, "cmpl-sim-") {
		t.Fatalf("id without a request id %q, want the engine's own cmpl-sim-N", answer.ID)
	}
}

// --max-num-seqs 1 runs one request at a time: a second waits while the
// first runs, then runs.
func TestSimMaxNumSeqsRunsOneAtATime(t *testing.T) {
	base, _ := startEngine(t, Config{ServedModelName: "chat", MemoryMiB: 1024, LoadTime: time.Millisecond, TokensPerSecond: 20, MaxNumSeqs: 1})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/completions", strings.NewReader(`{"prompt":"a","max_tokens":400}`))
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
			}
		})
	}
	testutil.Until(t, 20*time.Second, "one running, one waiting", func() bool {
		st := getStatus(t, base)
		return st.InFlight == 1 && st.Waiting == 1
	})
	cancel()
	wg.Wait()
}
