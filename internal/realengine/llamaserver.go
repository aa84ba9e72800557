package realengine

import (
	"bytes"
	"context"
	"net/http"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/internal/porttest"
)

// StartLlamaServer runs llama-server with args (a model, adapters, slots…)
// on a free loopback port with one thread, waits until /health answers 200
// and returns its base URL ("http://127.0.0.1:PORT"). The process is killed
// when t ends; its output is logged if t failed.
func StartLlamaServer(t testing.TB, args ...string) string {
	t.Helper()
	bin := LlamaServer(t)
	port := porttest.Free(t)
	args = append([]string{"--host", "127.0.0.1", "--port", strconv.Itoa(port), "--threads", "1", "--no-webui"}, args...)
	cmd := exec.Command(bin, args...)
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-done
		if t.Failed() {
			t.Logf("llama-server %v output:\n%s", args, out.String())
		}
	})
	base := "http://127.0.0.1:" + strconv.Itoa(port)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/health", nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return base
			}
		}
		select {
		case <-done:
			t.Fatalf("llama-server exited before it was ready:\n%s", out.String())
		case <-ctx.Done():
			t.Fatalf("llama-server not ready in 20s:\n%s", out.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
