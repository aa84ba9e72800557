package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/gpuplane/gpuplane/node/gateway/queue"
)

// streamReadAhead bounds how much of an engine's stream the gateway reads
// ahead of a client that takes it slower than the engine writes it: a
// stream whose client is at most this far behind when the engine ends
// hands the engine back (its llama.cpp slot, its place in the scheduler)
// at once, not when the client has read the rest.
const streamReadAhead = 1 << 20

// relayStream copies an engine's event stream to the client, flushing each
// event, reporting the tokens to the scheduler as they come, with the
// client's model name put back (rn, nil: none). A preempted stream ends
// with an error event. The engine's stream is read ahead of the client
// (up to streamReadAhead): once it has been read to its end, ended is
// called and the request finishes with the scheduler, before the client
// has the rest, so the next request does not wait for a slow client.
func (g *Gateway) relayStream(ctx context.Context, w http.ResponseWriter, resp *http.Response, req *request, m *Model, labels []string, pd *pending, c *card, rn *rename, ended func()) result {
	sw := newStallWriter(w, g.opts.StreamStall)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	// A stream waits for its first token here, in its handler alone (no
	// goroutine of its own yet: bench/gateway's idle-stream memory).
	br := bufio.NewReaderSize(resp.Body, 8<<10)
	_, peekErr := br.Peek(1)
	a := newAhead()
	filled := make(chan struct{})
	go func() {
		defer close(filled)
		a.fill(br, peekErr, func(generated int) {
			// Tokens are charged every few: the counters lag by at most
			// progressEvery tokens per stream, and the card's lock is
			// taken a quarter as often.
			c.mu.Lock()
			if pd.end == nil && pd.cut != pd.attempt {
				_ = c.s.Progress(pd.id, generated)
			}
			c.mu.Unlock()
		}, func(generated int) {
			// The engine is done with the request: its slot is free, and
			// so is its place, before the client has the rest.
			ended()
			now := time.Now()
			c.mu.Lock()
			if pd.end == nil && pd.cut != pd.attempt {
				if out, err := c.s.Finish(pd.id, generated, now); err == nil {
					c.apply(out, now)
				}
			}
			c.mu.Unlock()
		})
	}()
	generated := 0
	var first time.Time
	// readErr: the stream did not reach its client whole (the engine's
	// read or the client's write failed: writeErr).
	var readErr, writeErr error
	var batch []streamPiece
	for {
		var done bool
		batch, done, readErr = a.take(batch[:0])
		for i, p := range batch {
			if _, writeErr = sw.Write(rn.apply(p.b)); writeErr != nil {
				break
			}
			if p.tokens > 0 {
				generated += p.tokens
				if first.IsZero() {
					first = time.Now()
					g.metrics.firstToken(labels, first.Sub(req.arrived))
				}
			}
			// An event goes out when it ends, unless the next one is
			// already here: then they go out together, at once.
			if i == len(batch)-1 && !p.more && len(bytes.TrimSpace(p.b)) == 0 {
				if writeErr = sw.flush(); writeErr != nil {
					break
				}
			}
		}
		if done || readErr != nil || writeErr != nil {
			break
		}
	}
	if readErr == nil && writeErr == nil {
		writeErr = sw.flush()
	}
	if writeErr != nil {
		readErr = writeErr
	}
	if sw.stalled {
		// The client stopped reading: its engine request is cancelled
		// below, freeing the slot.
		g.log.Info("gateway: a stream's client stopped reading; cut off", "model", m.Served, "tenant", req.who.tenant, "stall", g.opts.StreamStall, "tokens", generated)
	} else {
		sw.clear()
	}
	now := time.Now()
	if generated > 1 {
		g.metrics.perToken(labels, now.Sub(first)/time.Duration(generated-1))
	}
	g.metrics.servedTokens(labels, req.promptTokens, generated)
	c.mu.Lock()
	cut := pd.cut == pd.attempt
	if pd.end == nil && !cut {
		var out queue.Output
		var err error
		if readErr != nil && ctx.Err() != nil {
			out, err = c.s.Cancel(pd.id, now)
		} else {
			out, err = c.s.Finish(pd.id, generated, now)
		}
		if err == nil {
			c.apply(out, now)
		}
	}
	if writeErr != nil && pd.cancel != nil {
		// The client's stream ended early: the engine's, if it is still
		// being read, is cut (the read ahead stops).
		cause := errClientGone
		if sw.stalled {
			cause = errClientStalled
		}
		pd.cancel(cause)
	}
	c.mu.Unlock()
	a.close()
	<-filled
	if cut && readErr != nil && !sw.stalled {
		writePreempted(w, m, generated)
	}
	return result{done: true, generated: generated, first: first, whole: readErr == nil}
}

// streamPiece is a line of an engine's stream (or a piece of one longer
// than the read buffer), as read ahead of the client.
type streamPiece struct {
	b []byte
	// tokens is the generated tokens it carries; more: more of the
	// engine's stream had already come when it was read.
	tokens int
	more   bool
}

// ahead is an engine's stream read ahead of its client: one goroutine
// fills it (fill), the client's handler takes from it (take).
type ahead struct {
	mu   sync.Mutex
	cond sync.Cond
	// queued is what has been read and not yet taken, size its bytes.
	queued []streamPiece
	size   int
	// ended: the engine's stream has been read to its end (err: how it
	// ended, nil at EOF); closed: the client's handler takes no more.
	ended  bool
	err    error
	closed bool
}

func newAhead() *ahead {
	a := &ahead{}
	a.cond.L = &a.mu
	return a
}

// fill reads br into a, counting its tokens: progress is called every
// progressEvery of them, whole with their number once br has been read to
// its end (not after a failed read, nor if the client's handler stopped
// taking). peekErr: br's first read failed with it (a bufio.Reader
// reports an error once).
func (a *ahead) fill(br *bufio.Reader, peekErr error, progress, whole func(generated int)) {
	generated, reported := 0, 0
	for {
		var line []byte
		err := peekErr
		if err == nil {
			line, err = br.ReadSlice('\n')
		}
		if len(line) > 0 {
			p := streamPiece{b: bytes.Clone(line), tokens: tokensIn(line), more: br.Buffered() > 0}
			a.mu.Lock()
			for a.size >= streamReadAhead && !a.closed {
				a.cond.Wait()
			}
			if a.closed {
				a.mu.Unlock()
				return
			}
			a.queued = append(a.queued, p)
			a.size += len(p.b)
			a.cond.Broadcast()
			a.mu.Unlock()
			if p.tokens > 0 {
				generated += p.tokens
				if generated-reported >= progressEvery {
					reported = generated
					progress(generated)
				}
			}
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = nil
			}
			a.mu.Lock()
			a.ended, a.err = true, err
			closed := a.closed
			a.cond.Broadcast()
			a.mu.Unlock()
			if err == nil && !closed {
				whole(generated)
			}
			return
		}
	}
}

// take appends what has been read to buf, waiting for some if there is
// none yet; done: that is all of it, err how the engine's stream ended.
func (a *ahead) take(buf []streamPiece) (_ []streamPiece, done bool, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for len(a.queued) == 0 && !a.ended {
		a.cond.Wait()
	}
	buf = append(buf, a.queued...)
	clear(a.queued)
	a.queued, a.size = a.queued[:0], 0
	a.cond.Broadcast()
	if a.ended {
		return buf, true, a.err
	}
	return buf, false, nil
}

// close says the client's handler takes no more: the filling stops.
func (a *ahead) close() {
	a.mu.Lock()
	a.closed = true
	a.cond.Broadcast()
	a.mu.Unlock()
}

// rename replaces an answer's "model" field naming one model by another:
// the engine answers with the name it was sent (Ollama's tag), which the
// client did not ask for. The field is matched in the form every engine
// writes it, without spaces and escaped as Go's encoding/json does.
type rename struct{ from, to []byte }

func newRename(engine, served string) *rename {
	f, _ := json.Marshal(engine)
	t, _ := json.Marshal(served)
	return &rename{from: append([]byte(`"model":`), f...), to: append([]byte(`"model":`), t...)}
}

// apply returns b with the engine's name replaced; b itself when it has
// none, or when rn is nil.
func (rn *rename) apply(b []byte) []byte {
	if rn == nil || !bytes.Contains(b, rn.from) {
		return b
	}
	return bytes.ReplaceAll(b, rn.from, rn.to)
}

// writePreempted ends a stream with an error event saying it was
// preempted.
func writePreempted(w http.ResponseWriter, m *Model, generated int) {
	b, _ := json.Marshal(map[string]any{"error": map[string]any{
		"message": fmt.Sprintf("model %q: the stream was preempted by interactive work after %d tokens; retry later", m.Served, generated),
		"type":    "server_error", "param": nil, "code": "preempted",
	}})
	_, _ = fmt.Fprintf(w, "data: %s\n\n", b)
	if fl, ok := w.(http.Flusher); ok {
		fl.Flush()
	}
}

// tokenKeys are the delta fields whose non-empty string is a generated
// token: completion text, chat content, a reasoning model's thinking
// (vLLM's and llama.cpp's "reasoning_content", Ollama's and newer vLLM's
// "reasoning") and a tool call's streamed arguments.
var tokenKeys = [][]byte{[]byte(`"text"`), []byte(`"content"`), []byte(`"reasoning_content"`), []byte(`"reasoning"`), []byte(`"arguments"`)}

// tokensIn counts the generated tokens an SSE line carries: one per
// non-empty string of a tokenKeys field (an engine streams about a token
// per event). It scans bytes rather than decoding JSON: it runs per token.
func tokensIn(line []byte) int {
	data, ok := bytes.CutPrefix(line, []byte("data:"))
	if !ok {
		return 0
	}
	n := 0
	for _, key := range tokenKeys {
		rest := data
		for {
			i := bytes.Index(rest, key)
			if i < 0 {
				break
			}
			rest = bytes.TrimLeft(rest[i+len(key):], " \t")
			if len(rest) == 0 || rest[0] != ':' {
				continue
			}
			rest = bytes.TrimLeft(rest[1:], " \t")
			if len(rest) >= 2 && rest[0] == '"' && rest[1] != '"' {
				n++
			}
		}
	}
	return n
}

// errClientStalled is the cause an engine request is cancelled with when
// its client stopped reading the stream.
var errClientStalled = errors.New("the client stopped reading its stream")

// errClientGone is the cause an engine request is cancelled with when its
// stream could not be written to its client.
var errClientGone = errors.New("the client's stream could not be written")

// stallWriter writes an answer under a write deadline: a write or flush
// that cannot go out within stall (the client stopped reading and the
// connection's buffers are full) fails, and the stream is cut. The
// deadline is moved at most once a second (or a quarter of stall), not at
// every token.
type stallWriter struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	stall   time.Duration
	armed   time.Time
	stalled bool
}

func newStallWriter(w http.ResponseWriter, stall time.Duration) *stallWriter {
	return &stallWriter{w: w, rc: http.NewResponseController(w), stall: stall}
}

// arm moves the write deadline to stall from now, if it was set over a
// second (or a quarter of stall) ago.
func (s *stallWriter) arm() {
	now := time.Now()
	if now.Sub(s.armed) < min(time.Second, s.stall/4) {
		return
	}
	if s.rc.SetWriteDeadline(now.Add(s.stall)) == nil {
		s.armed = now
	}
}

func (s *stallWriter) Write(p []byte) (int, error) {
	s.arm()
	n, err := s.w.Write(p)
	if err != nil {
		s.stalled = s.stalled || errors.Is(err, os.ErrDeadlineExceeded)
	}
	return n, err
}

// flush sends what is buffered to the client.
func (s *stallWriter) flush() error {
	s.arm()
	err := s.rc.Flush()
	if errors.Is(err, http.ErrNotSupported) {
		return nil
	}
	if err != nil {
		// A write deadline past makes the connection's writes fail with
		// it; net/http's buffered writer may report it at the flush.
		s.stalled = s.stalled || errors.Is(err, os.ErrDeadlineExceeded) || !s.armed.IsZero() && time.Since(s.armed) >= s.stall
	}
	return err
}

// clear lifts the write deadline, so that the connection's next request
// (kept alive) is not cut by this one's.
func (s *stallWriter) clear() {
	if !s.armed.IsZero() {
		_ = s.rc.SetWriteDeadline(time.Time{})
	}
}
