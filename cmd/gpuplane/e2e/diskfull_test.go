package e2e

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/internal/tmpfs"

	"connectrpc.com/connect"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
	"github.com/gpuplane/gpuplane/proto/gpuplane/v1/gpuplanev1connect"
	"github.com/gpuplane/gpuplane/rpc"
)

// diskFaults runs TestFullDiskRestarts, half a minute of agent restarts
// (make disk-faults); the quick full-disk tests of cluster/raftstore and
// cluster run in make test.
var diskFaults = flag.Bool("e2e.disk-faults", false, "run the full-disk restart sequence with the real binary (make disk-faults)")

// fillDisk writes a file until the disk is full and returns its path.
func fillDisk(t *testing.T, dir string) string {
	t.Helper()
	path := filepath.Join(dir, fmt.Sprintf("filler-%d", time.Now().UnixNano()))
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 64<<10)
	for {
		if _, err := f.Write(chunk); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			break
		}
	}
	// The last partial chunks: the disk to the last page.
	chunk = chunk[:4096]
	for {
		if _, err := f.Write(chunk); err != nil {
			return path
		}
	}
}

// TestFullDiskRestarts is an operator's worst day with a single dev server
// on a 64 MiB disk, log segments of the default 16 MiB: the disk fills while
// deployments are applied; writes are refused with the free space they
// wait for, reads still answer; space is freed and writes resume; then
// kill -9, a fill again, a clean stop (SIGTERM) and a restart on the full
// disk, kill -9 on it, space freed, SIGTERM, restart. After each stop
// offline `audit verify --data-dir` passes and no log segment is short, and
// after each start every acknowledged write is there.
func TestFullDiskRestarts(t *testing.T) {
	if !*diskFaults {
		t.Skip("half a minute of restarts: run with -e2e.disk-faults (make disk-faults)")
	}
	requireBinary(t)
	disk := tmpfs.Mount(t, 64<<20, true)
	a := newAgent(t, filepath.Join(disk, "data"))
	logDir := filepath.Join(a.dataDir, "raft", "log")
	a.start()

	big := strings.Repeat("x", 128<<10) // about 130 writes to a segment
	var acked []string
	n := 0
	apply := func() error {
		n++
		name := fmt.Sprintf("big-%d", n)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		models := gpuplanev1connect.NewModelServiceClient(rpc.HTTPClient(), a.url())
		_, err := models.ApplyModel(ctx, connect.NewRequest(&pb.ApplyModelRequest{Name: name, Spec: &pb.ModelSpec{
			Model: "/models/" + name, Replicas: 0, Placement: &pb.PlacementSpec{Accelerator: "pad"}, Engine: &pb.EngineSpec{Kind: "sim", Args: []string{"--pad", big}},
		}}))
		if err == nil {
			acked = append(acked, name)
		}
		return err
	}
	applyUntilRefused := func() error {
		t.Helper()
		for range 1000 {
			if err := apply(); err != nil {
				return err
			}
		}
		t.Fatalf("1000 writes of 128 KiB on a 64 MiB disk all succeeded")
		return nil
	}
	applyOnceFree := func() {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for {
			err := apply()
			if err == nil {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("a minute after space was freed, writes still fail: %v\nagent output:\n%s", err, a.out.String())
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	checkAll := func(when string) {
		t.Helper()
		models := gpuplanev1connect.NewModelServiceClient(rpc.HTTPClient(), a.url())
		for _, name := range acked {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			resp, err := models.GetModel(ctx, connect.NewRequest(&pb.GetModelRequest{Name: name}))
			cancel()
			if err != nil {
				t.Fatalf("%s: acknowledged deployment %s: %v\nagent output:\n%s", when, name, err, a.out.String())
			}
			if args := resp.Msg.GetModel().GetSpec().GetEngine().GetArgs(); len(args) != 2 || args[1] != big {
				t.Fatalf("%s: deployment %s lost its engine args", when, name)
			}
		}
		t.Logf("%s: %d acknowledged writes all present", when, len(acked))
	}
	checkStopped := func(when string) {
		t.Helper()
		files, _ := filepath.Glob(filepath.Join(logDir, "*.wal"))
		if len(files) == 0 {
			t.Fatalf("no log segments in %s", logDir)
		}
		for _, f := range files {
			if fi, err := os.Stat(f); err != nil || fi.Size() < 16<<20 {
				t.Errorf("%s: log segment %s is %v bytes (%v), under the 16 MiB it is created with", when, filepath.Base(f), fi.Size(), err)
			}
		}
		if r := gpuplane(t, "http://127.0.0.1:1", "audit", "verify", "--data-dir", a.dataDir); r.code != 0 {
			t.Fatalf("%s: audit verify --data-dir exit %d:\n%s%s", when, r.code, r.stdout, r.stderr)
		}
	}

	mustGpuplane(t, a.url(), "accelerators", "create", "pad", "--device", "l4")
	for range 10 {
		if err := apply(); err != nil {
			t.Fatal(err)
		}
	}
	filler := fillDisk(t, disk)
	err := applyUntilRefused()
	need := fmt.Sprintf("once %d bytes are free", 17<<20)
	if connect.CodeOf(err) != connect.CodeResourceExhausted || !strings.Contains(err.Error(), need) {
		t.Fatalf("a write on the full disk: %v; want ResourceExhausted, naming %q", err, need)
	}
	t.Logf("refused after %d writes: %v", len(acked), err)
	// Reads answer, linearizable ones too, through the CLI.
	mustGpuplane(t, a.url(), "models", "list")
	checkAll("on the full disk")

	// Space freed: the same process takes writes again.
	os.Remove(filler)
	applyOnceFree()
	for range 10 {
		if err := apply(); err != nil {
			t.Fatal(err)
		}
	}
	a.kill()
	checkStopped("kill -9 after the disk was full")
	a.start()
	checkAll("restart after kill -9")

	// Full again, then a clean stop and a restart on the full disk.
	filler = fillDisk(t, disk)
	t.Logf("full again: %v", applyUntilRefused())
	a.stop()
	checkStopped("SIGTERM on the full disk")
	a.start()
	checkAll("restart on the full disk")
	if err := apply(); connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Fatalf("a write after a restart on the full disk: %v; want it refused", err)
	}
	a.kill()
	checkStopped("kill -9 on the full disk")
	a.start()
	checkAll("restart after kill -9 on the full disk")

	os.Remove(filler)
	applyOnceFree()
	for range 10 {
		if err := apply(); err != nil {
			t.Fatal(err)
		}
	}
	a.stop()
	checkStopped("SIGTERM after space was freed")
	a.start()
	checkAll("restart after space was freed")
	a.stop()
}
