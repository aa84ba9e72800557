package gateway

import (
	"errors"
	"io"
	"sync/atomic"
)

// Request bodies are read into buffers that grow with what arrives: a
// Content-Length is only a client's word, and a buffer sized from it let
// one byte of body pin megabytes. All the bodies the gateway holds at once
// (being read, or waiting with their request) draw on one budget,
// Options.MaxBufferedBytes: past it a request is refused with 503 and its
// connection closed, whatever address it comes from.

// firstBodyBuffer is the buffer a body's first bytes are read into
// (smaller when its Content-Length says less).
const firstBodyBuffer = 1 << 10

// errBodyBudget is the read error of a body that would take the gateway
// past its budget of buffered bodies.
var errBodyBudget = errors.New("the gateway holds its limit of request bodies")

// bodyBudget bounds the bytes of request bodies held at once.
type bodyBudget struct {
	used atomic.Int64
	max  int64
}

// take reserves n bytes, if the budget has them.
func (b *bodyBudget) take(n int64) bool {
	if b.used.Add(n) > b.max {
		b.used.Add(-n)
		return false
	}
	return true
}

// give returns n bytes taken.
func (b *bodyBudget) give(n int64) {
	if n > 0 {
		b.used.Add(-n)
	}
}

// readBody reads a body to its end. Its buffer starts small and doubles as
// bytes arrive, never past size+1 when its size is known (-1: not; the one
// byte more lets the read that finds the end need no growth) nor past
// limit+1; each growth is taken from budget first. held is what the body
// holds of the budget (give it back when the request ends); on an error
// nothing is held.
func readBody(r io.Reader, size, limit int64, budget *bodyBudget) (body []byte, held int64, err error) {
	ceiling := limit + 1
	if size >= 0 && size < limit {
		ceiling = size + 1
	}
	capacity := min(int64(firstBodyBuffer), ceiling)
	if !budget.take(capacity) {
		return nil, 0, errBodyBudget
	}
	held = capacity
	b := make([]byte, 0, capacity)
	for {
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			return b, held, nil
		}
		if err != nil {
			budget.give(held)
			return nil, 0, err
		}
		if len(b) < cap(b) {
			continue
		}
		next := min(2*int64(cap(b)), max(ceiling, int64(cap(b))+1))
		if !budget.take(next - held) {
			budget.give(held)
			return nil, 0, errBodyBudget
		}
		held = next
		grown := make([]byte, len(b), next)
		copy(grown, b)
		b = grown
	}
}
