package executor

import (
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// notACgroup is a box whose cgroup2 directory is a plain directory: the
// kernel refuses to clone a process into it, as a kernel without
// CLONE_INTO_CGROUP refuses any, so every start takes the fallback (start,
// then move).
func notACgroup(t *testing.T) *box {
	return &box{id: "fallback/0@1", v2: t.TempDir(), v1: map[string]string{}}
}

// An engine the kernel cannot clone into its cgroup is started anyway, by
// a second, fresh attempt; a missing program is reported as missing, not as
// the refusal of a second Start on the same exec.Cmd.
func TestStartFallsBackWhenTheKernelCannotCloneIntoTheCgroup(t *testing.T) {
	b := notACgroup(t)
	cmd := exec.Command("sleep", uniqueSleep(991))
	p, err := launch(cmd, b)
	if err != nil {
		t.Fatalf("start with the cgroup fallback: %v", err)
	}
	if p.exited() {
		t.Fatalf("the engine started through the fallback is not running: %s", p.exit)
	}
	_ = syscall.Kill(-p.pid, syscall.SIGKILL)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		t.Fatal("the engine did not end after SIGKILL")
	}

	for _, path := range []string{"/nonexistent/engine-binary", "no-such-engine-binary"} {
		_, err = launch(exec.Command(path, "--port", "1"), notACgroup(t))
		if err == nil {
			t.Fatalf("%s started", path)
		}
		if msg := err.Error(); strings.Contains(msg, "already started") ||
			(!strings.Contains(msg, "no such file or directory") && !strings.Contains(msg, "executable file not found")) {
			t.Errorf("start of %s failed with %q, want its real cause (no such file)", path, msg)
		}
	}
}

// A replica whose engine program does not exist is Failed with a reason
// that says so, also where its engine is started through the cgroup
// fallback.
func TestMissingEngineBinaryNamesTheCause(t *testing.T) {
	h := newHarness(t, t.TempDir(), func(o *Options) { o.RestartDelay, o.MaxRestartDelay = time.Minute, time.Minute })
	// Engine cgroups under a directory that is no cgroup: the fallback.
	// The executor reads it only once it has a replica to start.
	h.exec.contain.v2 = t.TempDir()
	h.want(10, command("missing", "/nonexistent/engine-binary", "--port", "{{.Port}}"))
	failed := h.waitState("missing", pb.ReplicaState_REPLICA_STATE_FAILED, 30*time.Second)
	if want := "start /nonexistent/engine-binary: fork/exec /nonexistent/engine-binary: no such file or directory"; !strings.HasPrefix(failed.Reason, want) {
		t.Errorf("missing failed with %q, want it to start with %q", failed.Reason, want)
	}
}
