package rpc

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// tcpPair returns the two ends of a loopback TCP connection, the client's
// wrapped in a coalescingConn.
func tcpPair(t *testing.T) (*coalescingConn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	c, err := coalescingDialer()(t.Context(), "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s := <-accepted
	if s == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { s.Close() })
	return c.(*coalescingConn), s
}

// Many writers, each writing numbered records under a lock (as the HTTP/2
// client writes frames): the peer reads every byte, each writer's records in
// order, and nothing else.
func TestCoalescingConnDeliversEveryWriteInOrder(t *testing.T) {
	c, s := tcpPair(t)
	const writers, records = 16, 500
	var want bytes.Buffer
	var mu sync.Mutex
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range records {
				rec := fmt.Appendf(nil, "w%02d-%04d;", w, i)
				mu.Lock()
				want.Write(rec)
				_, err := c.Write(rec)
				mu.Unlock()
				if err != nil {
					t.Errorf("write: %v", err)
					return
				}
			}
		})
	}
	got := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(s)
		got <- b
	}()
	wg.Wait()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case b := <-got:
		if !bytes.Equal(b, want.Bytes()) {
			t.Fatalf("peer read %d bytes, want the %d written, in order", len(b), want.Len())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("peer did not see the connection close after the data")
	}
	if _, err := c.Write([]byte("late")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("write after close: %v, want net.ErrClosed", err)
	}
}

// A write that fails (the connection is gone) is reported by the next Write,
// and every one after it.
func TestCoalescingConnReportsWriteErrors(t *testing.T) {
	c, _ := tcpPair(t)
	c.Conn.Close() // under the wrapper: its next write fails
	if _, err := c.Write([]byte("first")); err != nil {
		t.Fatalf("first write is queued, got %v", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := c.Write([]byte("more"))
		if err != nil {
			if _, again := c.Write([]byte("again")); again == nil {
				t.Fatal("a later write succeeded after a write error")
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("writes on a closed connection never failed")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
