package raftstore

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/internal/tmpfs"

	"github.com/hashicorp/raft"
)

// filler takes a disk's free space and gives it back in measured amounts.
type filler struct {
	t    *testing.T
	path string
	size int64
}

// fillDisk writes a file until the disk is full.
func fillDisk(t *testing.T, disk, name string) *filler {
	t.Helper()
	f := &filler{t: t, path: filepath.Join(disk, name)}
	fh, err := os.Create(f.path)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	chunk := make([]byte, 4096)
	for {
		n, err := fh.Write(chunk)
		f.size += int64(n)
		if err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			return f
		}
	}
}

// leave shrinks the filler until the disk has free bytes free.
func (f *filler) leave(free uint64) {
	f.t.Helper()
	now, err := freeBytes(filepath.Dir(f.path))
	if err != nil {
		f.t.Fatal(err)
	}
	f.size -= int64(free) - int64(now)
	if err := os.Truncate(f.path, f.size); err != nil {
		f.t.Fatal(err)
	}
	if got, _ := freeBytes(filepath.Dir(f.path)); got < free || got > free+64<<10 {
		f.t.Fatalf("asked for %d bytes free, the disk has %d", free, got)
	}
}

// bigEntry is a log entry of about 1 KiB whose data says its index.
func bigEntry(i uint64) *raft.Log {
	return &raft.Log{Index: i, Term: 1, Type: raft.LogCommand, Data: []byte(fmt.Sprintf("entry %d %s", i, strings.Repeat("x", 1000)))}
}

// checkWhole fails unless every segment file in dir has at least the size
// it was created with (a segment's last batch and its index may run past
// it): a segment is created whole or not at all.
func checkWhole(t *testing.T, dir string, segSize int) {
	t.Helper()
	st, _, err := loadMeta(dir, false)
	if err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*.wal"))
	listed := map[string]bool{}
	for _, info := range st.Segments {
		listed[filepath.Base(segmentPath(dir, info))] = true
	}
	for _, f := range files {
		fi, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Size() < int64(segSize) {
			t.Errorf("segment %s is %d bytes, under the %d it is created with (whole or not at all)", filepath.Base(f), fi.Size(), segSize)
		}
		if !listed[filepath.Base(f)] {
			t.Errorf("segment %s is not listed in wal-meta.db", filepath.Base(f))
		}
	}
}

// checkLog fails unless the store holds every entry in acked.
func checkLog(t *testing.T, s *Store, acked []uint64) {
	t.Helper()
	var l raft.Log
	for _, i := range acked {
		if err := s.GetLog(i, &l); err != nil || string(l.Data) != string(bigEntry(i).Data) {
			t.Fatalf("acknowledged entry %d: %v", i, err)
		}
	}
}

// checkOffline fails unless the offline reader (audit's) opens the log and
// holds every entry in acked.
func checkOffline(t *testing.T, dir string, acked []uint64) {
	t.Helper()
	r, err := OpenReadOnly(dir)
	if err != nil {
		t.Fatalf("offline reader: %v", err)
	}
	defer r.Close()
	var l raft.Log
	for _, i := range acked {
		if err := r.GetLog(i, &l); err != nil || string(l.Data) != string(bigEntry(i).Data) {
			t.Fatalf("offline reader: acknowledged entry %d: %v", i, err)
		}
	}
}

// TestDiskFullDuringRotation fills a small disk so that the log must start
// a new segment when there is no room for it: the write is refused with the
// free space writes wait for; no segment file is left short (the new one is
// created whole or not at all); the log reopens on the full disk, and again
// after a creation that never completed (a file of zeros, short: what an
// earlier version left), every acknowledged entry readable and the offline
// reader content; writes stay refused below the threshold the error names
// and resume at it; and after the disk fills to the last byte, reopens and
// more rotations, nothing acknowledged is lost.
func TestDiskFullDuringRotation(t *testing.T) {
	const segSize = 512 << 10
	disk := tmpfs.Mount(t, 4<<20, false)
	dir := filepath.Join(disk, "log")
	var last *Store
	t.Cleanup(func() { last.Close() }) // before the disk is unmounted
	open := func() *Store {
		t.Helper()
		s, err := Open(dir, Options{SegmentSize: segSize})
		if err != nil {
			t.Fatalf("open: %v", err)
		}
		last = s
		return s
	}
	s := open()
	need := s.roomNeeded()
	var acked []uint64
	next := uint64(1)
	// own: the entries written are a leader's own (no-ops), which the
	// reserve is kept for, rather than commands.
	own := false
	write := func(s *Store) error {
		l := bigEntry(next)
		if own {
			l.Type = raft.LogNoop
		}
		err := s.StoreLogs([]*raft.Log{l})
		if err == nil {
			acked = append(acked, next)
			next++
		}
		return err
	}
	writeUntilRefused := func(s *Store) error {
		t.Helper()
		for range 10000 {
			if err := write(s); err != nil {
				return err
			}
		}
		t.Fatal("10000 writes on a full disk all succeeded")
		return nil
	}
	waitWrites := func(s *Store, why string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for write(s) != nil {
			if time.Now().After(deadline) {
				t.Fatalf("%s: writes are still refused 10s later", why)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	for range 100 {
		if err := write(s); err != nil {
			t.Fatal(err)
		}
	}

	// Room for the segment's last batch, not for the next segment:
	// commands are refused before the segment's reserve...
	fill := fillDisk(t, disk, "filler")
	fill.leave(64 << 10)
	want := fmt.Sprintf("once %d bytes are free", need)
	err := writeUntilRefused(s)
	if !errors.Is(err, ErrWritesRefused) || !strings.Contains(err.Error(), "kept for the leader's own entries") || !strings.Contains(err.Error(), want) {
		t.Fatalf("a command with no room for the next segment failed with %q; want it refused to keep the reserve, naming %q", err, want)
	}
	if admit := s.Admit(100); !errors.Is(admit, ErrWritesRefused) {
		t.Fatalf("Admit after a command was refused for the reserve: %v", admit)
	}
	t.Logf("commands refused after %d entries: %v", len(acked), err)
	// ...which a leader's own entries fill, up to the rotation that finds
	// no room.
	own = true
	before := len(acked)
	err = writeUntilRefused(s)
	if !errors.Is(err, ErrWritesRefused) || !strings.Contains(err.Error(), "next could not be created") || !strings.Contains(err.Error(), want) {
		t.Fatalf("a write with no room for the next segment failed with %q; want it refused for that, naming %q", err, want)
	}
	if got := len(acked) - before; got < 40 {
		t.Fatalf("the reserve took %d entries of 1 KiB; want it to hold its 64 KiB", got)
	}
	t.Logf("the reserve took %d more entries, then: %v", len(acked)-before, err)
	own = false
	checkLog(t, s, acked)
	if err := s.Close(); err != nil {
		t.Logf("close on a full disk: %v", err)
	}
	checkWhole(t, dir, segSize)
	st, _, err := loadMeta(dir, false)
	if err != nil {
		t.Fatal(err)
	}
	tail := st.Segments[len(st.Segments)-1]
	if len(st.Segments) != 2 || !tail.SealTime.IsZero() {
		t.Fatalf("wal-meta.db lists %d segments, the newest sealed %v; want the refused rotation to have listed the next", len(st.Segments), !tail.SealTime.IsZero())
	}

	// What an earlier version left: the new segment's file, created but
	// never preallocated. Nothing was written to it, so it is not damage.
	if err := os.WriteFile(segmentPath(dir, tail), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	s = open() // on the full disk
	checkLog(t, s, acked)
	if err := write(s); err == nil {
		t.Fatal("a write on the full disk after a reopen was accepted")
	}
	s.Close()
	checkWhole(t, dir, segSize)
	checkOffline(t, dir, acked)

	// Below the threshold the error named, writes stay refused; at it they
	// resume, in the same process.
	s = open()
	fill.leave(need - 128<<10)
	for range 3 {
		time.Sleep(reopenEvery)
		if err := write(s); err == nil {
			t.Fatalf("a write was accepted with %d bytes free, under the %d the error named", need-128<<10, need)
		}
	}
	fill.leave(need)
	waitWrites(s, fmt.Sprintf("%d bytes free, as the error named", need))

	// Full to the last byte: the refused write may be the segment's last
	// batch, cut short.
	fill2 := fillDisk(t, disk, "filler2")
	err = writeUntilRefused(s)
	own = true
	err = errors.Join(err, writeUntilRefused(s))
	own = false
	t.Logf("refused again after %d entries: %v", len(acked), err)
	s.Close()
	checkWhole(t, dir, segSize)
	checkOffline(t, dir, acked)
	s = open()
	checkLog(t, s, acked)
	if err := os.Remove(fill2.path); err != nil {
		t.Fatal(err)
	}
	fill.leave(need)
	waitWrites(s, fmt.Sprintf("after a reopen on the full disk, %d bytes freed", need))
	for range 200 {
		if err := write(s); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()
	checkWhole(t, dir, segSize)
	checkOffline(t, dir, acked)
	s = open()
	checkLog(t, s, acked)
	s.Close()
	t.Logf("%d acknowledged entries all present in %d segments", len(acked), len(mustGlob(t, dir)))
}

func mustGlob(t *testing.T, dir string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.wal"))
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// TestTailFillFollowsWAL writes batches of varied entries across several
// segments and checks, after each batch, that the store's account of the
// newest segment's fill (what Admit keeps its reserve by) is what reading
// the files through finds on the next open.
func TestTailFillFollowsWAL(t *testing.T) {
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(7, 1))
	s, err := Open(dir, Options{SegmentSize: smallSegments})
	if err != nil {
		t.Fatal(err)
	}
	i := uint64(1)
	for round := range 40 {
		for range 1 + rng.IntN(8) {
			var batch []*raft.Log
			for k := 1 + rng.IntN(6); k > 0; k-- {
				batch = append(batch, entry(i, rng))
				i++
			}
			if err := s.StoreLogs(batch); err != nil {
				t.Fatal(err)
			}
		}
		s.tmu.Lock()
		tracked := s.fill
		s.tmu.Unlock()
		s.Close()
		if s, err = Open(dir, Options{SegmentSize: smallSegments}); err != nil {
			t.Fatal(err)
		}
		s.tmu.Lock()
		scanned := s.fill
		s.tmu.Unlock()
		if tracked != scanned {
			t.Fatalf("round %d (last index %d): tracked fill %+v, the files say %+v", round, i-1, tracked, scanned)
		}
	}
	s.Close()
	if n := len(mustGlob(t, dir)); n < 4 {
		t.Fatalf("%d segments; want several rotations", n)
	}
}
