package gateway

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// engineTransport is the gateway's HTTP/1.1 client of this node's engines
// (plain http:// URLs, POST only). It keeps connections
// alive between requests like net/http's Transport, but holds nothing else
// per request: no goroutines (the Transport runs a read and a write loop per
// connection) and no buffer until the engine's first byte (the Transport
// holds 8 KiB per connection). A stream waiting for its first token costs
// the gateway its engine socket and little more: that is most of what an
// idle stream costs (bench/gateway's idle-stream memory). The wire format
// is net/http's own: Header.Write out, http.ReadResponse in.
type engineTransport struct {
	dialer net.Dialer
	// idleTimeout bounds how long a connection waits for its next request;
	// below the engines' own keep-alive timeouts (uvicorn's, vLLM's server,
	// is 5 s), so an engine rarely closes one the gateway is about to reuse.
	idleTimeout time.Duration
	// maxIdle bounds the idle connections kept per engine.
	maxIdle int

	mu   sync.Mutex
	idle map[string][]idleConn // by host:port, most recently used last
	reap *time.Timer
}

type idleConn struct {
	c     net.Conn
	since time.Time
}

func newEngineTransport() *engineTransport {
	return &engineTransport{dialer: net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second},
		idleTimeout: 4 * time.Second, maxIdle: 1024, idle: map[string][]idleConn{}}
}

// readers hold the response readers of requests being answered.
var readers = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 4<<10) }}

// post sends body to base+path (base: http://host:port) with the headers
// given (name, value pairs) and returns the engine's answer; its body must
// be read to the end or closed.
func (t *engineTransport) post(ctx context.Context, base, path string, body []byte, headers ...string) (*http.Response, error) {
	host, head, err := requestHead(base, path, len(body), headers...)
	if err != nil {
		return nil, err
	}
	return t.do(ctx, host, head, body)
}

// requestHead is the head of a POST of n bytes to base+path, and the
// host:port it goes to.
func requestHead(base, path string, n int, headers ...string) (string, []byte, error) {
	u, err := url.Parse(base)
	if err != nil {
		return "", nil, err
	}
	if u.Scheme != "http" || u.Host == "" {
		return "", nil, fmt.Errorf("engine URL %s: the gateway reaches engines at http://host:port on this node", u.Redacted())
	}
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), "80")
	}
	size := len("POST  HTTP/1.1\r\nHost: \r\nContent-Length: 1234567890\r\n\r\n") + len(u.Path) + len(path) + len(u.Host)
	for _, h := range headers {
		size += len(h) + 2 // ": " or "\r\n"
	}
	// Sized to fit: it stays with the request while it waits.
	head := make([]byte, 0, size)
	head = append(head, "POST "...)
	head = append(head, strings.TrimSuffix(u.Path, "/")...)
	head = append(head, path...)
	head = append(head, " HTTP/1.1\r\nHost: "...)
	head = append(head, u.Host...)
	head = append(head, "\r\nContent-Length: "...)
	head = strconv.AppendInt(head, int64(n), 10)
	for i := 0; i+1 < len(headers); i += 2 {
		head = append(head, "\r\n"...)
		head = append(head, headers[i]...)
		head = append(head, ": "...)
		head = append(head, headers[i+1]...)
	}
	head = append(head, "\r\n\r\n"...)
	return host, head, nil
}

// do sends a request (its head and body) to host and returns the answer.
func (t *engineTransport) do(ctx context.Context, host string, head, body []byte) (*http.Response, error) {
	e := exchange{host: host, head: head, body: body}
	for {
		if err := t.begin(ctx, &e); err != nil {
			return nil, err
		}
		n, err := e.c.Read(e.first[:])
		resp, err := t.end(ctx, &e, n, err)
		if err != errRetry {
			return resp, err
		}
	}
}

// errRetry: an exchange failed before any byte of the answer on a
// kept-alive connection (the engine closed it while idle), so the request
// goes again on a new one.
var errRetry = errors.New("engine connection closed while idle")

// exchange is one request to an engine. begin writes it, the caller reads
// the answer's first byte from c, and end reads the rest of its head: a
// request blocks in that read until the engine's first byte, and the
// caller makes it from as small a stack as it can (call, in local.go,
// says why). The first byte is read without a buffer: an idle stream
// holds none.
type exchange struct {
	host       string
	head, body []byte
	c          net.Conn
	reused     bool
	stop       func() bool
	first      [1]byte
}

// begin writes e's request on a kept-alive connection or a new one, e.c.
// A cancelled request unblocks its reads and writes at once, and its
// connection is not reused.
func (t *engineTransport) begin(ctx context.Context, e *exchange) error {
	for {
		c, reused, err := t.get(ctx, e.host)
		if err != nil {
			return err
		}
		stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
		bufs := net.Buffers{e.head, e.body}
		if _, err := bufs.WriteTo(c); err != nil {
			_, _, err = fail(ctx, c, stop, true, err)
			if reused && ctx.Err() == nil {
				continue
			}
			return err
		}
		e.c, e.reused, e.stop = c, reused, stop
		return nil
	}
}

// end reads the answer's head, n and err being the read of its first
// byte; errRetry: begin again.
func (t *engineTransport) end(ctx context.Context, e *exchange, n int, err error) (*http.Response, error) {
	c, stop := e.c, e.stop
	e.c, e.stop = nil, nil
	if n == 0 {
		if err == nil {
			err = io.ErrNoProgress
		}
		_, _, err = fail(ctx, c, stop, true, err)
		if e.reused && ctx.Err() == nil {
			return nil, errRetry
		}
		return nil, err
	}
	resp, _, err := t.readHead(ctx, c, e.host, e.first[0], stop)
	return resp, err
}

// fail ends an exchange that failed: its connection is closed.
func fail(ctx context.Context, c net.Conn, stop func() bool, early bool, err error) (*http.Response, bool, error) {
	stop()
	c.Close()
	if ctx.Err() != nil {
		return nil, early, context.Cause(ctx)
	}
	return nil, early, err
}

// readHead reads an answer's head, its first byte already read.
func (t *engineTransport) readHead(ctx context.Context, c net.Conn, host string, first byte, stop func() bool) (*http.Response, bool, error) {
	br := readers.Get().(*bufio.Reader)
	br.Reset(&firstByte{b: first, c: c})
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		br.Reset(nil)
		readers.Put(br)
		return fail(ctx, c, stop, false, err)
	}
	resp.Body = &engineBody{t: t, src: resp.Body, br: br, c: c, host: host, stop: stop, keep: !resp.Close}
	return resp, false, nil
}

// firstByte reads b, then c.
type firstByte struct {
	b    byte
	done bool
	c    net.Conn
}

func (f *firstByte) Read(p []byte) (int, error) {
	if !f.done && len(p) > 0 {
		f.done = true
		p[0] = f.b
		return 1, nil
	}
	return f.c.Read(p)
}

// engineBody is an answer's body: read to its end, its connection goes
// back to the pool; closed before, the connection is closed.
type engineBody struct {
	t    *engineTransport
	src  io.ReadCloser
	br   *bufio.Reader
	c    net.Conn
	host string
	stop func() bool
	keep bool
	done bool
}

func (b *engineBody) Read(p []byte) (int, error) {
	if b.done {
		return 0, io.EOF
	}
	n, err := b.src.Read(p)
	if err == io.EOF {
		b.release(true)
	} else if err != nil {
		b.release(false)
	}
	return n, err
}

// Close never reads what is left (http.ReadResponse's body would): an
// unfinished answer's connection is closed instead.
func (b *engineBody) Close() error {
	if !b.done {
		b.release(false)
	}
	return nil
}

func (b *engineBody) release(reuse bool) {
	b.done = true
	stopped := b.stop()
	reuse = reuse && stopped && b.keep && b.br.Buffered() == 0
	b.br.Reset(nil)
	readers.Put(b.br)
	b.br = nil
	if reuse {
		b.t.put(b.host, b.c)
		return
	}
	b.c.Close()
}

// get returns a kept-alive connection to host, or a new one.
func (t *engineTransport) get(ctx context.Context, host string) (net.Conn, bool, error) {
	now := time.Now()
	t.mu.Lock()
	for cs := t.idle[host]; len(cs) > 0; cs = t.idle[host] {
		ic := cs[len(cs)-1]
		t.idle[host] = cs[:len(cs)-1]
		if now.Sub(ic.since) < t.idleTimeout {
			t.mu.Unlock()
			return ic.c, true, nil
		}
		ic.c.Close()
	}
	t.mu.Unlock()
	c, err := t.dialer.DialContext(ctx, "tcp", host)
	if err != nil {
		return nil, false, err
	}
	return c, false, nil
}

// put keeps c for the next request to host.
func (t *engineTransport) put(host string, c net.Conn) {
	t.mu.Lock()
	defer t.mu.Unlock()
	cs := t.idle[host]
	if len(cs) >= t.maxIdle {
		c.Close()
		return
	}
	t.idle[host] = append(cs, idleConn{c: c, since: time.Now()})
	if t.reap == nil {
		t.reap = time.AfterFunc(t.idleTimeout, t.reapIdle)
	}
}

// reapIdle closes the connections idle past the timeout, and runs again
// while any are kept.
func (t *engineTransport) reapIdle() {
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	for host, cs := range t.idle {
		i := 0
		for i < len(cs) && now.Sub(cs[i].since) >= t.idleTimeout {
			cs[i].c.Close()
			i++
		}
		if i == len(cs) {
			delete(t.idle, host)
			continue
		}
		t.idle[host] = append(cs[:0], cs[i:]...)
	}
	if len(t.idle) == 0 {
		t.reap = nil
		return
	}
	t.reap.Reset(t.idleTimeout / 2)
}

// closeIdle closes the kept-alive connections.
func (t *engineTransport) closeIdle() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for host, cs := range t.idle {
		for _, ic := range cs {
			ic.c.Close()
		}
		delete(t.idle, host)
	}
}
