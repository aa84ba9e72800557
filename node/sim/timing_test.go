package sim

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The first token is due at prefill + one token of the engine's model, and
// a late timer (the Go runtime wakes timers at millisecond granularity, an
// engine on a busy machine later still) must not add to it: the prefill
// counts from the request's admission and decoding from the prefill's end.
// Both are checked without a clock: work already due is done without
// waiting, so a request whose context is gone still gets it.
func TestSimCountsWorkFromWhenItWasDue(t *testing.T) {
	s := newServer(Config{ServedModelName: "chat", TokensPerSecond: 10, PrefillTokensPerSecond: 100}, context.Background())
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(errAborted)
	// Admitted 10 s ago: its 100-token prompt took 1 s, and 9 s of
	// decoding at 10 tokens/s have passed since.
	rq := &request{ctx: ctx, cancel: cancel, admitted: time.Now().Add(-10 * time.Second)}
	if err := s.prefill(rq, 100); err != nil {
		t.Fatalf("prefill of a prompt due 9 s ago: %v, want it done without waiting", err)
	}
	if d := time.Since(rq.decodeFrom); d < 8*time.Second || d > 10*time.Second {
		t.Fatalf("decoding began %s ago, want 9 s (when the prompt was done)", d)
	}
	emitted := 0
	if err := s.generate(rq, 200, func(int) { emitted++ }); !errors.Is(err, errAborted) {
		t.Fatalf("generate: %v, want it cut off after the tokens due", err)
	}
	if emitted < 80 || emitted > 100 {
		t.Fatalf("emitted %d tokens without waiting, want the 90 due (9 s at 10 tokens/s)", emitted)
	}
	// The first token was due one token (0.1 s) after the prefill.
	if d := rq.firstDue.Sub(rq.decodeFrom); d < 99*time.Millisecond || d > 101*time.Millisecond {
		t.Fatalf("first token due %s after the prefill, want 100ms", d)
	}
}

// A streamed answer tells when the engine received the request and wrote
// its first token, so that a client can tell the engine's part of its
// TTFT from the path to and from it; the engine's part is never shorter
// than its model's prefill and first token.
func TestSimStreamStampsItsPartOfTheFirstToken(t *testing.T) {
	addrc := make(chan net.Addr, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Config{Host: "127.0.0.1", ServedModelName: "chat", MemoryMiB: 1024,
			TokensPerSecond: 20, PrefillTokensPerSecond: 100, Ready: func(a net.Addr) { addrc <- a }})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	base := "http://" + (<-addrc).String()
	deadline := time.Now().Add(30 * time.Second)
	for get(t, base+"/health") != http.StatusOK {
		if time.Now().After(deadline) {
			t.Fatal("/health never answered 200")
		}
		time.Sleep(20 * time.Millisecond)
	}
	sent := time.Now()
	// 10 prompt words at 100 tokens/s, then one token at 20/s: 150 ms.
	resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"a b c d e f g h i j","max_tokens":2,"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || !strings.HasSuffix(string(body), "data: [DONE]\n\n") {
		t.Fatalf("stream: %s %q %v", resp.Status, body, err)
	}
	recv, err1 := strconv.ParseInt(resp.Header.Get(HeaderReceived), 10, 64)
	due, err2 := strconv.ParseInt(resp.Header.Get(HeaderFirstTokenDue), 10, 64)
	first, err3 := strconv.ParseInt(resp.Header.Get(HeaderFirstToken), 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		t.Fatalf("headers %v: want %s, %s and %s in Unix nanoseconds", resp.Header, HeaderReceived, HeaderFirstTokenDue, HeaderFirstToken)
	}
	if due > first {
		t.Fatalf("first token due at %d, written at %d: it cannot be written before it is due", due, first)
	}
	if recv < sent.UnixNano() || recv > time.Now().UnixNano() {
		t.Fatalf("received at %d, want between the send (%d) and now", recv, sent.UnixNano())
	}
	if own := time.Duration(due - recv); own < 150*time.Millisecond {
		t.Fatalf("engine's part of the first token %s, want at least its model's 150 ms", own)
	}
}
