package gateway

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// TestEngineTransportKeepsAliveAndSurvivesAnIdleClose: requests reuse one
// kept-alive connection, chunked and sized bodies both end it cleanly, and a
// connection the engine closed while idle is replaced without an error.
func TestEngineTransportKeepsAliveAndSurvivesAnIdleClose(t *testing.T) {
	var conns atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if r.URL.Path == "/v1/chunked" {
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = w.Write([]byte("data: 1\n\n"))
			w.(http.Flusher).Flush()
			_, _ = w.Write([]byte("data: " + string(b) + "\n\n"))
			return
		}
		_, _ = w.Write(append([]byte(r.Header.Get(TenantHeader)+":"), b...))
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	tr := newEngineTransport()
	defer tr.closeIdle()
	ctx := context.Background()
	get := func(path, body string) string {
		t.Helper()
		resp, err := tr.post(ctx, srv.URL, path, []byte(body), TenantHeader, "acme")
		if err != nil {
			t.Fatalf("post %s: %v", path, err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("post %s: %d %q %v", path, resp.StatusCode, b, err)
		}
		return string(b)
	}
	if got := get("/v1/completions", "x"); got != "acme:x" {
		t.Errorf("sized answer %q, want %q", got, "acme:x")
	}
	if got := get("/v1/chunked", "y"); got != "data: 1\n\ndata: y\n\n" {
		t.Errorf("chunked answer %q", got)
	}
	get("/v1/completions", "z")
	if n := conns.Load(); n != 1 {
		t.Errorf("three requests in a row opened %d connections, want 1 (kept alive)", n)
	}
	// The engine drops every idle connection: the kept one is stale, and
	// the next request goes on a new one, without an error.
	srv.CloseClientConnections()
	time.Sleep(50 * time.Millisecond)
	if got := get("/v1/completions", "again"); got != "acme:again" {
		t.Errorf("after an idle close: %q", got)
	}
	if n := conns.Load(); n != 2 {
		t.Errorf("connections: %d, want 2", n)
	}
}

// TestEngineTransportCancelClosesTheConnection: a request whose context
// ends while the engine has not answered returns at once, and its
// connection is not reused.
func TestEngineTransportCancelClosesTheConnection(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	tr := newEngineTransport()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := tr.post(ctx, srv.URL, "/v1/completions", []byte("{}"))
		errc <- err
	}()
	time.Sleep(50 * time.Millisecond)
	cancel()
	select {
	case err := <-errc:
		if err == nil {
			t.Fatal("a cancelled request returned no error")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a cancelled request did not return")
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if len(tr.idle) != 0 {
		t.Errorf("the cancelled request's connection was kept: %v", tr.idle)
	}
}
