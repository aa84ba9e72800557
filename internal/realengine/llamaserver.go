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
	base := "http://127.0.0.1:" + strconv.Itoa(port)
	args = append([]string{"--host", "127.0.0.1", "--port", strconv.Itoa(port), "--threads", "1", "--no-webui"}, args...)
	Run(t, bin, args, nil, base+"/health")
	return base
}

// Run starts path with args (env added to this process's environment) and
// waits up to 20 s until a GET of ready answers 200 (no wait when ready is
// empty). The process is killed when t ends, and its output logged if t
// failed; it fails t if the process exits before it is ready.
func Run(t testing.TB, path string, args, env []string, ready string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(path, args...)
	if env != nil {
		cmd.Env = append(cmd.Environ(), env...)
	}
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", path, err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-done
		if t.Failed() {
			t.Logf("%s %v output:\n%s", path, args, out.String())
		}
	})
	if ready == "" {
		return cmd
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, ready, nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return cmd
			}
		}
		select {
		case <-done:
			t.Fatalf("%s exited before it was ready:\n%s", path, out.String())
		case <-ctx.Done():
			t.Fatalf("%s not ready in 20s (GET %s):\n%s", path, ready, out.String())
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
