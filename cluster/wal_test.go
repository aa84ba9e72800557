package cluster

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"

	"github.com/gpuplane/gpuplane/fsm"
)

func walLogs(from, to, term uint64) []*raft.Log {
	var logs []*raft.Log
	for i := from; i <= to; i++ {
		l := &raft.Log{Index: i, Term: term, Type: raft.LogCommand, Data: []byte(fmt.Sprintf("entry %d term %d", i, term)),
			AppendedAt: time.Unix(1700000000, int64(i)*1000)}
		switch i % 5 {
		case 1:
			l.Type = raft.LogConfiguration
		case 2:
			l.Data = nil // a no-op or barrier
			l.Type = raft.LogNoop
		case 3:
			l.Extensions = []byte{1, 2, 3}
		case 4:
			l.AppendedAt = time.Time{}
		}
		logs = append(logs, l)
	}
	return logs
}

func openTestWAL(t *testing.T, dir string) *walStore {
	t.Helper()
	s, err := openWALStore(dir, testLogger())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// crash abandons s as a SIGKILL would: no flush, files left as they are.
func crash(s *walStore) {
	s.closeOnce.Do(func() {
		close(s.stop)
		<-s.done
		s.appendMu.Lock()
		s.seg.Close()
		s.seg = nil
		s.appendMu.Unlock()
		s.bolt.Close()
	})
}

func storeIn(t *testing.T, s interface{ StoreLogs([]*raft.Log) error }, logs []*raft.Log, batch int) {
	t.Helper()
	for len(logs) > 0 {
		n := min(batch, len(logs))
		if err := s.StoreLogs(logs[:n]); err != nil {
			t.Fatal(err)
		}
		logs = logs[n:]
	}
}

// checkLogs checks that the store holds exactly want, from index 1.
func checkLogs(t *testing.T, s LogReader, want []*raft.Log) {
	t.Helper()
	first, err := s.FirstIndex()
	if err != nil {
		t.Fatal(err)
	}
	last, err := s.LastIndex()
	if err != nil {
		t.Fatal(err)
	}
	if len(want) == 0 {
		if first != 0 || last != 0 {
			t.Fatalf("empty log: first %d, last %d", first, last)
		}
		return
	}
	if first != want[0].Index || last != want[len(want)-1].Index {
		t.Fatalf("log holds %d..%d, want %d..%d", first, last, want[0].Index, want[len(want)-1].Index)
	}
	for _, w := range want {
		var got raft.Log
		if err := s.GetLog(w.Index, &got); err != nil {
			t.Fatalf("entry %d: %v", w.Index, err)
		}
		if got.Index != w.Index || got.Term != w.Term || got.Type != w.Type || string(got.Data) != string(w.Data) ||
			string(got.Extensions) != string(w.Extensions) || !got.AppendedAt.Equal(w.AppendedAt) {
			t.Fatalf("entry %d: got %+v, want %+v", w.Index, got, *w)
		}
	}
}

func segmentFiles(t *testing.T, dir string) []string {
	t.Helper()
	s := &walStore{dir: filepath.Join(dir, raftDir, walDirName)}
	names, err := s.segments()
	if err != nil {
		t.Fatal(err)
	}
	return names
}

// TestWALStore: entries are readable at once, through flushes, and a closed
// store leaves them all in raft.db, as offline readers expect, and no
// segments.
func TestWALStore(t *testing.T) {
	dir := t.TempDir()
	s := openTestWAL(t, dir)
	checkLogs(t, s, nil)
	logs := walLogs(1, 40, 1)
	storeIn(t, s, logs[:17], 4)
	checkLogs(t, s, logs[:17])
	if err := s.flush(); err != nil {
		t.Fatal(err)
	}
	checkLogs(t, s, logs[:17])
	storeIn(t, s, logs[17:], 7)
	checkLogs(t, s, logs)
	if err := s.SetUint64([]byte("CurrentTerm"), 7); err != nil {
		t.Fatal(err)
	}
	if v, err := s.GetUint64([]byte("CurrentTerm")); err != nil || v != 7 {
		t.Fatalf("stable store: %d, %v", v, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	if segs := segmentFiles(t, dir); len(segs) != 0 {
		t.Fatalf("segments left after close: %v", segs)
	}
	bolt, err := raftboltdb.New(raftboltdb.Options{Path: RaftDBPath(dir)})
	if err != nil {
		t.Fatal(err)
	}
	checkLogs(t, bolt, logs)
	bolt.Close()

	s = openTestWAL(t, dir)
	defer s.Close()
	checkLogs(t, s, logs)
	storeIn(t, s, walLogs(41, 45, 2), 5)
	checkLogs(t, s, append(logs, walLogs(41, 45, 2)...))
}

// TestWALRecoversAfterCrash: whatever a crash leaves in segments (sealed or
// not, flushed or not) is moved into raft.db at the next open.
func TestWALRecoversAfterCrash(t *testing.T) {
	dir := t.TempDir()
	s := openTestWAL(t, dir)
	logs := walLogs(1, 300, 1)
	storeIn(t, s, logs[:100], 9)
	if err := s.flush(); err != nil {
		t.Fatal(err)
	}
	storeIn(t, s, logs[100:200], 11)
	if err := s.flush(); err != nil {
		t.Fatal(err)
	}
	storeIn(t, s, logs[200:], 13)
	// Appends write into the segment's zeroed space (walPrealloc): the
	// file does not grow, so their fdatasyncs commit no metadata.
	st, err := s.seg.Stat()
	if err != nil {
		t.Fatal(err)
	}
	if st.Size() != walPrealloc {
		t.Fatalf("segment after appends: %d bytes, want %d, as created", st.Size(), walPrealloc)
	}
	crash(s)
	if len(segmentFiles(t, dir)) == 0 {
		t.Fatal("the crash left no segments: the test checks nothing")
	}

	s = openTestWAL(t, dir)
	checkLogs(t, s, logs)
	if segs := segmentFiles(t, dir); len(segs) != 1 {
		t.Fatalf("after recovery: segments %v, want one new one", segs)
	}
	// raft.db itself holds everything, before any flush.
	crash(s)
	bolt, err := raftboltdb.New(raftboltdb.Options{Path: RaftDBPath(dir)})
	if err != nil {
		t.Fatal(err)
	}
	checkLogs(t, bolt, logs)
	bolt.Close()
}

// TestWALTornTail: a crash in the middle of an append leaves a partial or
// damaged last record; recovery keeps the records before it (that batch was
// never acknowledged: its sync had not returned).
func TestWALTornTail(t *testing.T) {
	for _, damage := range []string{"partial header", "partial payload", "bad checksum", "zeros"} {
		t.Run(damage, func(t *testing.T) {
			dir := t.TempDir()
			s := openTestWAL(t, dir)
			logs := walLogs(1, 10, 1)
			storeIn(t, s, logs[:5], 5)
			storeIn(t, s, logs[5:], 5)
			crash(s)
			segs := segmentFiles(t, dir)
			path := filepath.Join(dir, raftDir, walDirName, segs[len(segs)-1])
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			second := len(encodeRecord(logs[:5]))
			end := second + len(encodeRecord(logs[5:]))
			want := logs[:5]
			switch damage {
			case "partial header":
				data = append(data[:end:end], 0x10, 0)
				want = logs
			case "partial payload":
				data = data[:end-3]
			case "bad checksum":
				data[second+recordHeader+2] ^= 0xff
			case "zeros":
				data = append(data[:end:end], make([]byte, 64)...)
				want = logs
			}
			if err := os.WriteFile(path, data, 0o600); err != nil {
				t.Fatal(err)
			}
			s = openTestWAL(t, dir)
			defer s.Close()
			checkLogs(t, s, want)
			// Appends go on from there.
			more := walLogs(want[len(want)-1].Index+1, 12, 2)
			storeIn(t, s, more, 3)
			checkLogs(t, s, append(want[:len(want):len(want)], more...))
		})
	}
}

// TestWALDeleteRange: entries a follower deletes (a new leader overwrites
// its uncommitted tail) never come back, even after a crash.
func TestWALDeleteRange(t *testing.T) {
	dir := t.TempDir()
	s := openTestWAL(t, dir)
	old := walLogs(1, 10, 1)
	storeIn(t, s, old, 3)
	if err := s.DeleteRange(6, 10); err != nil {
		t.Fatal(err)
	}
	checkLogs(t, s, old[:5])
	newer := walLogs(6, 8, 2)
	storeIn(t, s, newer, 2)
	want := append(old[:5:5], newer...)
	checkLogs(t, s, want)
	crash(s)
	s = openTestWAL(t, dir)
	defer s.Close()
	checkLogs(t, s, want)
}

// TestWALOutOfOrder: entries that do not continue the log (Raft deletes
// before it overwrites, so it does not do this) still end up in place.
func TestWALOutOfOrder(t *testing.T) {
	dir := t.TempDir()
	s := openTestWAL(t, dir)
	defer s.Close()
	storeIn(t, s, walLogs(1, 5, 1), 5)
	storeIn(t, s, walLogs(4, 7, 2), 4)
	checkLogs(t, s, append(walLogs(1, 3, 1), walLogs(4, 7, 2)...))
}

// TestWALConcurrent reads entries while they are appended and flushed
// (run with -race).
func TestWALConcurrent(t *testing.T) {
	dir := t.TempDir()
	s := openTestWAL(t, dir)
	logs := walLogs(1, 3000, 1)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			default:
			}
			if err := s.flush(); err != nil {
				t.Error(err)
				return
			}
			time.Sleep(time.Millisecond)
		}
	})
	for range 2 {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				last, err := s.LastIndex()
				if err != nil {
					t.Error(err)
					return
				}
				if last == 0 {
					continue
				}
				i := 1 + rand.Uint64N(last)
				var l raft.Log
				if err := s.GetLog(i, &l); err != nil || l.Index != i || string(l.Data) != string(logs[i-1].Data) {
					t.Errorf("entry %d of %d: %+v, %v", i, last, l, err)
					return
				}
			}
		})
	}
	storeIn(t, s, logs, 7)
	close(done)
	wg.Wait()
	checkLogs(t, s, logs)
	crash(s)
	s = openTestWAL(t, dir)
	defer s.Close()
	checkLogs(t, s, logs)
}

// TestWALOfflineReadsTail: a killed node's newest entries, still only in its
// write-ahead log, are part of its log for offline readers (OpenOffline),
// which read the segments without changing them; the next start finds the
// same log.
func TestWALOfflineReadsTail(t *testing.T) {
	dir := t.TempDir()
	s := openTestWAL(t, dir)
	logs := walLogs(1, 700, 1)
	storeIn(t, s, logs[:300], 10)
	if err := s.flush(); err != nil {
		t.Fatal(err)
	}
	storeIn(t, s, logs[300:], 9)
	crash(s)
	walDir := filepath.Join(dir, raftDir, walDirName)
	before := map[string]string{}
	for _, name := range segmentFiles(t, dir) {
		b, err := os.ReadFile(filepath.Join(walDir, name))
		if err != nil {
			t.Fatal(err)
		}
		before[name] = string(b)
	}
	if len(before) == 0 {
		t.Fatal("the crash left no segments: the test checks nothing")
	}

	off, err := OpenOffline(dir)
	if err != nil {
		t.Fatal(err)
	}
	r, ok := off.History.log.(logRanger)
	if !ok {
		t.Fatalf("offline log %T cannot range", off.History.log)
	}
	checkLogs(t, r, logs)
	// One range across raft.db's end and into the tail.
	var got []uint64
	if err := r.RangeLogs(250, 650, nil, func(l *raft.Log, e *fsm.Entry) error {
		if want := logs[l.Index-1]; string(l.Data) != string(want.Data) || l.Term != want.Term || l.Type != want.Type {
			t.Fatalf("range: entry %d: %+v, want %+v", l.Index, *l, *want)
		}
		if (e != nil) != (l.Type == raft.LogCommand) {
			t.Fatalf("range: entry %d of type %v came with entry %v", l.Index, l.Type, e)
		}
		got = append(got, l.Index)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(got) != 401 || got[0] != 250 || got[400] != 650 {
		t.Fatalf("range 250..650 gave %d entries, %v..", len(got), got[:min(3, len(got))])
	}
	if err := r.RangeLogs(690, 701, nil, func(*raft.Log, *fsm.Entry) error { return nil }); !errors.Is(err, raft.ErrLogNotFound) {
		t.Fatalf("range past the end: %v, want ErrLogNotFound", err)
	}
	if err := off.Close(); err != nil {
		t.Fatal(err)
	}
	for name, b := range before {
		after, err := os.ReadFile(filepath.Join(walDir, name))
		if err != nil || string(after) != b {
			t.Fatalf("offline reading changed segment %s (%v)", name, err)
		}
	}

	s = openTestWAL(t, dir)
	defer s.Close()
	checkLogs(t, s, logs)
}

// TestWALGetLogLeavesRaftsCopyAlone: reading an entry still pending, then
// (after a flush) the next one from raft.db into the same raft.Log, as a
// Cursor does, must not write into the entry Raft handed to StoreLogs,
// whose Data Raft's LogCache still serves to followers.
func TestWALGetLogLeavesRaftsCopyAlone(t *testing.T) {
	s := openTestWAL(t, t.TempDir())
	defer s.Close()
	logs := walLogs(1, 10, 1)
	for _, l := range logs {
		l.Type, l.Extensions, l.Data = raft.LogCommand, nil, []byte(fmt.Sprintf("entry %02d", l.Index))
	}
	storeIn(t, s, logs, 10)
	var l raft.Log
	if err := s.GetLog(3, &l); err != nil {
		t.Fatal(err)
	}
	if err := s.flush(); err != nil {
		t.Fatal(err)
	}
	if err := s.GetLog(4, &l); err != nil {
		t.Fatal(err)
	}
	if string(l.Data) != "entry 04" {
		t.Fatalf("entry 4 reads %q", l.Data)
	}
	if string(logs[2].Data) != "entry 03" {
		t.Fatalf("Raft's copy of entry 3 now holds %q", logs[2].Data)
	}
}

// BenchmarkWALStoreLogs: one StoreLogs of 32 entries of 200 bytes (a batch
// at tens of concurrent writers), appended and fdatasynced, as Raft's
// leader and followers do per batch; flushes into raft.db run as usual.
// cpu-us/op is the process's CPU per batch, which the machine's load
// changes less than wall time.
func BenchmarkWALStoreLogs(b *testing.B) {
	s, err := openWALStore(b.TempDir(), testLogger())
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	data := make([]byte, 200)
	next := uint64(1)
	cpu0 := cpuTime()
	for b.Loop() {
		batch := make([]*raft.Log, 32)
		for i := range batch {
			batch[i] = &raft.Log{Index: next, Term: 1, Type: raft.LogCommand, Data: data, AppendedAt: time.Now()}
			next++
		}
		if err := s.StoreLogs(batch); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N), "cpu-us/op")
}

// TestSegmentSeq: only wal-<hex>.log names are segments; anything else in
// the dir (an operator's copy, "123.log") is never read or deleted as one.
func TestSegmentSeq(t *testing.T) {
	for name, want := range map[string]uint64{
		segmentName(1):           1,
		segmentName(0xabc):       0xabc,
		"123.log":                0,
		"wal-xyz.log":            0,
		"wal-0000000000000001":   0,
		"x-wal-00000001.log":     0,
		"wal-0000000000000001.l": 0,
	} {
		if got := segmentSeq(name); got != want {
			t.Errorf("segmentSeq(%q) = %d, want %d", name, got, want)
		}
	}
}
