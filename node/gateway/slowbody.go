package gateway

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"time"
)

// ServerLimits bound what slow clients can hold on the gateway's port:
// a client that sends its headers or its body a byte at a time would
// otherwise keep a connection, a goroutine and a request slot for as long
// as it likes. Zero values take the defaults named.
type ServerLimits struct {
	// ReadHeaderTimeout bounds the TLS handshake and the request headers
	// (default 10s, the API port's).
	ReadHeaderTimeout time.Duration
	// BodyTimeout and BodyRate give each request body its deadline from
	// the moment its headers are read: BodyTimeout plus its size over
	// BodyRate (defaults 30s, the API port's, and 64 KiB/s: a 4 MiB body,
	// the gateway's largest by default, has 94s). A body of unknown size
	// (chunked) earns time as its bytes arrive at that rate. Past it the
	// read fails, the request is answered with an error and the connection
	// closed.
	BodyTimeout time.Duration
	BodyRate    int64
	// MaxUnfinishedBodies bounds the requests of one client address whose
	// body is still arriving (default 32); one more is refused at once
	// with 429 and its connection closed, its body unread.
	MaxUnfinishedBodies int
	// IdleTimeout closes a kept-alive connection that sends no new
	// request (default 2m).
	IdleTimeout time.Duration
	// Exempt, when set, names the requests no body deadline or bound
	// applies to: other nodes forwarding (their bodies arrive whole from
	// memory, many at once over one connection).
	Exempt func(*http.Request) bool
}

func (l *ServerLimits) defaults() {
	if l.ReadHeaderTimeout <= 0 {
		l.ReadHeaderTimeout = 10 * time.Second
	}
	if l.BodyTimeout <= 0 {
		l.BodyTimeout = 30 * time.Second
	}
	if l.BodyRate <= 0 {
		l.BodyRate = 64 << 10
	}
	if l.MaxUnfinishedBodies <= 0 {
		l.MaxUnfinishedBodies = 32
	}
	if l.IdleTimeout <= 0 {
		l.IdleTimeout = 2 * time.Minute
	}
}

// maxHeaderBytes caps a request's headers, as on the API port.
const maxHeaderBytes = 64 << 10

// NewServer returns the http.Server of the gateway's port serving h, with
// the header and idle timeouts and the body limits of l. There is no write
// timeout: answers stream for as long as they take.
func NewServer(h http.Handler, l ServerLimits) *http.Server {
	l.defaults()
	return &http.Server{
		Handler:           LimitBodies(h, l),
		ReadHeaderTimeout: l.ReadHeaderTimeout,
		IdleTimeout:       l.IdleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
	}
}

// LimitBodies gives every request body of h its deadline and bounds the
// unfinished bodies of each client address (ServerLimits).
func LimitBodies(h http.Handler, l ServerLimits) http.Handler {
	l.defaults()
	b := &bodyLimiter{next: h, limits: l, open: map[string]int{}}
	return b
}

type bodyLimiter struct {
	next   http.Handler
	limits ServerLimits

	mu sync.Mutex
	// open counts the unfinished bodies by client address.
	open map[string]int
}

func (b *bodyLimiter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 || (b.limits.Exempt != nil && b.limits.Exempt(r)) {
		b.next.ServeHTTP(w, r)
		return
	}
	client := clientAddr(r)
	release, ok := b.take(client)
	if !ok {
		// Its body is left unread: the server's drain of it after the
		// answer must not wait for a trickle either.
		_ = http.NewResponseController(w).SetReadDeadline(time.Now())
		w.Header().Set("Connection", "close")
		w.Header().Set("Retry-After", "1")
		errorf(http.StatusTooManyRequests, "rate_limit_error", "too_many_unfinished_bodies",
			"%s already has %d requests whose body is still arriving: send a body whole before starting another",
			client, b.limits.MaxUnfinishedBodies).write(w)
		return
	}
	defer release()
	rc := http.NewResponseController(w)
	start := time.Now()
	limit := b.limits.BodyTimeout + rateTime(max(r.ContentLength, 0), b.limits.BodyRate)
	if rc.SetReadDeadline(start.Add(limit)) != nil {
		// A connection without deadlines (none of net/http's): the
		// bound on unfinished bodies still holds.
		b.next.ServeHTTP(w, r)
		return
	}
	r.Body = &slowBody{ReadCloser: r.Body, rc: rc, start: start, limit: limit, size: r.ContentLength,
		limits: &b.limits, release: release}
	b.next.ServeHTTP(w, r)
}

// take counts an unfinished body of client, if it may have one more; the
// release it returns, safe to call more than once, uncounts it.
func (b *bodyLimiter) take(client string) (func(), bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.open[client] >= b.limits.MaxUnfinishedBodies {
		return nil, false
	}
	b.open[client]++
	return sync.OnceFunc(func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.open[client]--; b.open[client] <= 0 {
			delete(b.open, client)
		}
	}), true
}

// clientAddr is the address a request came from, without its port.
func clientAddr(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// rateTime is how long n bytes take at rate bytes a second.
func rateTime(n, rate int64) time.Duration {
	return time.Duration(float64(n) / float64(rate) * float64(time.Second))
}

// ErrBodyTimeout is the read error of a request body that did not arrive
// within its deadline.
var ErrBodyTimeout = errors.New("request body timeout")

// slowBody is a request body under its deadline. The deadline is lifted
// when the body ends, so that an answer streamed for long is not cut (it is
// a read deadline, never a write one); a failed read keeps it, so that the
// server's own read of what is left of the body does not wait for the
// trickle either.
type slowBody struct {
	io.ReadCloser
	rc     *http.ResponseController
	start  time.Time
	limit  time.Duration
	size   int64
	read   int64
	limits *ServerLimits
	// release uncounts the body from its client's unfinished ones.
	release func()
	ended   bool
}

func (b *slowBody) Read(p []byte) (int, error) {
	if b.ended {
		return b.ReadCloser.Read(p)
	}
	n, err := b.ReadCloser.Read(p)
	b.read += int64(n)
	switch {
	case err == io.EOF:
		b.ended = true
		_ = b.rc.SetReadDeadline(time.Time{})
		b.release()
	case err != nil:
		b.ended = true
		b.release()
		if errors.Is(err, os.ErrDeadlineExceeded) {
			err = fmt.Errorf("%w: %d bytes arrived in %s, the limit for this body (%s, and 1s per %d KiB)",
				ErrBodyTimeout, b.read, time.Since(b.start).Round(time.Millisecond), b.limits.BodyTimeout, b.limits.BodyRate>>10)
		}
	case b.size < 0:
		// A chunked body earns time as it arrives; the deadline moves
		// once it has earned a second, not at every read.
		if earned := b.limits.BodyTimeout + rateTime(b.read, b.limits.BodyRate); earned-b.limit >= time.Second {
			b.limit = earned
			_ = b.rc.SetReadDeadline(b.start.Add(earned))
		}
	}
	return n, err
}
