package cluster

import (
	"encoding/binary"
	"fmt"

	"github.com/hashicorp/go-msgpack/v2/codec"
	"github.com/hashicorp/raft"
	"go.etcd.io/bbolt"
)

// logRanger is a LogReader that can also read a run of entries in one pass.
// The Cursor uses it when the log offers it: replaying a million entries one
// GetLog at a time costs a bolt transaction, a B-tree descent and a fresh
// msgpack decoder (with its type caches) per entry, which is most of the
// reading cost.
type logRanger interface {
	LogReader
	// RangeLogs calls fn with the entries from..to in index order, stopping at
	// the first error fn returns. The *raft.Log is reused between calls; fn
	// may keep l.Data (it is not reused) but not l. A missing index is
	// raft.ErrLogNotFound.
	RangeLogs(from, to uint64, fn func(l *raft.Log) error) error
}

// boltLogs reads raft-boltdb/v2's log bucket of a bbolt file directly: the
// offline reader (OpenOffline), which owns the file read-only, so the store's
// own code never runs on it. The format is raft-boltdb's: key the index as
// 8 big-endian bytes, value the raft.Log in msgpack, decoded here with the
// same codec and default handle raft-boltdb uses.
type boltLogs struct {
	db *bbolt.DB
}

var (
	boltLogsBucket = []byte("logs") // raft-boltdb's dbLogs
	// msgpackHandle is shared by every decoder: a handle caches per-type
	// decoding plans, so reusing one (it is safe for concurrent use once
	// configured) is what makes decoding cheap. raft-boltdb builds a new one
	// per GetLog; decoding is the same, its options being the defaults.
	msgpackHandle = &codec.MsgpackHandle{}
)

var _ logRanger = (*boltLogs)(nil)

func (b *boltLogs) FirstIndex() (uint64, error) { return b.edge(true) }
func (b *boltLogs) LastIndex() (uint64, error)  { return b.edge(false) }

func (b *boltLogs) edge(first bool) (uint64, error) {
	var idx uint64
	err := b.db.View(func(tx *bbolt.Tx) error {
		bk := tx.Bucket(boltLogsBucket)
		if bk == nil {
			return nil
		}
		var k []byte
		if first {
			k, _ = bk.Cursor().First()
		} else {
			k, _ = bk.Cursor().Last()
		}
		if len(k) == 8 {
			idx = binary.BigEndian.Uint64(k)
		}
		return nil
	})
	return idx, err
}

func (b *boltLogs) GetLog(index uint64, l *raft.Log) error {
	return b.db.View(func(tx *bbolt.Tx) error {
		bk := tx.Bucket(boltLogsBucket)
		if bk == nil {
			return raft.ErrLogNotFound
		}
		var key [8]byte
		binary.BigEndian.PutUint64(key[:], index)
		val := bk.Get(key[:])
		if val == nil {
			return raft.ErrLogNotFound
		}
		*l = raft.Log{}
		return codec.NewDecoderBytes(val, msgpackHandle).Decode(l)
	})
}

func (b *boltLogs) RangeLogs(from, to uint64, fn func(*raft.Log) error) error {
	if from > to {
		return nil
	}
	return b.db.View(func(tx *bbolt.Tx) error {
		bk := tx.Bucket(boltLogsBucket)
		if bk == nil {
			return raft.ErrLogNotFound
		}
		var key [8]byte
		binary.BigEndian.PutUint64(key[:], from)
		cur := bk.Cursor()
		dec := codec.NewDecoderBytes(nil, msgpackHandle)
		var l raft.Log
		var slab byteSlab
		want := from
		for k, v := cur.Seek(key[:]); want <= to; k, v = cur.Next() {
			if len(k) != 8 || binary.BigEndian.Uint64(k) != want {
				return fmt.Errorf("%w: %d", raft.ErrLogNotFound, want)
			}
			// The hand-written decoder handles the entries raft-boltdb
			// writes; anything else goes to the library.
			l = raft.Log{}
			if !decodeStoredLog(v, &l, &slab) {
				l = raft.Log{}
				dec.ResetBytes(v)
				if err := dec.Decode(&l); err != nil {
					return fmt.Errorf("decode log entry %d: %w", want, err)
				}
			}
			if err := fn(&l); err != nil {
				return err
			}
			want++
		}
		return nil
	})
}

// openBoltLogs opens a raft.db read-only for boltLogs.
func openBoltLogs(path string, opts *bbolt.Options) (*boltLogs, error) {
	db, err := bbolt.Open(path, 0o600, opts)
	if err != nil {
		return nil, err
	}
	return &boltLogs{db: db}, nil
}

func (b *boltLogs) Close() error { return b.db.Close() }
