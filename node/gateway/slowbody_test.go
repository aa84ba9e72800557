package gateway

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/internal/testutil"
)

// serveLimited runs a gateway (no models) behind NewServer with limits
// until the test ends and returns its address.
func serveLimited(t *testing.T, limits ServerLimits) string {
	t.Helper()
	g, err := New(Options{Node: "n1", Cluster: fixedView{}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go g.Run(ctx)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer(g, limits)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close(); cancel() })
	return ln.Addr().String()
}

// slowPost opens a connection, sends the headers of a chat completion
// whose body is size bytes and its first byte, and then one byte every
// 200ms until the connection fails or stop is closed.
func slowPost(t *testing.T, addr string, size int, stop <-chan struct{}) net.Conn {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{", size)
	go func() {
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			if _, err := conn.Write([]byte(" ")); err != nil {
				return
			}
		}
	}()
	return conn
}

// 200 connections trickling a body, a byte every 200ms, are each answered
// and closed by the gateway's port once their body deadline (1s here)
// passes: none stays open.
func TestSlowBodiesAreClosedAtTheirDeadline(t *testing.T) {
	const conns, timeout = 200, time.Second
	addr := serveLimited(t, ServerLimits{BodyTimeout: timeout, MaxUnfinishedBodies: conns})
	stop := make(chan struct{})
	defer close(stop)

	type result struct {
		status string
		body   string
		closed bool
		after  time.Duration
	}
	results := make([]result, conns)
	var wg sync.WaitGroup
	for i := range conns {
		start := time.Now()
		conn := slowPost(t, addr, 1000, stop)
		wg.Go(func() {
			defer conn.Close()
			// Far past the deadline: a connection still open then is the
			// failure this test looks for, not a slow machine.
			_ = conn.SetReadDeadline(time.Now().Add(60 * time.Second))
			br := bufio.NewReader(conn)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				results[i].status = "no answer: " + err.Error()
				return
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			results[i].status, results[i].body = resp.Status, string(body)
			// After the answer the server closes the connection: the
			// next read ends (EOF or reset), it does not time out.
			_, err = br.ReadByte()
			var ne net.Error
			results[i].closed = err != nil && !(errors.As(err, &ne) && ne.Timeout())
			results[i].after = time.Since(start)
		})
	}
	wg.Wait()
	var afters []time.Duration
	for i, r := range results {
		if r.status != "400 Bad Request" || !strings.Contains(r.body, "request body timeout") || !r.closed {
			t.Errorf("connection %d: %s %q, closed %t; want 400 with a body timeout, and the connection closed", i, r.status, r.body, r.closed)
			continue
		}
		afters = append(afters, r.after)
	}
	if len(afters) > 0 {
		slices.Sort(afters)
		t.Logf("%d slow-body connections closed; body timeout %s; closed after: min %s, median %s, max %s",
			len(afters), timeout, afters[0].Round(time.Millisecond), afters[len(afters)/2].Round(time.Millisecond), afters[len(afters)-1].Round(time.Millisecond))
	}
}

// One client address may have MaxUnfinishedBodies bodies arriving at once:
// a request past that is refused at once with 429 and its connection
// closed; once one of the slow bodies ends, a request is served again.
func TestUnfinishedBodiesPerClientAreBounded(t *testing.T) {
	addr := serveLimited(t, ServerLimits{BodyTimeout: time.Minute, MaxUnfinishedBodies: 2})
	stop := make(chan struct{})
	defer close(stop)
	a := slowPost(t, addr, 1000, stop)
	defer a.Close()
	b := slowPost(t, addr, 1000, stop)
	defer b.Close()

	post := func() (int, string) {
		body := `{"model":"nothing-here","messages":[{"role":"user","content":"hi"}]}`
		req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/chat/completions", strings.NewReader(body))
		req.Close = true
		resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(data)
	}
	// Once the server has taken both slow requests, a third is refused.
	var refused string
	testutil.Until(t, 30*time.Second, "a third body was never refused", func() bool {
		code, body := post()
		refused = body
		return code == http.StatusTooManyRequests
	})
	if !strings.Contains(refused, "127.0.0.1 already has 2 requests whose body is still arriving") {
		t.Errorf("refusal %q does not say why", refused)
	}
	// A slow body refused is answered and its connection closed at once,
	// not once the server has drained its trickle.
	c := slowPost(t, addr, 1000, stop)
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("a third slow body: %v, %v; want 429", resp, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	var ne net.Error
	if _, err := br.ReadByte(); err == nil || errors.As(err, &ne) && ne.Timeout() {
		t.Errorf("the refused slow body's connection is still open after its answer: %v", err)
	}
	// The end of a slow body (its client gone) frees its place.
	a.Close()
	testutil.Until(t, 30*time.Second, "requests are still refused after a slow body ended", func() bool {
		code, _ := post()
		return code != http.StatusTooManyRequests
	})
}
