package gateway

import (
	"fmt"
	"net"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/node/gateway/queue"
)

// openBody opens a connection to the gateway at addr and sends a request
// announcing size bytes of body and sending the first sent of them.
func openBody(t *testing.T, addr string, size, sent int) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", size)
	if _, err := c.Write([]byte(strings.Repeat(" ", sent))); err != nil {
		t.Fatal(err)
	}
	return c
}

// TestGatewayFakeLengthBodiesBounded: 400 connections each announcing a
// body of 512 KiB and sending one byte pin a few KiB each, not what they
// announce: the Go heap grows by less than 32 MiB, where buffers sized
// from Content-Length took 200 MiB.
func TestGatewayFakeLengthBodiesBounded(t *testing.T) {
	_, srv, _ := startGateway(t, Options{Node: "n1", MaxBodyBytes: 512 << 10, Cluster: fixedView{}})
	addr := strings.TrimPrefix(srv.URL, "http://")
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for range 400 {
		openBody(t, addr, 512<<10, 1)
	}
	time.Sleep(500 * time.Millisecond)
	runtime.GC()
	runtime.ReadMemStats(&after)
	grew := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("400 fake-length bodies grew the heap by %.1f MiB", float64(grew)/(1<<20))
	if grew > 32<<20 {
		t.Fatalf("400 bodies announcing 512 KiB and sending a byte grew the heap by %d MiB, want under 32", grew>>20)
	}
}

// TestGatewayBodyBudget: the bodies held from all clients together stay
// within MaxBufferedBytes. With four slow bodies holding most of a 256 KiB
// budget, a request of 30 KB is refused with 503 bodies_buffered and a
// Retry-After while a small one still runs; once the slow clients go,
// their bytes are given back and the 30 KB request runs.
func TestGatewayBodyBudget(t *testing.T) {
	engine, _ := countingEngine(t)
	g, srv, _ := startGateway(t, Options{Node: "n1", MaxBodyBytes: 64 << 10, MaxBufferedBytes: 256 << 10,
		Cluster: fixedView{[]Model{{Served: "chat", Deployment: "chat", Class: queue.Standard,
			Replicas: []Replica{{Deployment: "chat", Node: "n1", Endpoint: engine, Kind: "vllm", Running: true, Resident: true}}}}}})
	small := `{"model":"chat","prompt":"hi"}`
	if code, data := send(t, srv.URL, "/v1/completions", small, nil); code != http.StatusOK {
		t.Fatalf("%d %s", code, data)
	}
	big := `{"model":"chat","prompt":"` + strings.Repeat("word ", 6000) + `"}`
	addr := strings.TrimPrefix(srv.URL, "http://")
	var slow []net.Conn
	for range 4 {
		slow = append(slow, openBody(t, addr, 60000, 40000))
	}
	for deadline := time.Now().Add(10 * time.Second); g.bodies.used.Load() < 4*60001; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the slow bodies hold %d bytes, want 4 × 60001", g.bodies.used.Load())
		}
	}
	resp, err := http.Post(srv.URL+"/v1/completions", "application/json", strings.NewReader(big))
	if err != nil {
		t.Fatal(err)
	}
	data := make([]byte, 4096)
	n, _ := resp.Body.Read(data)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(data[:n]), "bodies_buffered") || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("a 30 KB body with the budget nearly held: %d %s; want 503 bodies_buffered with a Retry-After", resp.StatusCode, data[:n])
	}
	if code, data := send(t, srv.URL, "/v1/completions", small, nil); code != http.StatusOK {
		t.Fatalf("a small body within what is left: %d %s", code, data)
	}
	for _, c := range slow {
		c.Close()
	}
	for deadline := time.Now().Add(10 * time.Second); g.bodies.used.Load() != 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d bytes still held after every request ended", g.bodies.used.Load())
		}
	}
	if code, data := send(t, srv.URL, "/v1/completions", big, nil); code != http.StatusOK {
		t.Fatalf("the 30 KB request after the slow clients left: %d %s", code, data)
	}
	for deadline := time.Now().Add(10 * time.Second); g.bodies.used.Load() != 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d bytes held after the last request", g.bodies.used.Load())
		}
	}
}
