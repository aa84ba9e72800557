package realengine

import (
	"bytes"
	"context"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
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

// Run starts path with args (env added to this process's environment) as
// Start does and returns its command.
func Run(t testing.TB, path string, args, env []string, ready string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(path, args...)
	if env != nil {
		cmd.Env = append(cmd.Environ(), env...)
	}
	return Start(t, cmd, ready).Cmd
}

// Process is a program a test started with Start.
type Process struct {
	Cmd *exec.Cmd
	// Done is closed once the process has exited.
	Done <-chan struct{}
	out  *syncBuffer
}

// Output is what the process has written so far (stdout and stderr).
func (p *Process) Output() string { return p.out.String() }

// Start starts cmd in a process group of its own and waits up to 20 s
// until a GET of ready answers 200 (no wait when ready is empty). The
// whole group (the runners `ollama serve` starts included) is killed when
// t ends, and the output logged if t failed; it fails t if the process
// exits before it is ready. cmd's output goes to Output.
func Start(t testing.TB, cmd *exec.Cmd, ready string) *Process {
	t.Helper()
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", cmd.Path, err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	p := &Process{Cmd: cmd, Done: done, out: out}
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
		if t.Failed() {
			t.Logf("%s output:\n%s", strings.Join(cmd.Args, " "), out.String())
		}
	})
	if ready == "" {
		return p
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, ready, nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p
			}
		}
		select {
		case <-done:
			t.Fatalf("%s exited before it was ready:\n%s", cmd.Path, out.String())
		case <-ctx.Done():
			t.Fatalf("%s not ready in 20s (GET %s):\n%s", cmd.Path, ready, out.String())
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
