package sim

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/internal/testutil"
)

// openStream starts a long streamed completion with priority p and reads
// its first token; the stream stays open until ctx ends.
func openStream(t *testing.T, ctx context.Context, base string, p int) *bufio.Reader {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/completions",
		strings.NewReader(fmt.Sprintf(`{"prompt":"long","max_tokens":100000,"stream":true,"priority":%d}`, p)))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("stream with priority %d: %d", p, resp.StatusCode)
	}
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	return br
}

// Under --scheduling-policy priority a full batch lets the waiting
// requests in by priority, not by arrival: sent background, standard,
// interactive (2, 1, 0) behind a running request, they finish 0, 1, 2.
func TestSimPriorityPolicyOrdersTheWaiting(t *testing.T) {
	base, _ := startEngine(t, Config{ServedModelName: "m", MemoryMiB: 1024, TokensPerSecond: 50, MaxNumSeqs: 1, SchedulingPolicy: "priority"})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	openStream(t, ctx, base, 0)
	done := make(chan int, 3)
	for i, p := range []int{2, 1, 0} {
		go func() {
			code, body := call(t, http.MethodPost, base+"/v1/completions", fmt.Sprintf(`{"prompt":"a","max_tokens":2,"priority":%d}`, p))
			if code != http.StatusOK {
				t.Errorf("priority %d: %d %s", p, code, body)
			}
			done <- p
		}()
		testutil.Until(t, 20*time.Second, "the request waiting", func() bool { return getStatus(t, base).Waiting == i+1 })
	}
	if st := getStatus(t, base); st.Preempted != 0 {
		t.Fatalf("%d requests paused for ones of the same priority as the running one", st.Preempted)
	}
	cancel() // the running request ends: the batch takes the waiting
	var order []int
	for range 3 {
		order = append(order, <-done)
	}
	if fmt.Sprint(order) != "[0 1 2]" {
		t.Fatalf("waiting requests finished in priority order %v, want [0 1 2]", order)
	}
}

// Under --scheduling-policy priority an interactive request runs at once
// in a full batch of background work: the last background request pauses
// (it neither ends nor is cut), and goes on once the interactive one is
// done.
func TestSimPriorityPolicyPausesLowerPriority(t *testing.T) {
	base, _ := startEngine(t, Config{ServedModelName: "m", MemoryMiB: 1024, TokensPerSecond: 50, MaxNumSeqs: 2, SchedulingPolicy: "priority"})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	bg := []*bufio.Reader{openStream(t, ctx, base, 2), openStream(t, ctx, base, 2)}
	code, body := call(t, http.MethodPost, base+"/v1/completions", `{"prompt":"a","max_tokens":3,"priority":0}`)
	if code != http.StatusOK {
		t.Fatalf("interactive request in a full batch of background work: %d %s", code, body)
	}
	st := getStatus(t, base)
	if st.Preempted != 1 {
		t.Fatalf("%d background requests paused for the interactive one, want 1", st.Preempted)
	}
	testutil.Until(t, 20*time.Second, "both background streams running again", func() bool {
		st := getStatus(t, base)
		return st.InFlight == 2 && st.Waiting == 0
	})
	for i, br := range bg {
		for range 3 {
			line, err := br.ReadString('\n')
			if err != nil || strings.Contains(line, `"finish_reason":"abort"`) {
				t.Fatalf("background stream %d after the pause: %q %v; want it going on", i, line, err)
			}
		}
	}
}
