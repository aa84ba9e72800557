package cli

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/node/inventory"
)

// lockedBuffer lets the test read what a running command writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// `engine sim` serves until its context ends (SIGTERM in the binary),
// registering its memory in $GPUPLANE_SIM_NVML_DIR once loaded.
func TestEngineSimServesUntilCancelled(t *testing.T) {
	usageDir := t.TempDir()
	var stderr lockedBuffer
	g := &globals{stdin: strings.NewReader(""), stdout: &bytes.Buffer{}, stderr: &stderr,
		getenv: func(k string) string { return map[string]string{inventory.EnvSimUsageDir: usageDir}[k] }}
	ctx, cancel := context.WithCancel(context.Background())
	code := make(chan int, 1)
	go func() {
		code <- g.run(ctx, []string{"engine", "sim", "--port", "0", "--served-model-name", "chat",
			"--load-seconds", "0", "--memory-mib", "1234", "--card-uuids", "GPU-x"})
	}()
	addr := regexp.MustCompile(`addr=(127\.0\.0\.1:\d+)`)
	var m []string
	deadline := time.Now().Add(5 * time.Second)
	for m = addr.FindStringSubmatch(stderr.String()); m == nil; m = addr.FindStringSubmatch(stderr.String()) {
		if time.Now().After(deadline) {
			t.Fatalf("engine sim did not say where it listens: %s", stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	for {
		resp, err := http.Get("http://" + m[1] + "/health")
		if err == nil && resp.StatusCode == http.StatusOK {
			resp.Body.Close()
			break
		}
		if err == nil {
			resp.Body.Close()
		}
		if time.Now().After(deadline) {
			t.Fatal("engine sim never became healthy")
		}
		time.Sleep(20 * time.Millisecond)
	}
	procs, err := inventory.NewSimUsage(usageDir).Processes("GPU-x")
	if err != nil || len(procs) != 1 || procs[0].PID != os.Getpid() || procs[0].UsedMiB != 1234 {
		t.Errorf("registered usage = %v, %v; want 1234 MiB by this process", procs, err)
	}
	cancel()
	if c := <-code; c != exitOK {
		t.Fatalf("engine sim exited %d: %s", c, stderr.String())
	}
}

func TestEngineSimNeedsAServedName(t *testing.T) {
	r := run(t, "", nil, "engine", "sim", "--port", "0")
	if r.code != exitUsage || !strings.Contains(r.stderr, "--served-model-name is required") {
		t.Fatalf("engine sim without a name: exit %d, %q", r.code, r.stderr)
	}
}

// Flags that cannot describe an engine are refused before it listens,
// naming the flags and the rule.
func TestEngineSimRefusesBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--memory-mib", "500", "--overhead-mib", "400", "--kv-pool-mib", "200"}, "--overhead-mib (400) + --kv-pool-mib (200) must not exceed --memory-mib (500)"},
		{[]string{"--memory-mib", "500", "--overhead-mib", "600"}, "--overhead-mib (600)"},
		{[]string{"--memory-mib", "500", "--kv-kib-per-token", "64"}, "--kv-kib-per-token needs a --kv-pool-mib"},
		{[]string{"--memory-mib", "500", "--compute-percent", "150"}, "--compute-percent 150 is not from 0 to 100"},
		{[]string{"--wake-seconds", "-1"}, "--wake-seconds must not be negative"},
		{[]string{"--init-seconds", "-0.5"}, "--init-seconds must not be negative"},
	} {
		args := append([]string{"engine", "sim", "--port", "0", "--served-model-name", "chat"}, tc.args...)
		r := run(t, "", nil, args...)
		if r.code != exitUsage || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("engine sim %v: exit %d, %q; want a usage error containing %q", tc.args, r.code, r.stderr, tc.want)
		}
	}
}
