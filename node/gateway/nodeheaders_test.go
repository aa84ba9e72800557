package gateway

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/node/gateway/queue"
)

// orderEngine answers each request after a pause, one at a time as the
// gateway sends them, recording the order of their tenants.
func orderEngine(t *testing.T, pause time.Duration) (string, func() []string) {
	t.Helper()
	var mu sync.Mutex
	var order []string
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		mu.Lock()
		order = append(order, r.Header.Get(TenantHeader))
		mu.Unlock()
		time.Sleep(pause)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"x","object":"text_completion","choices":[{"index":0,"text":"ok","finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":4,"total_tokens":5}}`)
	}))
	t.Cleanup(engine.Close)
	return engine.URL, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), order...)
	}
}

// TestGatewayClientCannotSetItsWeight: without ACLs a client that sends
// the headers a forwarding node sends (X-Gpuplane-Forwarded-By and
// X-Gpuplane-Tenant-Weight: 1000) is not a node: its weight stays 1, so on
// a one-at-a-time engine a light tenant queued behind it gets about half
// the turns. A weight forged once does not stay with the tenant either:
// its later plain requests weigh 1 too. A peer node's weight header is
// still applied.
func TestGatewayClientCannotSetItsWeight(t *testing.T) {
	for _, tc := range []struct {
		name   string
		forged func(i int) bool // which of heavy's requests carry the headers
		peer   bool
		fair   bool
	}{
		{"every request forged", func(int) bool { return true }, false, true},
		{"one forged request, then plain ones", func(i int) bool { return i == 0 }, false, true},
		{"a peer node's weight", func(int) bool { return true }, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			engine, order := orderEngine(t, 10*time.Millisecond)
			_, srv, _ := startGateway(t, Options{Node: "n1",
				IsPeer: func(r *http.Request) bool { return tc.peer && r.Header.Get("Authorization") == "Bearer agent" },
				Cluster: fixedView{[]Model{{Served: "chat", Deployment: "chat", Class: queue.Standard,
					Replicas: []Replica{{Deployment: "chat", Node: "n1", Endpoint: engine, Kind: "vllm", MaxInFlight: 1, Running: true, Resident: true}}}}}})
			post := func(tenant string, forged bool) {
				h := map[string]string{TenantHeader: tenant}
				if forged {
					h[ForwardedHeader], h[WeightHeader] = "n2", "1000"
					if tc.peer {
						h["Authorization"] = "Bearer agent"
					}
				}
				if code, data := send(t, srv.URL, "/v1/completions", `{"model":"chat","prompt":"one two three four","max_tokens":4}`, h); code != http.StatusOK {
					t.Errorf("%s: %d %s", tenant, code, data)
				}
			}
			// The first forged request runs alone: its weight is set
			// before the rest queue.
			post("heavy", tc.forged(0))
			var wg sync.WaitGroup
			for i := 1; i < 30; i++ {
				wg.Go(func() { post("heavy", tc.forged(i)) })
			}
			for deadline := time.Now().Add(10 * time.Second); len(order()) < 3 && time.Now().Before(deadline); {
				time.Sleep(5 * time.Millisecond)
			}
			time.Sleep(50 * time.Millisecond)
			for range 16 {
				wg.Go(func() { post("light", false) })
			}
			wg.Wait()
			got := order()
			first := -1
			for i, tn := range got {
				if tn == "light" {
					first = i
					break
				}
			}
			if first < 0 || first+16 > len(got) {
				t.Fatalf("order %v: light's requests never ran amid heavy's", got)
			}
			light := 0
			for _, tn := range got[first : first+16] {
				if tn == "light" {
					light++
				}
			}
			if tc.fair && light < 6 {
				t.Fatalf("light had %d of the 16 turns from its first (order %s); with both weighing 1 it has about half", light, strings.Join(got, " "))
			}
			if !tc.fair && light > 3 {
				t.Fatalf("light had %d of the 16 turns from its first against a peer-given weight of 1000 (order %s)", light, strings.Join(got, " "))
			}
		})
	}
}
