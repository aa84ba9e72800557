package gateway

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/node/gateway/queue"
	"github.com/gpuplane/gpuplane/node/sim"
)

// TestGatewayCutsStalledStream: on an engine that runs one request at a
// time, a client streams max_tokens 200000 and never reads. Once the
// connection's buffers are full and StreamStall (here 500ms) passes
// without a write going out, the gateway cuts the stream and cancels its
// engine request, so the next client is served; without the limit it
// waits for ever.
func TestGatewayCutsStalledStream(t *testing.T) {
	engine := simEngineWith(t, sim.Config{ServedModelName: "chat", MaxNumSeqs: 1})
	_, srv, _ := startGateway(t, Options{Node: "n1", StreamStall: 500 * time.Millisecond,
		Cluster: fixedView{[]Model{{Served: "chat", Deployment: "chat", Class: queue.Standard,
			Replicas: []Replica{{Deployment: "chat", Node: "n1", Endpoint: engine, Kind: "vllm", MaxInFlight: 1, Running: true, Resident: true}}}}}})
	// The replica is placed.
	if code, data := send(t, srv.URL, "/v1/completions", `{"model":"chat","prompt":"hi","max_tokens":2}`, nil); code != http.StatusOK {
		t.Fatalf("%d %s", code, data)
	}
	c, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	body := `{"model":"chat","prompt":"hi","max_tokens":200000,"stream":true}`
	fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	// It never reads. The next client's request waits for the one slot.
	time.Sleep(200 * time.Millisecond)
	client := &http.Client{Timeout: 20 * time.Second}
	resp, err := client.Post(srv.URL+"/v1/completions", "application/json", strings.NewReader(`{"model":"chat","prompt":"next","max_tokens":3}`))
	if err != nil {
		t.Fatalf("the next client was not served while a stream's client did not read: %v", err)
	}
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("the next client: %d %s", resp.StatusCode, data)
	}
	// The stalled client's connection was closed: reading it ends.
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.Copy(io.Discard, c); err != nil {
		t.Fatalf("the stalled stream's connection is still open: %v", err)
	}
}
