package gateway

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/node/gateway/queue"
)

// movingView is a one-replica cluster whose engine address can change.
type movingView struct {
	mu  sync.Mutex
	url string
}

func (v *movingView) Models(context.Context) ([]Model, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return []Model{{Served: "chat", Deployment: "chat", Class: queue.Standard, Replicas: []Replica{{Deployment: "chat",
		Node: "n1", Endpoint: v.url, Kind: "sim", Running: true, Resident: true}}}}, nil
}
func (v *movingView) Gateway(string) (string, bool) { return "", false }

// TestGatewayRedialsAMovedEngine: a replica's engine restarted on another
// port (as after an onDemand reload) before the gateway's next read of the
// cluster: a request that finds nothing listening at the old address reads
// the address again and is served there, not answered 502.
func TestGatewayRedialsAMovedEngine(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String()
	ln.Close()
	view := &movingView{url: dead}
	// Read the cluster once at start, then only on demand.
	g, srv, _ := startGateway(t, Options{Node: "n1", Cluster: view, Refresh: time.Hour})
	for deadline := time.Now().Add(20 * time.Second); g.localFor(Replica{Deployment: "chat"}) == nil; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the gateway never placed its replica")
		}
	}
	view.mu.Lock()
	view.url = simEngine(t, "chat", 0)
	view.mu.Unlock()
	resp, err := http.Post(srv.URL+"/v1/completions", "application/json", strings.NewReader(`{"model":"chat","prompt":"hi","max_tokens":2}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("a request after the engine moved: %d %s; want 200 from the engine's new address", resp.StatusCode, b)
	}
}
