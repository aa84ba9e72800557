//go:build linux

package jepsen

import (
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// DelayProxy forwards TCP connections to one target and holds every chunk of
// data for a configurable delay (plus jitter) in each direction, keeping
// order. The kernel here has no netem qdisc, so this is how the nemesis slows
// the Raft links: each server's outgoing Raft connections are DNATed to the
// proxy of their destination.
type DelayProxy struct {
	ln     net.Listener
	target string
	// delay and jitter in nanoseconds; 0 forwards at once.
	delay, jitter atomic.Int64
	// Accepted counts the connections forwarded (the proof that the Raft
	// links really pass through the proxy).
	Accepted atomic.Int64

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// NewDelayProxy listens on listen (an address on the test bridge) and
// forwards to target.
func NewDelayProxy(listen, target string) (*DelayProxy, error) {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, err
	}
	p := &DelayProxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.accept)
	return p, nil
}

// SetDelay sets the one-way delay of every chunk from now on: d plus a
// uniformly random extra up to jitter.
func (p *DelayProxy) SetDelay(d, jitter time.Duration) {
	p.delay.Store(int64(d))
	p.jitter.Store(int64(jitter))
}

func (p *DelayProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.Accepted.Add(1)
		p.wg.Go(func() { p.serve(c) })
	}
}

func (p *DelayProxy) track(c net.Conn, add bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conns == nil {
		return false
	}
	if add {
		p.conns[c] = struct{}{}
	} else {
		delete(p.conns, c)
	}
	return true
}

func (p *DelayProxy) serve(in net.Conn) {
	out, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		in.Close()
		return
	}
	if !p.track(in, true) || !p.track(out, true) {
		in.Close()
		out.Close()
		return
	}
	var wg sync.WaitGroup
	wg.Go(func() { p.pipe(out, in) })
	wg.Go(func() { p.pipe(in, out) })
	wg.Wait()
	p.track(in, false)
	p.track(out, false)
}

type chunk struct {
	data []byte
	due  time.Time
}

// pipe copies src to dst, delivering each chunk no earlier than its due
// time; when either side fails both are closed.
func (p *DelayProxy) pipe(dst, src net.Conn) {
	q := make(chan chunk, 4096)
	var wg sync.WaitGroup
	wg.Go(func() {
		defer dst.Close()
		for c := range q {
			if d := time.Until(c.due); d > 0 {
				time.Sleep(d)
			}
			if _, err := dst.Write(c.data); err != nil {
				src.Close()
				for range q {
				}
				return
			}
		}
	})
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			d := time.Duration(p.delay.Load())
			if j := p.jitter.Load(); j > 0 {
				d += time.Duration(rand.Int64N(j))
			}
			q <- chunk{data: append([]byte(nil), buf[:n]...), due: time.Now().Add(d)}
		}
		if err != nil {
			if err != io.EOF {
				dst.Close()
			}
			break
		}
	}
	close(q)
	wg.Wait()
}

// Close stops listening and closes every forwarded connection.
func (p *DelayProxy) Close() {
	p.ln.Close()
	p.mu.Lock()
	conns := p.conns
	p.conns = nil
	p.mu.Unlock()
	for c := range conns {
		c.Close()
	}
	p.wg.Wait()
}
