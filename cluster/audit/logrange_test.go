package audit

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/gpuplane/gpuplane/cluster"
	"github.com/gpuplane/gpuplane/cluster/events"
	"github.com/gpuplane/gpuplane/cluster/raftstore"
	"github.com/gpuplane/gpuplane/cluster/replaylog"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// entryReader hides RangeLogs: the Cursor then reads entry by entry with
// GetLog and decodes every envelope itself, the path the live store takes.
type entryReader struct{ events.LogReader }

// rangeLog writes a data dir holding n workload entries (package
// replaylog) and opens it offline.
func rangeLog(t *testing.T, n uint64) (string, *Offline) {
	t.Helper()
	dir := t.TempDir()
	if err := replaylog.Build(dir, cluster.LogDir(dir), n, cluster.NewRequestID); err != nil {
		t.Fatal(err)
	}
	off, err := OpenOffline(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { off.Close() })
	return dir, off
}

// TestRangeLogsMatchesGetLog checks the pipelined reader (read and decode on
// a goroutine of their own, entries aliasing bbolt's memory, request-id
// prefetch) against reading entry by entry: the same state, hash and
// events, from index 1 and from the middle of a batch, over ranges shorter
// and longer than a batch.
func TestRangeLogsMatchesGetLog(t *testing.T) {
	_, off := rangeLog(t, 3*rangeBatch+17)
	last, err := off.LastIndex()
	if err != nil {
		t.Fatal(err)
	}
	plain := &History{files: events.LogFiles{Log: entryReader{off.store}}}
	for _, upTo := range []uint64{1, rangeBatch - 1, rangeBatch, rangeBatch + 1, last} {
		got, err := off.StateAt(upTo)
		if err != nil {
			t.Fatal(err)
		}
		want, err := plain.StateAt(upTo)
		if err != nil {
			t.Fatal(err)
		}
		if got.Hash() != want.Hash() || !proto.Equal(got.State(), want.State()) {
			t.Fatalf("state at %d: ranged hash %s, entry by entry %s", upTo, got.Hash(), want.Hash())
		}
	}
	for _, from := range []uint64{1, 100, rangeBatch + 3, last} {
		var got, want []*pb.Event
		if err := off.Cursor(from, nil).Advance(last, func(ev *pb.Event) error { got = append(got, ev); return nil }); err != nil {
			t.Fatal(err)
		}
		if err := plain.Cursor(from, nil).Advance(last, func(ev *pb.Event) error { want = append(want, ev); return nil }); err != nil {
			t.Fatal(err)
		}
		if len(got) != len(want) {
			t.Fatalf("from %d: %d events ranged, %d entry by entry", from, len(got), len(want))
		}
		for i := range got {
			if !proto.Equal(got[i], want[i]) {
				t.Fatalf("from %d: event %d differs:\n%v\n%v", from, got[i].Index, got[i], want[i])
			}
		}
	}
}

// TestRangeLogsStops checks that a yield error or panic stops the reader
// and releases its transaction (the data dir then closes), and that the
// entries before the error were all applied.
func TestRangeLogsStops(t *testing.T) {
	_, off := rangeLog(t, 4*rangeBatch)
	last, _ := off.LastIndex()
	stopAt := uint64(rangeBatch + 7)
	errMine := errors.New("mine")
	cur := off.Cursor(1, nil)
	err := cur.Advance(last, func(ev *pb.Event) error {
		if ev.Index == stopAt {
			return errMine
		}
		return nil
	})
	if !errors.Is(err, errMine) || cur.Next() != stopAt+1 {
		t.Fatalf("Advance: %v, next %d; want %v at %d", err, cur.Next(), errMine, stopAt+1)
	}
	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Fatalf("recovered %v", r)
			}
		}()
		off.Cursor(1, nil).Advance(last, func(ev *pb.Event) error {
			if ev.Index == stopAt {
				panic("boom")
			}
			return nil
		})
	}()
	done := make(chan error, 1)
	go func() { done <- off.Close() }()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestOfflineDamagedEntry flips one byte inside an entry in the middle of a
// stopped node's log: opening it offline (what every audit command does)
// fails, naming the segment file, the offset and the entry index from which
// the log is unreadable, instead of replaying a different history.
func TestOfflineDamagedEntry(t *testing.T) {
	dir, off := rangeLog(t, 3*rangeBatch)
	r := off.store.Reader
	var raw []byte
	target := uint64(2*rangeBatch + 5)
	if err := r.Range(target, target, func(l *raft.Log) error { raw = bytes.Clone(l.Data); return nil }); err != nil {
		t.Fatal(err)
	}
	off.Close()
	segs, _ := filepath.Glob(filepath.Join(cluster.LogDir(dir), "*.wal"))
	if len(segs) != 1 {
		t.Fatalf("segments %v, want one", segs)
	}
	data, err := os.ReadFile(segs[0])
	if err != nil {
		t.Fatal(err)
	}
	at := bytes.Index(data, raw)
	if at < 0 || bytes.Contains(data[at+1:], raw) {
		t.Fatalf("entry %d's data not found once in %s", target, segs[0])
	}
	at += len(raw) / 2
	data[at] ^= 0x10
	if err := os.WriteFile(segs[0], data, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = OpenOffline(dir)
	var dmg *raftstore.DamageError
	if !errors.As(err, &dmg) {
		t.Fatalf("OpenOffline of a damaged log: %v, want a DamageError", err)
	}
	// The whole log was written in one batch (replaylog.Build): the damage
	// makes it unreadable from its first entry.
	if dmg.File != segs[0] || dmg.Index != 1 || dmg.Offset <= int64(at) || !strings.Contains(err.Error(), "checksum mismatch") {
		t.Fatalf("damage reported as %q (file %s, offset %d, index %d); the byte flipped is at %d of %s", err, dmg.File, dmg.Offset, dmg.Index, at, segs[0])
	}
}

// TestAdvanceHeadsMatchesEvents checks AdvanceHeads, which audit verify
// runs, against the events Advance yields: the same entries, kinds, hash
// heads and summaries, ranged and entry by entry.
func TestAdvanceHeadsMatchesEvents(t *testing.T) {
	_, off := rangeLog(t, 2*rangeBatch+5)
	last, err := off.LastIndex()
	if err != nil {
		t.Fatal(err)
	}
	type head struct {
		index   uint64
		command bool
		hash    string
		summary string
	}
	for _, h := range []*History{off.History, {files: events.LogFiles{Log: entryReader{off.store}}}} {
		for _, from := range []uint64{1, rangeBatch + 3} {
			var got, want []head
			err := h.Cursor(from, nil).AdvanceHeads(last, func(index uint64, command bool, hash string, describe func() string) error {
				got = append(got, head{index, command, hash, describe()})
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			err = h.Cursor(from, nil).Advance(last, func(ev *pb.Event) error {
				want = append(want, head{ev.Index, ev.Type == pb.EventType_EVENT_TYPE_COMMAND, ev.Hash, ev.Summary})
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(want) {
				t.Fatalf("from %d: %d heads, %d events", from, len(got), len(want))
			}
			for i := range got {
				if got[i] != want[i] && (want[i].command || got[i].index != want[i].index || got[i].hash != want[i].hash) {
					t.Fatalf("from %d: head %+v, event %+v", from, got[i], want[i])
				}
			}
		}
	}
}
