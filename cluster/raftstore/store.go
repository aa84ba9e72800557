package raftstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	wal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/metadb"
	"github.com/hashicorp/raft-wal/segment"
	"github.com/hashicorp/raft-wal/types"
)

// DefaultSegmentSize is the size of each segment file, preallocated when it
// is created. raft-wal's default is 64 MiB; gpuplane's entries are small
// and infrequent (a million take about 200 MB), and every server, test
// cluster and jepsen node preallocates one.
const DefaultSegmentSize = 16 << 20

// Options configure a Store.
type Options struct {
	// Logger gets raft-wal's messages and this package's (an unfinished
	// write discarded, a write refused, the log reopened).
	Logger hclog.Logger
	// SegmentSize overrides DefaultSegmentSize (tests use small segments).
	SegmentSize int
	// VFS, when set, is the file system raft-wal's segments are written
	// through (the power-loss tests' layer); nil is the real one.
	VFS types.VFS
}

// Store is Raft's LogStore and StableStore: raft-wal, checked when it opens
// (see the package doc) and reopened when a write fails.
type Store struct {
	dir  string
	opts Options
	log  hclog.Logger
	lock *os.File

	// mu guards w: every call holds it shared; reopening holds it
	// exclusively, so no call sees a closed WAL.
	mu sync.RWMutex
	w  *wal.WAL
	// meta is wal-meta.db opened alone while the log could not be reopened
	// after a failed write: Raft's term and vote stay readable and
	// writable (hashicorp/raft panics when it cannot save its term).
	meta *metadb.BoltMetaDB
	// verified are the sealed segments read through already: they never
	// change, so reopening does not read them again.
	verified map[uint64]bool

	// tmu guards fill.
	tmu  sync.Mutex
	fill tailFill

	// fmu guards the write failure state.
	fmu       sync.Mutex
	failed    error // the last write's error, until a write succeeds
	nextRetry time.Time
}

var (
	_ raft.LogStore          = (*Store)(nil)
	_ raft.StableStore       = (*Store)(nil)
	_ raft.MonotonicLogStore = (*Store)(nil)
)

// reopenEvery bounds how often a store whose last write failed tries to
// reopen the log: Raft retries a failed append as fast as elections go.
const reopenEvery = 250 * time.Millisecond

// Open opens (or creates) the log in dir for writing. It fails with a
// *DamageError when any segment, or wal-meta.db, is damaged (see
// scanSegment), and at once when another process holds the dir.
func Open(dir string, opts Options) (*Store, error) {
	if opts.SegmentSize <= 0 {
		opts.SegmentSize = DefaultSegmentSize
	}
	if opts.Logger == nil {
		opts.Logger = hclog.NewNullLogger()
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	lock, err := lockDir(dir, true)
	if err != nil {
		return nil, err
	}
	s := &Store{dir: dir, opts: opts, log: opts.Logger, lock: lock, verified: map[uint64]bool{}}
	if s.w, err = s.open(); err != nil {
		s.unlock()
		return nil, err
	}
	return s, nil
}

// open checks the files, repairs what an unclean stop may leave (an
// unfinished write, an unfinished rotation) and opens raft-wal on them.
func (s *Store) open() (*wal.WAL, error) {
	st, exists, err := loadMeta(s.dir, true)
	if err != nil {
		return nil, err
	}
	if !exists {
		// raft-wal would start an empty log and delete every segment it
		// finds: with segments there, their index is what is missing.
		if files, err := segmentFiles(s.dir); err != nil {
			return nil, err
		} else if len(files) > 0 {
			return nil, &DamageError{File: metaPath(s.dir), Reason: fmt.Sprintf("missing, while %d segment files are there: the log's index is lost", len(files))}
		}
	}
	segs, err := scanLog(s.dir, st, false, false, s.verified)
	if err != nil {
		return nil, err
	}
	if n := len(segs); n > 0 && (segs[n-1].missing || segs[n-1].unallocated) {
		if undone, err := s.newTail(st, segs[n-1].segScan); err != nil {
			return nil, err
		} else if undone {
			return s.open() // the previous segment is the tail again
		}
	}
	fill := tailFill{known: true, limit: int64(s.opts.SegmentSize)} // a new log's first segment
	for _, seg := range segs {
		if !seg.info.SealTime.IsZero() {
			s.verified[seg.info.ID] = true
			continue
		}
		fill = tailFill{known: true, limit: int64(seg.info.SizeLimit), offset: seg.good, entries: len(seg.offsets)}
		if seg.tornEnd > seg.good {
			if err := zeroRange(seg.path, seg.good, seg.tornEnd); err != nil {
				return nil, fmt.Errorf("discard an unfinished write in %s: %w", seg.path, err)
			}
			s.log.Warn("raft log: discarded an unfinished final write (the node stopped while writing it; never acknowledged)",
				"file", seg.path, "offset", seg.good, "bytes", seg.tornEnd-seg.good, "last_index", seg.lastIndex())
		}
		if seg.indexStart > 0 {
			rotated, err := s.finishRotation(seg.segScan)
			if err != nil {
				return nil, err
			}
			fill = tailFill{known: true, sealed: !rotated, limit: int64(s.opts.SegmentSize)}
		}
	}
	var vfs types.VFS = newDatasyncFS()
	if s.opts.VFS != nil {
		vfs = s.opts.VFS
	}
	openWAL := func() (*wal.WAL, error) {
		// raft-wal leaves its wal-meta.db handle open when its Open fails;
		// bbolt's lock then blocks every later open of the file in this
		// process, so the handle is closed here.
		meta := &metadb.BoltMetaDB{}
		w, err := wal.Open(s.dir, wal.WithLogger(s.log.Named("wal")), wal.WithSegmentSize(s.opts.SegmentSize),
			wal.WithSegmentFiler(segment.NewFiler(s.dir, wholeFS{vfs})), wal.WithMetaStore(meta))
		if err != nil {
			meta.Close()
		}
		return w, err
	}
	w, err := openWAL()
	if errors.Is(err, syscall.ENOSPC) {
		// The disk filled between the check for room and the new tail's
		// creation, which left no file (wholeFS): the log opens as it
		// was before the rotation, refusing writes until there is room.
		var undone bool
		if undone, err = s.undoRotation("the disk filled while the next segment was created"); undone {
			w, err = openWAL()
			fill = tailFill{known: true, sealed: true}
		}
	}
	if err != nil {
		return nil, fmt.Errorf("open raft log %s: %w", s.dir, err)
	}
	s.tmu.Lock()
	s.fill = fill
	s.tmu.Unlock()
	return w, nil
}

// wholeFS creates a segment file whole or not at all. raft-wal's file
// system creates the file, then preallocates it; when the preallocation
// fails (a full disk) it leaves the file behind, empty or short, and
// raft-wal's next open would append to it without its reservation, so that
// a later stop leaves a tail shorter than its size limit, which no check can
// tell from a truncated one. Here a failed creation removes the file: the
// segment is then missing, which raft-wal handles by creating it again.
type wholeFS struct{ types.VFS }

func (w wholeFS) Create(dir, name string, size uint64) (types.WritableFile, error) {
	f, err := w.VFS.Create(dir, name, size)
	if err == nil || errors.Is(err, os.ErrExist) {
		return f, err // an existing file is not this call's to remove
	}
	if derr := w.VFS.Delete(dir, name); derr != nil && !errors.Is(derr, os.ErrNotExist) {
		return nil, errors.Join(err, fmt.Errorf("remove the segment file the failed creation left: %w", derr))
	}
	return nil, err
}

// newTail readies the tail segment wal-meta.db lists when its file is
// missing or was never fully created (an interrupted rotation): raft-wal
// creates it whole when it opens, for which the file must not be there.
// Without room for it, the rotation is undone instead: the previous
// segment, full and sealed on disk, is the tail again and the log opens
// refusing writes (finishRotation redoes the rotation once there is room).
func (s *Store) newTail(st types.PersistentState, tail *segScan) (undone bool, err error) {
	if tail.unallocated {
		if err := os.Remove(tail.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return false, fmt.Errorf("remove %s, a segment whose creation never completed: %w", tail.path, err)
		}
		if err := syncDir(s.dir); err != nil {
			return false, err
		}
		s.log.Warn("raft log: removed the newest segment file, whose creation (preallocation) never completed; nothing was written to it, and it is created again whole",
			"file", tail.path)
	}
	if len(st.Segments) < 2 {
		return false, nil // no earlier segment to fall back to: raft-wal creates the first
	}
	if free, err := freeBytes(s.dir); err == nil && free < s.roomNeeded() {
		return s.undoRotation(fmt.Sprintf("the disk has %d bytes free, the next segment needs %d", free, s.roomNeeded()))
	}
	return false, nil
}

// undoRotation removes the tail segment wal-meta.db lists when its file is
// missing and the segment before it is sealed: the state before raft-wal's
// rotation recorded the new segment, except that the old one is sealed on
// disk, which Open and finishRotation handle. It reports whether it did.
func (s *Store) undoRotation(why string) (bool, error) {
	var db metadb.BoltMetaDB
	st, err := db.Load(s.dir)
	if err != nil {
		return false, fmt.Errorf("open %s: %w", metaPath(s.dir), err)
	}
	defer db.Close()
	n := len(st.Segments)
	if n < 2 || !st.Segments[n-1].SealTime.IsZero() || st.Segments[n-2].SealTime.IsZero() {
		return false, nil
	}
	tail := st.Segments[n-1]
	if _, err := os.Stat(segmentPath(s.dir, tail)); !errors.Is(err, os.ErrNotExist) {
		return false, err
	}
	prev := &st.Segments[n-2]
	prev.SealTime, prev.MaxIndex, prev.IndexStart = time.Time{}, 0, 0
	st.Segments = st.Segments[:n-1]
	if err := db.CommitState(st); err != nil {
		return false, fmt.Errorf("record in %s that segment %s is not created: %w", metaPath(s.dir), segment.FileName(tail), err)
	}
	delete(s.verified, prev.ID)
	s.log.Warn("raft log: the newest segment is full and the next cannot be created; writes are refused until space is freed",
		"dir", s.dir, "why", why, "room_needed_bytes", s.roomNeeded())
	return true, nil
}

// finishRotation records a tail segment that was sealed on disk as sealed in
// wal-meta.db and lists the next one, as raft-wal's rotation would have
// done: raft-wal itself reopens a sealed tail as its tail and then refuses
// every append (types.ErrSealed). Without room for the next segment's
// preallocation the log opens as it is, for reading; writes are refused
// until there is room and a write reopens it.
func (s *Store) finishRotation(tail *segScan) (bool, error) {
	if free, err := freeBytes(s.dir); err == nil && free < s.roomNeeded() {
		s.log.Warn("raft log: the newest segment is full and the disk has no room for the next; writes are refused until space is freed",
			"dir", s.dir, "free_bytes", free, "room_needed_bytes", s.roomNeeded())
		return false, nil
	}
	var db metadb.BoltMetaDB
	st, err := db.Load(s.dir)
	if err != nil {
		return false, fmt.Errorf("open %s: %w", metaPath(s.dir), err)
	}
	defer db.Close()
	n := len(st.Segments)
	if n == 0 || st.Segments[n-1].ID != tail.info.ID {
		return false, fmt.Errorf("%s changed while the log was being opened", metaPath(s.dir))
	}
	last := tail.lastIndex()
	now := time.Now()
	st.Segments[n-1].SealTime = now
	st.Segments[n-1].MaxIndex = last
	st.Segments[n-1].IndexStart = tail.indexStart
	st.Segments = append(st.Segments, types.SegmentInfo{
		ID: st.NextSegmentID, BaseIndex: last + 1, MinIndex: last + 1,
		SizeLimit: uint32(s.opts.SegmentSize), Codec: wal.CodecBinaryV1, CreateTime: now,
	})
	st.NextSegmentID++
	if err := db.CommitState(st); err != nil {
		return false, fmt.Errorf("record the sealed segment in %s: %w", metaPath(s.dir), err)
	}
	s.log.Info("raft log: finished a segment rotation an earlier stop or a full disk interrupted", "segment", tail.path, "last_index", last)
	return true, nil
}

// metaRoom is the room kept for wal-meta.db beside a new segment: bbolt
// grows its file when a rotation's commit needs pages it has no free ones
// for, and Raft's term and vote are written there too.
const metaRoom = 1 << 20

// roomNeeded is the free space the log waits for before it starts a
// segment: the segment's preallocation and metaRoom. Write errors name it.
func (s *Store) roomNeeded() uint64 { return uint64(s.opts.SegmentSize) + metaRoom }

// zeroRange writes zeros over [from, to) of a file and syncs it.
func zeroRange(path string, from, to int64) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.WriteAt(make([]byte, to-from), from); err != nil {
		return err
	}
	return f.Sync()
}

// Dir is the log's directory.
func (s *Store) Dir() string { return s.dir }

// ErrClosed is returned by a store that is closed, or whose reopening after
// a failed write failed.
var ErrClosed = errors.New("raft log closed")

func (s *Store) current() (*wal.WAL, func(), error) {
	s.mu.RLock()
	if s.w == nil {
		s.mu.RUnlock()
		s.fmu.Lock()
		err := s.failed
		s.fmu.Unlock()
		if err == nil {
			err = ErrClosed
		}
		return nil, func() {}, err
	}
	return s.w, s.mu.RUnlock, nil
}

// FirstIndex implements raft.LogStore.
func (s *Store) FirstIndex() (uint64, error) {
	w, done, err := s.current()
	if err != nil {
		return 0, err
	}
	defer done()
	return w.FirstIndex()
}

// LastIndex implements raft.LogStore.
func (s *Store) LastIndex() (uint64, error) {
	w, done, err := s.current()
	if err != nil {
		return 0, err
	}
	defer done()
	return w.LastIndex()
}

// GetLog implements raft.LogStore.
func (s *Store) GetLog(index uint64, l *raft.Log) error {
	w, done, err := s.current()
	if err != nil {
		return err
	}
	defer done()
	return w.GetLog(index, l)
}

// StoreLog implements raft.LogStore.
func (s *Store) StoreLog(l *raft.Log) error { return s.StoreLogs([]*raft.Log{l}) }

// StoreLogs implements raft.LogStore: the entries are on disk (fsynced) when
// it returns nil. After a failed write the next one first reopens the log
// (at most every reopenEvery), so a node recovers by itself once the cause
// (a full disk) is gone.
func (s *Store) StoreLogs(logs []*raft.Log) error {
	if err := s.recoverWrites(); err != nil {
		return err
	}
	var frames int64
	commands := false
	for _, l := range logs {
		frames += frameLen(encodedLen(l))
		commands = commands || l.Type == raft.LogCommand
	}
	if commands {
		if err := s.keepReserve(frames, len(logs)); err != nil {
			return err
		}
	}
	w, done, err := s.current()
	if err != nil {
		return err
	}
	err = w.StoreLogs(logs)
	done()
	if err == nil {
		s.tmu.Lock()
		s.fill.add(frames, len(logs), int64(s.opts.SegmentSize))
		s.tmu.Unlock()
	}
	if err != nil {
		err = s.refused(err)
		s.fmu.Lock()
		s.failed, s.nextRetry = err, time.Now().Add(reopenEvery)
		s.fmu.Unlock()
		s.log.Error("raft log: write refused", "error", err)
		return err
	}
	return nil
}

// refused words a failed write's error for the operator.
func (s *Store) refused(err error) error {
	switch {
	case errors.Is(err, syscall.ENOSPC):
		return fmt.Errorf("%w: raft log %s: the disk is full (%w); writes resume by themselves once %d bytes are free (the next %d-byte log segment and 1 MiB for its index)",
			ErrWritesRefused, s.dir, err, s.roomNeeded(), s.opts.SegmentSize)
	case errors.Is(err, types.ErrSealed):
		return fmt.Errorf("%w: raft log %s: the newest log segment is full and the next could not be created (is the disk full?); writes resume by themselves once %d bytes are free (the next %d-byte segment and 1 MiB for its index)",
			ErrWritesRefused, s.dir, s.roomNeeded(), s.opts.SegmentSize)
	}
	return fmt.Errorf("raft log %s: write refused: %w", s.dir, err)
}

// recoverWrites reopens the log after a failed write: raft-wal keeps a
// segment it sealed but could not replace (no space for the next one) as
// its tail and refuses every append to it until it is opened again.
func (s *Store) recoverWrites() error {
	s.fmu.Lock()
	failed, next := s.failed, s.nextRetry
	if failed == nil {
		s.fmu.Unlock()
		return nil
	}
	if time.Now().Before(next) {
		s.fmu.Unlock()
		return failed
	}
	s.nextRetry = time.Now().Add(reopenEvery)
	s.fmu.Unlock()
	if free, err := freeBytes(s.dir); err == nil && free < s.roomNeeded() {
		// Still full: reopening would find no room for the next segment.
		return failed
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.w != nil {
		if err := s.w.Close(); err != nil {
			s.log.Warn("raft log: close before reopening", "error", err)
		}
		s.w = nil
	}
	if s.meta != nil {
		s.meta.Close()
		s.meta = nil
	}
	w, err := s.open()
	s.fmu.Lock()
	defer s.fmu.Unlock()
	if err != nil {
		s.failed = fmt.Errorf("raft log %s: reopen after a failed write: %w", s.dir, err)
		s.log.Error("raft log: cannot reopen; the log refuses writes and reads, term and vote stay in wal-meta.db", "error", s.failed)
		m := &metadb.BoltMetaDB{}
		if _, err := m.Load(s.dir); err == nil {
			s.meta = m
		}
		return s.failed
	}
	s.w, s.failed = w, nil
	s.log.Info("raft log: reopened after a failed write; writes are accepted again", "dir", s.dir)
	return nil
}

// DeleteRange implements raft.LogStore.
func (s *Store) DeleteRange(min, max uint64) error {
	w, done, err := s.current()
	if err != nil {
		return err
	}
	defer done()
	if last, err := w.LastIndex(); err == nil && max >= last {
		// A truncated tail is rewritten in ways the fill does not follow;
		// the next open measures it again.
		s.tmu.Lock()
		s.fill.known = false
		s.tmu.Unlock()
	}
	return w.DeleteRange(min, max)
}

// IsMonotonic implements raft.MonotonicLogStore: raft-wal stores no gaps, so
// Raft must empty the log before it installs a snapshot.
func (s *Store) IsMonotonic() bool { return true }

// stable runs fn on the stable store: raft-wal's, or wal-meta.db opened
// alone while the log cannot be reopened.
func (s *Store) stable(fn func(st interface {
	SetStable(k, v []byte) error
	GetStable(k []byte) ([]byte, error)
}) error) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	switch {
	case s.w != nil:
		return fn(walStable{s.w})
	case s.meta != nil:
		return fn(s.meta)
	}
	s.fmu.Lock()
	defer s.fmu.Unlock()
	if s.failed != nil {
		return s.failed
	}
	return ErrClosed
}

// walStable is raft-wal's StableStore under metadb's method names.
type walStable struct{ w *wal.WAL }

func (w walStable) SetStable(k, v []byte) error        { return w.w.Set(k, v) }
func (w walStable) GetStable(k []byte) ([]byte, error) { return w.w.Get(k) }

// Set implements raft.StableStore.
func (s *Store) Set(k, v []byte) error {
	return s.stable(func(st interface {
		SetStable(k, v []byte) error
		GetStable(k []byte) ([]byte, error)
	}) error {
		return st.SetStable(k, v)
	})
}

// Get implements raft.StableStore.
func (s *Store) Get(k []byte) (v []byte, err error) {
	err = s.stable(func(st interface {
		SetStable(k, v []byte) error
		GetStable(k []byte) ([]byte, error)
	}) error {
		v, err = st.GetStable(k)
		return err
	})
	return v, err
}

// SetUint64 implements raft.StableStore, in raft-wal's encoding (8 bytes,
// little-endian).
func (s *Store) SetUint64(k []byte, v uint64) error {
	return s.Set(k, binary.LittleEndian.AppendUint64(nil, v))
}

// GetUint64 implements raft.StableStore.
func (s *Store) GetUint64(k []byte) (uint64, error) {
	v, err := s.Get(k)
	switch {
	case err != nil:
		return 0, err
	case len(v) == 0:
		return 0, nil
	case len(v) != 8:
		return 0, fmt.Errorf("stable store key %q: %d bytes, not a uint64", k, len(v))
	}
	return binary.LittleEndian.Uint64(v), nil
}

// Close closes the log and releases the dir.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var err error
	if s.w != nil {
		err = s.w.Close()
		s.w = nil
	}
	if s.meta != nil {
		err = errors.Join(err, s.meta.Close())
		s.meta = nil
	}
	s.unlock()
	return err
}

func (s *Store) unlock() {
	if s.lock != nil {
		s.lock.Close()
		s.lock = nil
	}
}

// LockPath is the lock file Open takes in a log dir.
func LockPath(dir string) string { return filepath.Join(dir, "LOCK") }
