package raftstore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sort"

	"github.com/hashicorp/raft"
	wal "github.com/hashicorp/raft-wal"
)

// Reader is a stopped node's log opened read-only (offline audit): every
// segment checked as Open checks it, then mapped. It changes nothing on
// disk: an unfinished final write is left where it is and not read.
type Reader struct {
	dir   string
	lock  *os.File
	segs  []mappedSeg
	first uint64
	last  uint64
}

// ErrNoLog is returned by OpenReadOnly for a dir without a log.
var ErrNoLog = errors.New("no raft log")

// OpenReadOnly opens the log in dir for reading. It fails at once when an
// agent is writing it, with ErrNoLog when there is none, and with a
// *DamageError when any part of it is damaged.
func OpenReadOnly(dir string) (*Reader, error) {
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w in %s", ErrNoLog, dir)
	}
	lock, err := lockDir(dir, false)
	if err != nil {
		return nil, err
	}
	r := &Reader{dir: dir, lock: lock}
	st, exists, err := loadMeta(dir, false)
	if err == nil && !exists {
		err = fmt.Errorf("%w in %s: no %s", ErrNoLog, dir, metaPath(dir))
	}
	if err == nil {
		r.segs, err = scanLog(dir, st, true, true, nil)
	}
	if err != nil {
		r.Close()
		return nil, err
	}
	for _, s := range r.segs {
		lo, hi := s.info.MinIndex, s.lastIndex()
		if !s.info.SealTime.IsZero() {
			hi = s.info.MaxIndex
		}
		if hi < lo {
			continue
		}
		if r.first == 0 {
			r.first = lo
		}
		r.last = hi
	}
	return r, nil
}

// FirstIndex is the first entry's index, 0 for an empty log.
func (r *Reader) FirstIndex() (uint64, error) { return r.first, nil }

// LastIndex is the last entry's index, 0 for an empty log.
func (r *Reader) LastIndex() (uint64, error) { return r.last, nil }

// GetLog reads one entry; its slices are copies.
func (r *Reader) GetLog(index uint64, l *raft.Log) error {
	raw, err := r.raw(index)
	if err != nil {
		return err
	}
	if err := decodeEntry(raw, l); err != nil {
		return err
	}
	l.Data, l.Extensions = bytes.Clone(l.Data), bytes.Clone(l.Extensions)
	return nil
}

// Range calls fn with the entries from..to in index order, stopping at fn's
// first error. l is reused and its Data and Extensions are the mapped
// file's memory, valid until Close: fn must copy what it keeps past that. A
// missing index is raft.ErrLogNotFound.
func (r *Reader) Range(from, to uint64, fn func(l *raft.Log) error) error {
	var l raft.Log
	for i := from; i <= to && i >= from; i++ {
		raw, err := r.raw(i)
		if err != nil {
			return err
		}
		l = raft.Log{}
		if err := decodeEntry(raw, &l); err != nil {
			return err
		}
		if err := fn(&l); err != nil {
			return err
		}
	}
	return nil
}

// raw is entry index's encoded bytes, checked to be that entry.
func (r *Reader) raw(index uint64) ([]byte, error) {
	if index < r.first || index > r.last || r.first == 0 {
		return nil, fmt.Errorf("%w: %d", raft.ErrLogNotFound, index)
	}
	i := sort.Search(len(r.segs), func(i int) bool { return r.segs[i].info.BaseIndex > index }) - 1
	if i < 0 {
		return nil, fmt.Errorf("%w: %d", raft.ErrLogNotFound, index)
	}
	s := r.segs[i]
	k := index - s.info.BaseIndex
	if k >= uint64(len(s.offsets)) {
		return nil, fmt.Errorf("%w: %d", raft.ErrLogNotFound, index)
	}
	off := int64(s.offsets[k])
	n := int64(binary.LittleEndian.Uint32(s.data[off+4 : off+8]))
	raw := s.data[off+frameHeaderLen : off+frameHeaderLen+n]
	if got, _ := binary.Uvarint(raw); got != index {
		return nil, &DamageError{File: s.path, Offset: off, Index: index, Reason: fmt.Sprintf("the entry there says it is index %d", got)}
	}
	return raw, nil
}

// Close unmaps the files and releases the dir.
func (r *Reader) Close() error {
	err := unmapAll(r.segs)
	r.segs = nil
	if r.lock != nil {
		r.lock.Close()
		r.lock = nil
	}
	return err
}

// decodeEntry decodes raft-wal's BinaryCodec (wal.BinaryCodec.Decode: index,
// term and type as uvarints, data and extensions each a uvarint length and
// the bytes, then AppendedAt in time.MarshalBinary's form) without copying:
// Data and Extensions alias raw. wal.BinaryCodec copies both, which for a
// replay of the whole log is an allocation per entry; TestDecodeEntry
// checks the two agree.
func decodeEntry(raw []byte, l *raft.Log) error {
	d := raw
	uv := func() uint64 {
		v, n := binary.Uvarint(d)
		if n <= 0 {
			d = nil
			return 0
		}
		d = d[n:]
		return v
	}
	bs := func() ([]byte, bool) {
		n := uv()
		if d == nil || n > uint64(len(d)) {
			return nil, false
		}
		if n == 0 {
			return nil, true
		}
		b := d[:n:n]
		d = d[n:]
		return b, true
	}
	l.Index = uv()
	l.Term = uv()
	l.Type = raft.LogType(uv())
	var ok bool
	if l.Data, ok = bs(); !ok {
		return fmt.Errorf("decode log entry %d: %w", l.Index, wal.ErrCorrupt)
	}
	if l.Extensions, ok = bs(); !ok {
		return fmt.Errorf("decode log entry %d: %w", l.Index, wal.ErrCorrupt)
	}
	if err := l.AppendedAt.UnmarshalBinary(d); err != nil {
		return fmt.Errorf("decode log entry %d: %w", l.Index, err)
	}
	return nil
}
