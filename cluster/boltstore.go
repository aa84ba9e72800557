package cluster

import (
	"encoding/binary"
	"errors"

	"github.com/hashicorp/go-msgpack/v2/codec"
	"github.com/hashicorp/raft"
	"go.etcd.io/bbolt"
)

// boltStore is raft.db, the log's record and Raft's StableStore, written in
// raft-boltdb/v2's format: bucket "logs" maps an index (8 bytes, big
// endian) to the raft.Log in msgpack, bucket "conf" holds term and vote. So
// raft-boltdb, the offline reader (boltLogs) and earlier gpuplane versions
// read it as before. It stands in for raftboltdb.BoltStore for one reason:
// moving the write-ahead log's entries into raft.db (walStore's flush)
// encoded every entry with go-msgpack's reflection, 3% of a server's CPU in
// the commit benchmark; encodeStoredLog writes the same bytes directly
// (TestEncodeStoredLogMatchesRaftBoltDB checks them against the library).
type boltStore struct {
	*boltLogs // reading: FirstIndex, LastIndex, GetLog, RangeLogs, Close
}

var (
	boltConfBucket = []byte("conf") // raft-boltdb's dbConf
	// errKeyNotFound is what raft-boltdb returns for a missing key; Raft
	// recognises it by its text.
	errKeyNotFound = errors.New("not found")
)

// openBoltStore opens (creating) raft.db for writing and makes sure its
// buckets exist.
func openBoltStore(path string, opts *bbolt.Options) (*boltStore, error) {
	db, err := bbolt.Open(path, 0o600, opts)
	if err != nil {
		return nil, err
	}
	err = db.Update(func(tx *bbolt.Tx) error {
		if _, err := tx.CreateBucketIfNotExists(boltLogsBucket); err != nil {
			return err
		}
		_, err := tx.CreateBucketIfNotExists(boltConfBucket)
		return err
	})
	if err != nil {
		db.Close()
		return nil, err
	}
	return &boltStore{&boltLogs{db: db}}, nil
}

// StoreLog stores one entry.
func (b *boltStore) StoreLog(l *raft.Log) error { return b.StoreLogs([]*raft.Log{l}) }

// StoreLogs stores entries in one (synced) commit.
func (b *boltStore) StoreLogs(logs []*raft.Log) error {
	size := 0
	for _, l := range logs {
		size += storedLogSize(l)
	}
	// bbolt keeps keys and values by reference until the commit: one
	// buffer holds them all.
	buf := make([]byte, 0, size+8*len(logs))
	return b.db.Update(func(tx *bbolt.Tx) error {
		bk := tx.Bucket(boltLogsBucket)
		// Keys only ever grow (a new entry follows the last): fill pages
		// before splitting them, as etcd does for its sequential buckets,
		// instead of bbolt's half-full default, which leaves every page of
		// the log half empty (twice the file, twice the pages per commit).
		bk.FillPercent = 0.9
		for _, l := range logs {
			start := len(buf)
			buf = binary.BigEndian.AppendUint64(buf, l.Index)
			buf = appendStoredLog(buf, l)
			if err := bk.Put(buf[start:start+8], buf[start+8:]); err != nil {
				return err
			}
		}
		return nil
	})
}

// DeleteRange deletes the entries min..max, inclusive.
func (b *boltStore) DeleteRange(min, max uint64) error {
	var key [8]byte
	binary.BigEndian.PutUint64(key[:], min)
	return b.db.Update(func(tx *bbolt.Tx) error {
		cur := tx.Bucket(boltLogsBucket).Cursor()
		for k, _ := cur.Seek(key[:]); k != nil && binary.BigEndian.Uint64(k) <= max; k, _ = cur.Next() {
			if err := cur.Delete(); err != nil {
				return err
			}
		}
		return nil
	})
}

// Set, Get, SetUint64 and GetUint64 are Raft's StableStore (term and vote),
// as raft-boltdb keeps it.
func (b *boltStore) Set(k, v []byte) error {
	return b.db.Update(func(tx *bbolt.Tx) error { return tx.Bucket(boltConfBucket).Put(k, v) })
}

func (b *boltStore) Get(k []byte) ([]byte, error) {
	var v []byte
	err := b.db.View(func(tx *bbolt.Tx) error {
		if val := tx.Bucket(boltConfBucket).Get(k); val != nil {
			v = append([]byte(nil), val...)
		}
		return nil
	})
	if err == nil && v == nil {
		err = errKeyNotFound
	}
	return v, err
}

func (b *boltStore) SetUint64(k []byte, v uint64) error {
	return b.Set(k, binary.BigEndian.AppendUint64(nil, v))
}

func (b *boltStore) GetUint64(k []byte) (uint64, error) {
	v, err := b.Get(k)
	if err != nil {
		return 0, err
	}
	if len(v) != 8 {
		return 0, errors.New("stable store: value is not 8 bytes")
	}
	return binary.BigEndian.Uint64(v), nil
}

// appendStoredLog appends l as raft-boltdb/v2 stores it with its default
// options (go-msgpack's MsgpackHandle with TimeNotBuiltin): a map of the
// struct's fields by name in sorted order, unsigned integers in their
// shortest form, byte slices as legacy raw strings (fixstr, str16, str32;
// nil as nil), AppendedAt as time.Time's MarshalBinary form in a
// raw string. decodeStoredLog reads it back.
func appendStoredLog(buf []byte, l *raft.Log) []byte {
	var tb [16]byte
	t, err := l.AppendedAt.AppendBinary(tb[:0])
	if err != nil {
		// A time MarshalBinary refuses (a zone offset that is not whole
		// minutes): whatever the library makes of it.
		return append(buf, storedLogByLibrary(l)...)
	}
	buf = append(buf, 0x86) // fixmap, 6 entries
	buf = append(append(buf, 0xaa), "AppendedAt"...)
	buf = appendMsgpackBytes(buf, t)
	buf = append(append(buf, 0xa4), "Data"...)
	buf = appendMsgpackBytes(buf, l.Data)
	buf = append(append(buf, 0xaa), "Extensions"...)
	buf = appendMsgpackBytes(buf, l.Extensions)
	buf = append(append(buf, 0xa5), "Index"...)
	buf = appendMsgpackUint(buf, l.Index)
	buf = append(append(buf, 0xa4), "Term"...)
	buf = appendMsgpackUint(buf, l.Term)
	buf = append(append(buf, 0xa4), "Type"...)
	return appendMsgpackUint(buf, uint64(l.Type))
}

// storedLogSize bounds appendStoredLog's output for l.
func storedLogSize(l *raft.Log) int {
	return 64 + len(l.Data) + len(l.Extensions) + 32
}

func appendMsgpackUint(buf []byte, v uint64) []byte {
	switch {
	case v <= 0x7f:
		return append(buf, byte(v))
	case v <= 0xff:
		return append(buf, 0xcc, byte(v))
	case v <= 0xffff:
		return binary.BigEndian.AppendUint16(append(buf, 0xcd), uint16(v))
	case v <= 0xffffffff:
		return binary.BigEndian.AppendUint32(append(buf, 0xce), uint32(v))
	}
	return binary.BigEndian.AppendUint64(append(buf, 0xcf), v)
}

func appendMsgpackBytes(buf, b []byte) []byte {
	switch n := len(b); {
	case b == nil:
		return append(buf, 0xc0)
	case n <= 31:
		buf = append(buf, 0xa0|byte(n))
	case n <= 0xffff:
		buf = binary.BigEndian.AppendUint16(append(buf, 0xda), uint16(n))
	default:
		buf = binary.BigEndian.AppendUint32(append(buf, 0xdb), uint32(n))
	}
	return append(buf, b...)
}

// storedLogByLibrary is l encoded by go-msgpack exactly as raft-boltdb/v2
// does.
func storedLogByLibrary(l *raft.Log) []byte {
	var out []byte
	h := &codec.MsgpackHandle{}
	h.TimeNotBuiltin = true
	if err := codec.NewEncoderBytes(&out, h).Encode(l); err != nil {
		panic("encode raft log entry: " + err.Error()) // raft.Log always encodes
	}
	return out
}
