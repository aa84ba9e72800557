package executor

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/internal/testutil"
	"github.com/gpuplane/gpuplane/internal/tmpfs"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// fill writes a file under dir until the disk is full and returns it.
func fill(t *testing.T, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "filler")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, size := range []int{64 << 10, 4 << 10, 1} {
		chunk := make([]byte, size)
		for {
			if _, err := f.Write(chunk); err != nil {
				if !errors.Is(err, syscall.ENOSPC) {
					t.Fatal(err)
				}
				break
			}
		}
	}
	return path
}

// TestAdoptsEnginesOnAFullDisk: the agent is killed (its executor
// abandoned with its engines) and restarted on a disk with no byte free.
// It cannot write a new engines/agent.json, but writes its mark over the
// dead agent's, so the engine's log writer sees a live agent: past the
// orphan grace (2s here) the adopted engine still runs as the same
// process, reported Running with no restart.
func TestAdoptsEnginesOnAFullDisk(t *testing.T) {
	disk := tmpfs.Mount(t, 16<<20, true)
	dataDir := filepath.Join(disk, "data")
	first := newHarness(t, dataDir, func(o *Options) { o.KeepEngines, o.OrphanGrace = true, 2*time.Second })
	first.want(10, sim("alpha", 1))
	first.waitState("alpha", pb.ReplicaState_REPLICA_STATE_RUNNING, 30*time.Second)
	alpha := onePID(t, "alpha")
	first.close()

	filler := fill(t, disk)
	defer os.Remove(filler)
	if err := os.WriteFile(filepath.Join(disk, "probe"), []byte("x"), 0o644); err == nil {
		t.Fatal("the disk is not full")
	}
	second := newHarness(t, dataDir, func(o *Options) { o.OrphanGrace = 2 * time.Second })
	second.want(10, sim("alpha", 1))
	second.waitState("alpha", pb.ReplicaState_REPLICA_STATE_RUNNING, 30*time.Second)
	time.Sleep(3 * 2 * time.Second)
	if got := onePID(t, "alpha"); got != alpha {
		t.Fatalf("alpha runs as pid %d past the orphan grace, want its adopted engine %d", got, alpha)
	}
	if st := second.rep.last("alpha"); st.State != pb.ReplicaState_REPLICA_STATE_RUNNING || st.Restarts != 0 {
		t.Fatalf("alpha is reported %v, want Running with no restart", st)
	}
	os.Remove(filler)
	second.close()
}

// TestFullDiskStateFollowsTheProcess: restarted on a full disk where even
// the old mark is gone, the agent cannot mark itself the engines' owner,
// says so, and keeps serving: when the adopted engine's log writer stops
// it after the orphan grace, the replica is not reported Running on a
// process that is gone; once space is freed the mark is written and the
// replica runs again.
func TestFullDiskStateFollowsTheProcess(t *testing.T) {
	disk := tmpfs.Mount(t, 16<<20, true)
	dataDir := filepath.Join(disk, "data")
	first := newHarness(t, dataDir, func(o *Options) { o.KeepEngines, o.OrphanGrace = true, time.Second })
	first.want(10, sim("alpha", 1))
	first.waitState("alpha", pb.ReplicaState_REPLICA_STATE_RUNNING, 30*time.Second)
	alpha := onePID(t, "alpha")
	first.close()
	if err := os.Remove(filepath.Join(dataDir, "engines", agentFile)); err != nil {
		t.Fatal(err)
	}
	filler := fill(t, disk)
	defer os.Remove(filler)
	second := newHarness(t, dataDir, func(o *Options) { o.OrphanGrace = time.Second })
	second.want(10, sim("alpha", 1))
	testutil.Until(t, 30*time.Second, "alpha's adopted engine was stopped by its log writer", func() bool {
		return syscall.Kill(alpha, 0) != nil
	})
	testutil.Until(t, 30*time.Second, "alpha is still reported Running on its dead engine", func() bool {
		st := second.rep.last("alpha")
		return st != nil && (st.State != pb.ReplicaState_REPLICA_STATE_RUNNING || st.Restarts > 0)
	})
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	testutil.Until(t, 30*time.Second, "alpha did not run again once space was freed", func() bool {
		st := second.rep.last("alpha")
		return st != nil && st.State == pb.ReplicaState_REPLICA_STATE_RUNNING && len(engines(t, "alpha")) == 1 && agentAlive(filepath.Join(dataDir, "engines", agentFile))
	})
	second.close()
}
