// Package porttest hands out loopback ports to tests that must name a port
// before the server behind it starts (Raft peers, gossip, agents given
// --api-port): asking the kernel for port 0 and closing the listener is not
// enough, because `go test ./...` runs several test binaries at once and the
// kernel hands a released port to the next caller, often another binary.
//
// Free picks ports below Linux's ephemeral range (32768–60999 by default), so
// no outgoing connection or ":0" listener is given one, and holds a lock file
// per port (flock on $TMPDIR/gpuplane-porttest/PORT) until the test binary
// exits, so no other binary using this package, nor a later call in this
// one, gets the same port. A port is only handed out after a TCP and a UDP
// listener on it succeeded (gossip uses both).
package porttest

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
)

const (
	low  = 20000
	high = 32768 // exclusive: the kernel's ephemeral range starts here
)

var (
	mu   sync.Mutex
	held []*os.File // lock files, open for the life of the process
)

// Free returns a loopback port no other user of this package holds, free for
// TCP and UDP a moment ago.
func Free(t testing.TB) int {
	t.Helper()
	p, err := pick()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Addr is Free as "127.0.0.1:PORT".
func Addr(t testing.TB) string {
	t.Helper()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(Free(t)))
}

func pick() (int, error) {
	mu.Lock()
	defer mu.Unlock()
	dir := filepath.Join(os.TempDir(), "gpuplane-porttest")
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return 0, fmt.Errorf("porttest: %w", err)
	}
	for range 2000 {
		port := low + rand.IntN(high-low)
		f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(port)), os.O_CREATE|os.O_RDWR, 0o666)
		if err != nil {
			return 0, fmt.Errorf("porttest: %w", err)
		}
		// Another open file description of the same file, in this process
		// or another, cannot take the lock while f holds it.
		if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
			f.Close()
			continue
		}
		if !bindable(port) {
			f.Close() // closing releases the lock
			continue
		}
		held = append(held, f)
		return port, nil
	}
	return 0, fmt.Errorf("porttest: no free port in [%d, %d)", low, high)
}

func bindable(port int) bool {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return false
	}
	defer l.Close()
	u, err := net.ListenPacket("udp", addr)
	if err != nil {
		return false
	}
	u.Close()
	return true
}
