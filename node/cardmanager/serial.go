package cardmanager

import (
	"context"
	"sync"
)

// serial runs functions one after the other, in the order given; do never
// blocks.
type serial struct {
	mu   sync.Mutex
	q    []func()
	wake chan struct{}
}

func newSerial() *serial { return &serial{wake: make(chan struct{}, 1)} }

func (s *serial) do(f func()) {
	s.mu.Lock()
	s.q = append(s.q, f)
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *serial) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.wake:
		}
		for {
			s.mu.Lock()
			if len(s.q) == 0 {
				s.mu.Unlock()
				break
			}
			f := s.q[0]
			s.q = s.q[1:]
			s.mu.Unlock()
			f()
		}
	}
}
