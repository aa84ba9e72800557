package executor

import (
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
)

// Engine ports come from a range the executor tracks, above Linux's
// default ephemeral range (32768-60999), so that the kernel does not hand
// one out as another connection's local port, and above the ports tests
// reserve (internal/porttest, 20000-32767). Asking the kernel for a free
// port and closing it raced: engines starting together could be told the
// same port before any of them listened on it.
const (
	DefaultPortFirst = 61000
	DefaultPortLast  = 65535
)

// portRange hands out engine ports: each to one replica at a time, and
// only one nothing else listens on when handed out.
type portRange struct {
	first, last int
	mu          sync.Mutex
	next        int
	held        map[int]key
}

// newPortRange starts handing out ports at a random place in the range:
// several agents on one host (tests, hollow nodes) each track only their
// own engines, and starting all of them at first would make them probe and
// hand out the same few ports, so one agent's readiness check could reach
// another's engine.
func newPortRange(first, last int) *portRange {
	return &portRange{first: first, last: last, next: first + rand.IntN(last-first+1), held: map[int]key{}}
}

// take gives k a port for an engine listening on host, releasing the one k
// held before (its previous engine is gone when it starts another).
func (p *portRange) take(k key, host string) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.releaseLocked(k)
	n := p.last - p.first + 1
	for range n {
		port := p.next
		p.next++
		if p.next > p.last {
			p.next = p.first
		}
		if _, busy := p.held[port]; busy || !bindable(host, port) {
			continue
		}
		p.held[port] = k
		return port, nil
	}
	return 0, fmt.Errorf("no free engine port in %d-%d: %d held by this node's engines, the rest in use", p.first, p.last, len(p.held))
}

// hold records that k's adopted engine listens on port.
func (p *portRange) hold(k key, port int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.held[port] = k
}

// release frees k's port once its supervisor is gone.
func (p *portRange) release(k key) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.releaseLocked(k)
}

func (p *portRange) releaseLocked(k key) {
	for port, owner := range p.held {
		if owner == k {
			delete(p.held, port)
		}
	}
}

// bindable says whether nothing else listens on host:port now.
func bindable(host string, port int) bool {
	ln, err := net.Listen("tcp", net.JoinHostPort(host, itoa(port)))
	if err != nil {
		return false
	}
	ln.Close()
	return true
}
