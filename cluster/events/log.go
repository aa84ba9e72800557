package events

import (
	"errors"

	"github.com/hashicorp/raft"

	"github.com/gpuplane/gpuplane/cluster/auditrec"
	"github.com/gpuplane/gpuplane/fsm"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// ErrCompacted is returned for log entries a server no longer holds: they
// were archived and compacted away (cluster.Cluster.Compact), and are read
// from the archive.
var ErrCompacted = errors.New("compacted")

// LogReader is what the audit and event code reads a Raft log through: the
// live node's store, or a stopped node's log opened read-only
// (audit.OpenOffline).
type LogReader interface {
	FirstIndex() (uint64, error)
	LastIndex() (uint64, error)
	GetLog(index uint64, log *raft.Log) error
}

// LogRanger is a LogReader that can also read a run of entries in one pass.
// The Cursor uses it when the log offers it: replaying a million entries one
// GetLog at a time costs a bolt transaction, a B-tree descent and a fresh
// msgpack decoder (with its type caches) per entry, which is most of the
// reading cost.
type LogRanger interface {
	LogReader
	// RangeLogs calls fn with the entries from..to in index order, stopping at
	// the first error fn returns. With a command entry comes its Envelope
	// decoded ahead (fsm.DecodeEntry of l.Data, for fsm.ApplyEntry), nil
	// with any other. fn may keep none of l, e, e's messages (which may be
	// recycled for later entries) or l.Data (which may be the store's
	// memory) once it returns. A missing index is
	// raft.ErrLogNotFound. ahead, unless nil, is called with each run of
	// entries before fn sees them (zero for entries that are not commands),
	// to prefetch what applying them will read.
	RangeLogs(from, to uint64, ahead func([]fsm.Entry), fn func(l *raft.Log, e *fsm.Entry) error) error
}

// LogFiles is a server's Raft log and what lies beside it that audit reads
// (package audit): the per-entry hash records, the snapshots and, on a
// compacted log, the audit base its replays start from. A live server's
// come from Cluster.LogFiles, a stopped one's from its data dir
// (audit.OpenOffline).
type LogFiles struct {
	Log    LogReader
	Hashes *auditrec.Hashes
	// SnapshotDir holds Raft's snapshots; BasePath is the audit base file.
	SnapshotDir, BasePath string
}

// Cursor returns a cursor over the log that yields the events with index >=
// from matching filter (nil: all); on a compacted log it starts from the
// audit base.
func (f LogFiles) Cursor(from uint64, filter *pb.EventFilter) *Cursor {
	c := NewCursor(f.Log, from, filter)
	c.basePath, c.snapshotDir = f.BasePath, f.SnapshotDir
	return c
}

// StartAtBase places a cursor that has read nothing where the log's replay
// begins: index 1, or just after the audit base of a compacted log, in the
// state as of it. It returns the base's index (0: none); the cursor yields
// events from there on.
func (c *Cursor) StartAtBase() (uint64, error) {
	if err := c.start(); err != nil {
		return 0, err
	}
	c.from = max(c.from, c.next)
	return c.next - 1, nil
}

// StateAt replays the log from its start through index and returns the
// state as it was after that entry (index 0: the empty state).
func (f LogFiles) StateAt(index uint64) (*fsm.FSM, error) {
	cur := f.Cursor(index+1, nil)
	if err := cur.Advance(index, func(*pb.Event) error { return nil }); err != nil {
		return nil, err
	}
	var s *fsm.FSM
	cur.View(func(f *fsm.FSM) { s = f })
	return s, nil
}
