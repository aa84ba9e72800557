package cardmanager

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"strings"
	"testing"
	"time"
)

// TestFrontKeepsSendingTheBodyOnceTheAnswerStarted: an engine may start
// its answer before it has read the whole request (an HTTP/1.1 server
// answering as soon as it can, or simply one that has the last bytes
// while the front's transport has yet to finish its copy). The front's
// own HTTP server must not drain and close the client's request body when
// the answer's headers go out: the transport still copying that body to
// the engine would fail its write and close the engine's connection,
// cutting the answer off ("ReverseProxy read error during body copy: use
// of closed network connection"). Here the engine answers its headers at
// once and reads the body after, which the client sends in pieces once it
// has those headers; every byte must reach the engine and its whole
// answer the client.
func TestFrontKeepsSendingTheBodyOnceTheAnswerStarted(t *testing.T) {
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		if err := rc.EnableFullDuplex(); err != nil {
			t.Errorf("engine: %v", err)
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		_ = rc.Flush()
		n, err := io.Copy(io.Discard, r.Body)
		fmt.Fprintf(w, "data: read %d bytes, err %v\n\n", n, err)
	}))
	defer engine.Close()

	f := readyFront(t, engine.URL)

	// Pieces of a full buffer each, so that each goes out as it is
	// written (the transports' write buffers are 4 KiB); the whole stays
	// below what a server drains of an unread body (256 KiB).
	const piece, pieces = 4096, 12
	client := &http.Client{Timeout: time.Minute}
	for round := range 3 {
		pr, pw := io.Pipe()
		headers := make(chan struct{})
		go func() {
			chunk := strings.Repeat("x", piece)
			for i := range pieces {
				if i > 0 {
					// A piece at a time, until the answer's headers came
					// (without the fix they come only once the front's server
					// has drained the body), then the rest a little apart:
					// the front's server, which would wait for the body
					// once its answer started, is there when a piece comes.
					select {
					case <-headers:
						time.Sleep(5 * time.Millisecond)
					case <-time.After(20 * time.Millisecond):
					}
				}
				if _, err := io.WriteString(pw, chunk); err != nil {
					return
				}
			}
			_ = pw.Close()
		}()
		req, err := http.NewRequest(http.MethodPost, f.url+"/v1/completions", pr)
		if err != nil {
			t.Fatal(err)
		}
		req.ContentLength = piece * pieces
		resp, err := client.Do(req)
		close(headers)
		if err != nil {
			_ = pr.CloseWithError(err)
			t.Fatalf("round %d: %v", round, err)
		}
		data, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		want := fmt.Sprintf("data: read %d bytes, err <nil>\n\n", piece*pieces)
		if err != nil || string(data) != want {
			t.Fatalf("round %d: the answer was %q, %v; want %q", round, data, err, want)
		}
	}
}

// TestFrontKeepsTheConnectionWhenTheEngineIsGone: requests with bodies on
// one client connection to a front whose engine cannot be reached are
// each answered 502, the connection kept: the body the transport never
// read must not be left to the server to drain after the handler (in
// full duplex, that panics the connection when the next request is read).
func TestFrontKeepsTheConnectionWhenTheEngineIsGone(t *testing.T) {
	engine := httptest.NewServer(http.NotFoundHandler())
	gone := engine.URL
	engine.Close()

	f := readyFront(t, gone)

	client := &http.Client{Timeout: time.Minute, Transport: &http.Transport{MaxConnsPerHost: 1}}
	for i := range 3 {
		resp, err := client.Post(f.url+"/v1/completions", "application/json", strings.NewReader(strings.Repeat("x", 100<<10)))
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadGateway {
			t.Fatalf("request %d: %d, want 502", i, resp.StatusCode)
		}
	}
}

// TestFrontAnswersAfterTheReplicaLeft: a request sent on a kept-alive
// connection just after the replica left is answered 503 with
// Retry-After and its connection closed, not cut off with the connection
// (the client would read EOF); so is one on a new connection while the
// port lingers.
func TestFrontAnswersAfterTheReplicaLeft(t *testing.T) {
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, `{"ok":true}`)
	}))
	defer engine.Close()

	m := New(Options{BindHost: "127.0.0.1", LeaveGrace: time.Minute})
	f, err := m.front(rkey{"chat", 0})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.srv.Close() }()
	m.applied[f.k] = true
	f.set(true, engine.URL)

	client := &http.Client{Timeout: time.Minute, Transport: &http.Transport{MaxConnsPerHost: 1}}
	post := func(i int) (*http.Response, bool) {
		reused := false
		trace := &httptrace.ClientTrace{GotConn: func(ci httptrace.GotConnInfo) { reused = ci.Reused }}
		req, err := http.NewRequestWithContext(httptrace.WithClientTrace(t.Context(), trace), "POST",
			f.url+"/v1/completions", strings.NewReader(`{"model":"chat"}`))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp, reused
	}
	if resp, _ := post(0); resp.StatusCode != http.StatusOK {
		t.Fatalf("request 0: %d, want 200", resp.StatusCode)
	}
	// The replica leaves: the node is placed without it (the fronts
	// close as Placed is called; no loop runs here).
	m.Placed(nil)
	for i := 1; i <= 2; i++ {
		resp, reused := post(i)
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || !resp.Close {
			t.Fatalf("request %d after the replica left: %d, Retry-After %q, closes %v; want 503 with Retry-After closing its connection",
				i, resp.StatusCode, resp.Header.Get("Retry-After"), resp.Close)
		}
		if want := i == 1; reused != want {
			t.Fatalf("request %d: connection reused %v, want %v", i, reused, want)
		}
	}
}

// readyFront is a manager's front for replica chat/0 that is ready and
// sends to engineURL, as if the manager's loop had applied the replica's
// placement and the engine were up; its fronts close with the test.
func readyFront(t *testing.T, engineURL string) *front {
	t.Helper()
	m := New(Options{BindHost: "127.0.0.1"})
	f, err := m.front(rkey{"chat", 0})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.closeFronts)
	m.applied[f.k] = true
	f.set(true, engineURL)
	return f
}

// TestFrontServesOnlyItsGateway: with a front key (ACLs on), a front
// answers its health check to anyone but serves a request only when it
// bears the key, whatever tenant it names; the engine never sees the key.
func TestFrontServesOnlyItsGateway(t *testing.T) {
	seen := make(chan http.Header, 8)
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- r.Header.Clone()
		_, _ = io.WriteString(w, `{"ok":true}`)
	}))
	defer engine.Close()
	m := New(Options{FrontKey: "the-node-s-front-key"})
	f, err := m.front(rkey{"chat", 0})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.closeFronts)
	m.applied[f.k] = true
	f.set(true, engine.URL)
	if !strings.HasPrefix(f.url, "http://127.0.0.1:") {
		t.Fatalf("front at %s: want loopback by default", f.url)
	}
	send := func(method, path string, header ...string) (int, string) {
		req, _ := http.NewRequest(method, f.url+path, strings.NewReader(`{"model":"chat"}`))
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := send(http.MethodGet, "/health"); code != http.StatusOK {
		t.Errorf("/health without the key: %d, want 200", code)
	}
	for _, h := range [][]string{{TenantHeader, "acme"}, {TenantHeader, "acme", "X-Gpuplane-Front-Key", "a-guess"}} {
		if code, body := send(http.MethodPost, "/v1/completions", h...); code != http.StatusForbidden || !strings.Contains(body, "gateway") {
			t.Errorf("headers %q: %d %s, want 403 pointing at the gateway", h, code, body)
		}
		if code, _ := send(http.MethodGet, "/v1/models", h...); code != http.StatusForbidden {
			t.Errorf("GET /v1/models, headers %q: %d, want 403", h, code)
		}
	}
	select {
	case h := <-seen:
		t.Fatalf("a refused request reached the engine: %v", h)
	default:
	}
	if code, body := send(http.MethodPost, "/v1/completions", TenantHeader, "acme", "X-Gpuplane-Front-Key", "the-node-s-front-key"); code != http.StatusOK {
		t.Fatalf("with the key: %d %s, want 200", code, body)
	}
	h := <-seen
	if h.Get("X-Gpuplane-Front-Key") != "" || h.Get(TenantHeader) != "acme" {
		t.Errorf("the engine got front key %q and tenant %q: want none and acme", h.Get("X-Gpuplane-Front-Key"), h.Get(TenantHeader))
	}
}

// TestFrontAnswerAfterLeavingClosesItsConnection: a request the engine
// answers only after the replica left gets its answer with "Connection:
// close", so the client does not send its next request on a connection
// the front is about to close.
func TestFrontAnswerAfterLeavingClosesItsConnection(t *testing.T) {
	got, release := make(chan struct{}), make(chan struct{})
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		close(got)
		<-release
		_, _ = io.WriteString(w, `{"ok":true}`)
	}))
	defer engine.Close()
	m := New(Options{BindHost: "127.0.0.1", LeaveGrace: time.Minute})
	f, err := m.front(rkey{"chat", 0})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.srv.Close() }()
	m.applied[f.k] = true
	f.set(true, engine.URL)

	type answer struct {
		resp *http.Response
		err  error
	}
	done := make(chan answer, 1)
	go func() {
		resp, err := http.Post(f.url+"/v1/completions", "application/json", strings.NewReader(`{"model":"chat"}`))
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		done <- answer{resp, err}
	}()
	<-got
	m.Placed(nil)
	close(release)
	a := <-done
	if a.err != nil {
		t.Fatal(a.err)
	}
	if a.resp.StatusCode != http.StatusOK || !a.resp.Close {
		t.Fatalf("an answer that began after the replica left: %d, closes %v; want 200 closing its connection", a.resp.StatusCode, a.resp.Close)
	}
}
