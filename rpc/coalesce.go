package rpc

import (
	"context"
	"net"
	"sync"
	"time"
)

// coalescingConn is a client connection whose writes leave from a goroutine
// of their own, so that what callers write while a write is on its way goes
// out together, in one system call. Go's HTTP/2 client flushes each frame it
// writes: a unary call's headers, then its body, each a write to the socket
// (and, on loopback, the kernel's delivery to the peer inside that call),
// while gRPC's transport queues frames and writes whatever has accumulated.
// Each write is a system call here and a wakeup of the server's reader;
// through this connection a call's headers and body leave in one write, and
// under load the frames of many calls do (bench/RESULTS.md, issue 17).
//
// Write copies p and returns at once; a write error is returned by the next
// Write (the HTTP/2 client then fails the connection's calls, as it does on
// any broken connection). Reads and deadlines are the connection's own.
type coalescingConn struct {
	net.Conn

	mu      sync.Mutex
	changed sync.Cond // pending shrank or the flush ended
	pending []byte    // written by callers, not yet sent
	spare   []byte    // a drained buffer, reused
	active  bool      // a flush goroutine runs
	err     error     // the first write error
	closed  bool
}

const (
	// maxPendingWrite bounds what callers may queue: past it Write waits,
	// as it would on a full socket buffer.
	maxPendingWrite = 1 << 20
	// keepWriteBuffer is the largest drained buffer kept for reuse.
	keepWriteBuffer = 64 << 10
	// closeFlushWait bounds how long Close lets queued bytes leave before
	// the connection closes under them (a peer that stopped reading).
	closeFlushWait = 5 * time.Second
)

func newCoalescingConn(c net.Conn) *coalescingConn {
	cc := &coalescingConn{Conn: c}
	cc.changed.L = &cc.mu
	return cc
}

func (c *coalescingConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.err == nil && !c.closed && len(c.pending) >= maxPendingWrite {
		c.changed.Wait()
	}
	switch {
	case c.err != nil:
		return 0, c.err
	case c.closed:
		return 0, net.ErrClosed
	}
	c.pending = append(c.pending, p...)
	if !c.active {
		c.active = true
		go c.flush()
	}
	return len(p), nil
}

// flush writes what is pending until nothing is, then ends; a Close that
// came meanwhile closes the connection once all has left.
func (c *coalescingConn) flush() {
	c.mu.Lock()
	for len(c.pending) > 0 && c.err == nil {
		out := c.pending
		c.pending, c.spare = c.spare[:0], nil
		c.mu.Unlock()
		_, err := c.Conn.Write(out)
		c.mu.Lock()
		if err != nil {
			c.err = err
		}
		if cap(out) <= keepWriteBuffer {
			c.spare = out[:0]
		}
		c.changed.Broadcast()
	}
	c.active = false
	if c.err != nil {
		c.pending = nil // never to be sent
	}
	c.changed.Broadcast()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		c.Conn.Close()
	}
}

// Close closes the connection once what was written has left, as closing a
// socket lets its send buffer drain; it returns at once.
func (c *coalescingConn) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return net.ErrClosed
	}
	c.closed = true
	active := c.active
	c.changed.Broadcast()
	c.mu.Unlock()
	if !active {
		return c.Conn.Close()
	}
	// The flush closes it when done; this closes it under a write that
	// cannot finish.
	time.AfterFunc(closeFlushWait, func() { c.Conn.Close() })
	return nil
}

// coalescingDialer dials TCP as http.DefaultTransport does and wraps each
// connection in a coalescingConn.
func coalescingDialer() func(ctx context.Context, network, addr string) (net.Conn, error) {
	d := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return newCoalescingConn(c), nil
	}
}
