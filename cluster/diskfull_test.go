package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/internal/tmpfs"

	"github.com/gpuplane/gpuplane/cluster/raftstore"
	"github.com/gpuplane/gpuplane/fsm"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// fill writes a file until the disk is full and returns its path.
func fill(t *testing.T, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "filler")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 4096)
	for {
		if _, err := f.Write(chunk); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			return path
		}
	}
}

// TestDiskFullRecovers runs a single dev node on a small disk, fills the
// disk, and checks what its user sees: writes are refused with an error
// that says the disk is full; once space is freed, writes are accepted again
// by the same process, without a restart; a restart while the disk is full
// needs no space (the node starts and serves reads); and every write it
// acknowledged is in the log afterwards.
func TestDiskFullRecovers(t *testing.T) {
	disk := tmpfs.Mount(t, 2<<20, false)
	dataDir := filepath.Join(disk, "data")
	addr := freeAddr(t)
	cfg := Config{NodeName: "n1", DataDir: dataDir, RaftBind: addr, Server: true, Bootstrap: true,
		Logger: testLogger(), logSegmentSize: 64 << 10}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { c.Shutdown() }()
	waitLeader(t, c)

	acked := map[string]bool{}
	write := func(name string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		res, err := c.Apply(ctx, registerNode(name))
		if err == nil && res.Code == pb.Code_CODE_OK {
			acked[name] = true
		}
		return err
	}
	// writeUntilRefused writes until a write fails, and returns its error.
	n := 0
	writeUntilRefused := func() error {
		for range 20000 {
			n++
			if err := write(fmt.Sprintf("w%d", n)); err != nil {
				return err
			}
		}
		t.Fatal("20000 writes on a full disk all succeeded")
		return nil
	}

	for i := range 50 {
		if err := write(fmt.Sprintf("before%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	filler := fill(t, disk)
	err = writeUntilRefused()
	if !strings.Contains(err.Error(), "write refused") || !strings.Contains(err.Error(), "disk is full") {
		t.Fatalf("a write on a full disk failed with %q; want it to say the write was refused because the disk is full", err)
	}
	t.Logf("refused after %d writes: %v", n, err)

	// Space comes back: the same process takes writes again.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		n++
		err := write(fmt.Sprintf("w%d", n))
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a minute after space was freed, writes still fail: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// Full again, then a restart on the full disk.
	filler = fill(t, disk)
	writeUntilRefused()
	if err := c.Shutdown(); err != nil {
		t.Logf("shutdown on a full disk: %v", err)
	}
	if c, err = New(cfg); err != nil {
		t.Fatalf("restart on a full disk: %v", err)
	}
	os.Remove(filler)
	waitLeader(t, c)
	n++
	if err := write(fmt.Sprintf("w%d", n)); err != nil {
		t.Fatalf("write after a restart on a full disk, space freed: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = c.Read(ctx, false, func(f *fsm.FSM) error {
		for name := range acked {
			if _, ok := f.Node(name); !ok {
				return fmt.Errorf("acknowledged write %s is missing", name)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d acknowledged writes all present", len(acked))
}

// TestDiskFullServesReads fills a single server's disk to the last byte:
// writes are refused with an error that names the free space they wait
// for, the server stays its own leader and answers linearizable reads with
// every acknowledged write, repeated refused writes change neither, and so
// after a restart on the full disk; once that much space is free, writes
// resume.
func TestDiskFullServesReads(t *testing.T) {
	const segSize = 64 << 10
	disk := tmpfs.Mount(t, 2<<20, false)
	cfg := Config{NodeName: "n1", DataDir: filepath.Join(disk, "data"), RaftBind: freeAddr(t), Server: true, Bootstrap: true,
		Logger: testLogger(), logSegmentSize: segSize}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { c.Shutdown() }()
	waitLeader(t, c)

	var acked []string
	n := 0
	write := func() error {
		n++
		name := fmt.Sprintf("w%d", n)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		res, err := c.Apply(ctx, registerNode(name))
		if err == nil && res.Code == pb.Code_CODE_OK {
			acked = append(acked, name)
		}
		return err
	}
	readAll := func(why string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		err := c.Read(ctx, false, func(f *fsm.FSM) error {
			for _, name := range acked {
				if _, ok := f.Node(name); !ok {
					return fmt.Errorf("acknowledged write %s is missing", name)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatalf("linearizable read %s: %v", why, err)
		}
	}
	for range 20 {
		if err := write(); err != nil {
			t.Fatal(err)
		}
	}
	filler := fill(t, disk)
	var refused error
	for range 20000 {
		if refused = write(); refused != nil {
			break
		}
	}
	need := fmt.Sprintf("once %d bytes are free", segSize+1<<20)
	if refused == nil || !errors.Is(refused, raftstore.ErrWritesRefused) || !strings.Contains(refused.Error(), need) {
		t.Fatalf("a write on a full disk: %v; want it refused, naming %q", refused, need)
	}
	t.Logf("refused after %d acknowledged writes: %v", len(acked), refused)
	readAll("on the full disk")
	for range 20 {
		if err := write(); !errors.Is(err, raftstore.ErrWritesRefused) {
			t.Fatalf("a write on the full disk: %v; want it refused", err)
		}
		readAll("between refused writes")
	}

	if err := c.Shutdown(); err != nil {
		t.Logf("shutdown on a full disk: %v", err)
	}
	if c, err = New(cfg); err != nil {
		t.Fatalf("restart on a full disk: %v", err)
	}
	waitLeader(t, c)
	readAll("after a restart on the full disk")
	if err := write(); !errors.Is(err, raftstore.ErrWritesRefused) {
		t.Fatalf("a write on the full disk after a restart: %v; want it refused", err)
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for write() != nil {
		if time.Now().After(deadline) {
			t.Fatal("a minute after space was freed, writes are still refused")
		}
		time.Sleep(100 * time.Millisecond)
	}
	for range 200 { // through more segments
		if err := write(); err != nil {
			t.Fatal(err)
		}
	}
	readAll("after space was freed")
	t.Logf("%d acknowledged writes all present", len(acked))
}

// TestDiskFullLeaderHandsOver fills the leader's disk in a cluster of three:
// writes go on, through the full server too (it forwards them), because it
// hands leadership to a server with room; once space is freed it catches up.
func TestDiskFullLeaderHandsOver(t *testing.T) {
	tr := &trio{t: t, fwd: &localForwarder{nodes: map[string]*Cluster{}}}
	var peers []Peer
	disks := make([]string, 3)
	for i := range 3 {
		disks[i] = tmpfs.Mount(t, 2<<20, false)
		o := nodeOpts{name: fmt.Sprintf("s%d", i+1), dir: filepath.Join(disks[i], "data"), addr: freeAddr(t), bootstrap: true, segSize: 64 << 10}
		peers = append(peers, Peer{ID: o.name, Address: o.addr})
		tr.opts = append(tr.opts, o)
	}
	tr.nodes = make([]*Cluster, 3)
	for i := range tr.opts {
		tr.opts[i].peers = peers
		tr.restart(i)
	}
	lead, leader := tr.leader()
	for i := range 20 {
		mustApply(t, leader, registerNode(fmt.Sprintf("before%d", i)))
	}
	filler := fill(t, disks[lead])
	full := tr.nodes[lead]
	for i := range 600 { // several segments: the full server's log cannot take them
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		res, err := full.Apply(ctx, registerNode(fmt.Sprintf("w%d", i)))
		cancel()
		if err != nil || res.Code != pb.Code_CODE_OK {
			t.Fatalf("write %d through %s, whose disk is full: %v, %v", i, tr.opts[lead].name, res, err)
		}
	}
	if now, _ := tr.leader(); now == lead {
		t.Fatalf("%s still leads with a full disk after 600 writes", tr.opts[lead].name)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	tr.converge()
}
