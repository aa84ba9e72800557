package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/gpuplane/gpuplane/internal/porttest"
	"github.com/gpuplane/gpuplane/internal/testbin"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
	"github.com/gpuplane/gpuplane/proto/gpuplane/v1/gpuplanev1connect"
	"github.com/gpuplane/gpuplane/rpc"
)

// bin is the gpuplane binary TestMain built; skipReason says why there is
// none.
var bin, skipReason string

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "gpuplane-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	if err := buildBinary(filepath.Join(dir, "gpuplane")); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	return m.Run()
}

// buildBinary builds ./cmd/gpuplane from the module root into out, or sets
// skipReason when there is no go command to build it with.
func buildBinary(out string) error {
	if _, err := exec.LookPath("go"); err != nil {
		skipReason = "no go command on PATH to build the gpuplane binary"
		return nil
	}
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return errors.New("cannot locate the module root")
	}
	root := filepath.Join(filepath.Dir(file), "..", "..", "..")
	if err := testbin.BuildTo(root, out); err != nil {
		return err
	}
	bin = out
	return nil
}

func requireBinary(t *testing.T) {
	t.Helper()
	if bin == "" {
		t.Skip(skipReason)
	}
}

// syncBuffer collects a process's output while it runs.
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

// agentProc is one `gpuplane agent --dev` process. Its flags stay the same
// across restarts, as a user's would.
type agentProc struct {
	t       *testing.T
	dataDir string
	ports   [3]int // API, Raft, gossip
	// flags are added to every start, such as --sim-gpus.
	flags []string
	// mode replaces --dev when set, e.g. --server --bootstrap-expect 1.
	mode []string
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{}
}

// newAgent picks free ports for an agent on dataDir; start runs it.
func newAgent(t *testing.T, dataDir string) *agentProc {
	t.Helper()
	a := &agentProc{t: t, dataDir: dataDir}
	for i := range a.ports {
		a.ports[i] = porttest.Free(t)
	}
	t.Cleanup(func() {
		a.kill()
		killLeftovers(dataDir)
	})
	return a
}

// killLeftovers kills every process started for dataDir's agent (engines and
// their log writers carry the data dir in their environment or arguments): engines
// outlive a killed agent by design, so that a restarted one adopts them, and
// a test that ends with its agent killed must not leave them running.
func killLeftovers(dataDir string) {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		env, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		args, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if strings.Contains(string(env), dataDir) || strings.Contains(string(args), dataDir) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

func (a *agentProc) url() string { return "http://127.0.0.1:" + strconv.Itoa(a.ports[0]) }

// start runs the agent and waits until it serves /healthz and lists its own
// node, so that it is registered.
func (a *agentProc) start() {
	a.t.Helper()
	a.out = &syncBuffer{}
	mode := a.mode
	if mode == nil {
		mode = []string{"--dev"}
	}
	a.cmd = exec.Command(bin, "agent", "--node-name", "e2e", "--data-dir", a.dataDir,
		"--api-port", strconv.Itoa(a.ports[0]), "--raft-port", strconv.Itoa(a.ports[1]),
		"--gossip-port", strconv.Itoa(a.ports[2]), "--gateway-port", "0", "--log-level", "info")
	a.cmd.Args = append(append(a.cmd.Args, mode...), a.flags...)
	a.cmd.Stdout, a.cmd.Stderr = a.out, a.out
	if err := a.cmd.Start(); err != nil {
		a.t.Fatalf("start agent: %v", err)
	}
	done := make(chan struct{})
	a.done = done
	go func() { _ = a.cmd.Wait(); close(done) }()
	if err := a.waitReady(45 * time.Second); err != nil {
		a.t.Fatalf("agent on %s: %v\noutput:\n%s", a.dataDir, err, a.out.String())
	}
}

func (a *agentProc) waitReady(timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	httpc := &http.Client{Timeout: 2 * time.Second}
	nodes := gpuplanev1connect.NewNodeServiceClient(rpc.HTTPClient(), a.url())
	var last error
	for {
		select {
		case <-a.done:
			return fmt.Errorf("exited before it was ready (%v)", a.cmd.ProcessState)
		case <-ctx.Done():
			return fmt.Errorf("not ready after %s: %v", timeout, last)
		case <-time.After(50 * time.Millisecond):
		}
		resp, err := httpc.Get(a.url() + "/healthz")
		if err != nil {
			last = err
			continue
		}
		resp.Body.Close()
		callCtx, callCancel := context.WithTimeout(ctx, 5*time.Second)
		list, err := nodes.ListNodes(callCtx, connect.NewRequest(&pb.ListNodesRequest{}))
		callCancel()
		switch {
		case err != nil:
			last = err
		case len(list.Msg.Nodes) == 0:
			last = errors.New("no node registered yet")
		default:
			return nil
		}
	}
}

// kill sends SIGKILL and waits for the process to be gone.
func (a *agentProc) kill() {
	if a.cmd == nil || a.cmd.Process == nil {
		return
	}
	_ = a.cmd.Process.Signal(syscall.SIGKILL)
	<-a.done
}

// stop asks the agent to shut down cleanly (SIGTERM) and waits for it.
func (a *agentProc) stop() {
	a.t.Helper()
	if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		a.t.Fatalf("SIGTERM agent: %v", err)
	}
	select {
	case <-a.done:
	case <-time.After(30 * time.Second):
		a.t.Fatalf("agent did not exit within 30s of SIGTERM\noutput:\n%s", a.out.String())
	}
	if code := a.cmd.ProcessState.ExitCode(); code != 0 {
		a.t.Fatalf("agent exited %d after SIGTERM\noutput:\n%s", code, a.out.String())
	}
}

// cliResult is what one CLI invocation did.
type cliResult struct {
	stdout, stderr string
	code           int
}

// gpuplane runs the CLI binary against the agent at addr.
func gpuplane(t *testing.T, addr string, args ...string) cliResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append([]string{"--addr", addr}, args...)...)
	cmd.Env = append(os.Environ(), "NO_COLOR=1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("gpuplane %s: %v", strings.Join(args, " "), err)
	}
	return cliResult{stdout: stdout.String(), stderr: stderr.String(), code: cmd.ProcessState.ExitCode()}
}

// mustGpuplane runs the CLI and fails the test unless it exits 0.
func mustGpuplane(t *testing.T, addr string, args ...string) string {
	t.Helper()
	r := gpuplane(t, addr, args...)
	if r.code != 0 {
		t.Fatalf("gpuplane %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	}
	return r.stdout
}

var spaces = regexp.MustCompile(`\s+`)

// parseTable reads a tabwriter table into one map per row, keyed by the
// header's column names. Columns are separated by two or more spaces in the
// header, so names with one space ("IN USE") stay whole; a cell is the text
// under its header's span.
func parseTable(t *testing.T, s string) []map[string]string {
	t.Helper()
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) == 0 || lines[0] == "" {
		t.Fatalf("no table in %q", s)
	}
	header := lines[0]
	var starts []int
	var names []string
	for _, loc := range regexp.MustCompile(`\S+( \S+)*`).FindAllStringIndex(header, -1) {
		starts = append(starts, loc[0])
		names = append(names, header[loc[0]:loc[1]])
	}
	var rows []map[string]string
	for _, line := range lines[1:] {
		row := map[string]string{}
		for i, name := range names {
			end := len(line)
			if i+1 < len(starts) {
				end = min(starts[i+1], len(line))
			}
			if starts[i] < end {
				row[name] = strings.TrimSpace(line[starts[i]:end])
			} else {
				row[name] = ""
			}
		}
		rows = append(rows, row)
	}
	return rows
}

// detailPart is the table under title in what `get NAME` prints.
func detailPart(t *testing.T, s, title string) string {
	t.Helper()
	_, part, ok := strings.Cut(s, "\n"+title+":\n")
	if !ok {
		t.Fatalf("no %s in %q", title, s)
	}
	return part
}
