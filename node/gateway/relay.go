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
	"time"

	"github.com/gpuplane/gpuplane/node/gateway/queue"
)

// relayStream copies an engine's event stream to the client, flushing each
// event, reporting the tokens to the scheduler as they come, with the
// client's model name put back (rn, nil: none). A preempted stream ends
// with an error event.
func (g *Gateway) relayStream(ctx context.Context, w http.ResponseWriter, resp *http.Response, req *request, m *Model, labels []string, pd *pending, c *card, rn *rename) result {
	sw := newStallWriter(w, g.opts.StreamStall)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	br := bufio.NewReaderSize(resp.Body, 8<<10)
	generated, reported := 0, 0
	var first time.Time
	var readErr error
	for {
		line, err := br.ReadSlice('\n')
		if len(line) > 0 {
			if _, werr := sw.Write(rn.apply(line)); werr != nil {
				readErr = werr
				break
			}
			if n := tokensIn(line); n > 0 {
				generated += n
				if first.IsZero() {
					first = time.Now()
					g.metrics.firstToken(labels, first.Sub(req.arrived))
				}
				// Tokens are charged every few: the counters lag by at
				// most progressEvery tokens per stream, and the card's
				// lock is taken a quarter as often.
				if generated-reported >= progressEvery {
					reported = generated
					c.mu.Lock()
					if pd.end == nil && pd.cut != pd.attempt {
						_ = c.s.Progress(pd.id, generated)
					}
					c.mu.Unlock()
				}
			}
			// An event goes out when it ends, unless the next one is
			// already here: then they go out together, at once.
			if br.Buffered() == 0 && len(bytes.TrimSpace(line)) == 0 {
				if readErr = sw.flush(); readErr != nil {
					break
				}
			}
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				readErr = err
			}
			break
		}
	}
	if readErr == nil {
		readErr = sw.flush()
	}
	if sw.stalled {
		// The client stopped reading: its engine request is cancelled
		// (the engine's stream is closed on return), freeing the slot.
		g.log.Info("gateway: a stream's client stopped reading; cut off", "model", m.Served, "tenant", req.who.tenant, "stall", g.opts.StreamStall, "tokens", generated)
		c.mu.Lock()
		if pd.cancel != nil {
			pd.cancel(errClientStalled)
		}
		c.mu.Unlock()
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
	c.mu.Unlock()
	if cut && readErr != nil && !sw.stalled {
		writePreempted(w, m, generated)
	}
	return result{done: true, generated: generated, first: first, whole: readErr == nil}
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
