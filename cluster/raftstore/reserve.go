package raftstore

import (
	"errors"
	"fmt"

	"github.com/hashicorp/raft"
	wal "github.com/hashicorp/raft-wal"
)

// ErrWritesRefused is what every refusal of a write for want of disk space
// wraps (Admit's, and a failed append's while the disk is full).
var ErrWritesRefused = errors.New("write refused")

// tailFill is how far the newest segment is written, mirroring raft-wal's
// writer (its frames, and the rule by which it seals a segment), so that
// Admit can keep the segment's last bytes for the entries a leader writes
// of its own.
type tailFill struct {
	known   bool  // false after a truncation of the tail, until the next open
	sealed  bool  // full and sealed on disk; no next segment yet
	limit   int64 // the segment's size limit
	offset  int64 // end of its last batch; 0 before the first (the file header goes with it)
	entries int
}

// add accounts for a batch raft-wal appended: entries whose frames take
// frames bytes.
func (f *tailFill) add(frames int64, entries int, nextLimit int64) {
	if !f.known || f.sealed {
		return
	}
	batch := frames
	if f.offset == 0 {
		batch += fileHeaderLen
	}
	f.entries += entries
	if f.offset+batch+indexFrameLen(f.entries) > f.limit {
		// raft-wal sealed it and started the next.
		f.offset, f.entries, f.limit = 0, 0, nextLimit
		return
	}
	f.offset += batch + frameHeaderLen
}

// left is how many bytes of the segment a batch of entries whose frames
// take frames bytes would leave, its commit and the segment's index counted.
func (f *tailFill) left(frames int64, entries int) int64 {
	used := f.offset + frames + frameHeaderLen + indexFrameLen(f.entries+entries)
	if f.offset == 0 {
		used += fileHeaderLen
	}
	return f.limit - used
}

func frameLen(n int64) int64 { return frameHeaderLen + n + padLen(n) }

// maxEntryOverhead bounds what raft-wal's codec adds to an entry's data:
// index, term, type and two lengths as varints, and a binary time.
const maxEntryOverhead = 5*10 + 16

func indexFrameLen(entries int) int64 {
	if entries == 0 {
		return 0
	}
	n := int64(entries) * 4
	return frameHeaderLen + n + padLen(n)
}

type countWriter struct{ n int64 }

func (c *countWriter) Write(p []byte) (int, error) { c.n += int64(len(p)); return len(p), nil }

func encodedLen(l *raft.Log) int64 {
	var c countWriter
	if err := (&wal.BinaryCodec{}).Encode(l, &c); err != nil {
		return int64(len(l.Data)+len(l.Extensions)) + maxEntryOverhead
	}
	return c.n
}

// reserveFor is the part of a segment Admit keeps for a leader's own
// entries while the disk has no room for the next segment: its no-op on
// election and the barrier a linearizable read needs once per term, some
// fifty bytes each, a thousand of them.
func reserveFor(limit int64) int64 { return min(64<<10, limit/8) }

// Admit says whether a command of size bytes may be proposed: nil, or an
// error wrapping ErrWritesRefused when the disk has no room for the next
// segment and the command would take the newest segment's last
// reserveFor bytes (or it is full already, or the last write failed). Raft
// steps its leader down when an append fails, so a refused command that
// reached the log would cost the cluster its leader, and a single server
// its reads, every time it is tried; refused here it costs nothing, and the
// reserve keeps room for the entries a leader must write to be elected and
// to serve linearizable reads.
func (s *Store) Admit(size int) error {
	if err := s.recoverWrites(); errors.Is(err, ErrWritesRefused) {
		return err
	} else if err != nil {
		return fmt.Errorf("%w: %w", ErrWritesRefused, err)
	}
	return s.keepReserve(frameLen(int64(size)+maxEntryOverhead), 1)
}

// keepReserve refuses a batch of commands whose frames take frames bytes
// when it would take the reserve while the disk has no room for the next
// segment. StoreLogs checks it too, for the commands that passed Admit
// together and would take the reserve only together (a leader steps down
// once for them; Admit refuses the next).
func (s *Store) keepReserve(frames int64, entries int) error {
	s.tmu.Lock()
	f := s.fill
	s.tmu.Unlock()
	if !f.known || (!f.sealed && f.left(frames, entries) >= reserveFor(f.limit)) {
		return nil
	}
	free, err := freeBytes(s.dir)
	if err != nil || free >= s.roomNeeded() {
		return nil
	}
	why := fmt.Sprintf("the newest log segment's last %d bytes are kept for the leader's own entries (elections, linearizable reads)", reserveFor(f.limit))
	if f.sealed {
		why = "the newest log segment is full and the next cannot be created"
	}
	return fmt.Errorf("%w: raft log %s: the disk is full (%d bytes free) and %s; writes resume by themselves once %d bytes are free (the next %d-byte segment and 1 MiB for its index)",
		ErrWritesRefused, s.dir, free, why, s.roomNeeded(), s.opts.SegmentSize)
}

// Refusing returns why the log refuses writes (the last write failed), or
// nil.
func (s *Store) Refusing() error {
	s.fmu.Lock()
	defer s.fmu.Unlock()
	return s.failed
}
