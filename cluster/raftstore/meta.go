package raftstore

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"time"

	"github.com/hashicorp/raft-wal/metadb"
	"github.com/hashicorp/raft-wal/types"
	"go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// metaPath is raft-wal's metadata file in a log dir.
func metaPath(dir string) string { return filepath.Join(dir, metadb.FileName) }

// loadMeta reads the segment list from a log dir's wal-meta.db read-only,
// checking the whole bbolt file on the way (checkBolt): a truncated or
// garbled file is a *DamageError, never a crash. exists is false when there
// is no wal-meta.db (a new log).
func loadMeta(dir string, writable bool) (st types.PersistentState, exists bool, err error) {
	path := metaPath(dir)
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return st, false, nil
	} else if err != nil {
		return st, false, err
	}
	err = checkBolt(path, writable, func(tx *bbolt.Tx) error {
		b := tx.Bucket([]byte(metadb.MetaBucket))
		if b == nil || tx.Bucket([]byte(metadb.StableBucket)) == nil {
			return &DamageError{File: path, Reason: "raft-wal's buckets are missing"}
		}
		raw := b.Get([]byte(metadb.MetaKey))
		if raw == nil {
			return nil // a log that has not stored its state yet
		}
		if err := json.Unmarshal(raw, &st); err != nil {
			return &DamageError{File: path, Reason: fmt.Sprintf("segment list: %v", err)}
		}
		return nil
	})
	return st, true, err
}

// checkBolt checks a bbolt file and runs fn on it, read-only, turning what
// damage makes bbolt do into a *DamageError rather than a crash:
//
//   - a file shorter than its meta page says (truncated): bbolt maps the file
//     and a read of a page past its end faults (SIGBUS), which kills the
//     process wherever it happens, so the size is checked before bbolt
//     opens it;
//   - garbled pages: bbolt panics (invalid page type) or faults reading
//     them; every page reachable from the root (buckets, keys, values) is
//     read here, with faults turned into panics (debug.SetPanicOnFault), and
//     panics recovered.
//
// With writable the file is opened for writing, which also reads its
// freelist, as raft-wal's own handle will (the caller holds the dir's lock).
func checkBolt(path string, writable bool, fn func(*bbolt.Tx) error) error {
	if err := checkBoltSize(path); err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() {
		debug.SetPanicOnFault(true)
		defer func() {
			if r := recover(); r != nil {
				done <- &DamageError{File: path, Reason: fmt.Sprintf("unreadable bbolt file: %v", r)}
			}
		}()
		db, err := bbolt.Open(path, 0o600, &bbolt.Options{ReadOnly: !writable, Timeout: time.Second})
		if err != nil {
			if errors.Is(err, berrors.ErrTimeout) {
				done <- fmt.Errorf("open %s: in use by another process", path)
				return
			}
			done <- &DamageError{File: path, Reason: fmt.Sprintf("not a readable bbolt file: %v", err)}
			return
		}
		defer db.Close()
		done <- db.View(func(tx *bbolt.Tx) error {
			if err := tx.ForEach(func(_ []byte, b *bbolt.Bucket) error { return walkBucket(b) }); err != nil {
				return err
			}
			return fn(tx)
		})
	}()
	return <-done
}

// walkBucket reads every key and value of b and its nested buckets.
func walkBucket(b *bbolt.Bucket) error {
	return b.ForEach(func(k, v []byte) error {
		if v == nil {
			if nb := b.Bucket(k); nb != nil {
				return walkBucket(nb)
			}
		}
		return nil
	})
}

// checkBoltSize reads a bbolt file's two meta pages (bbolt's documented
// layout: a 16-byte page header, then magic, version, page size, flags, the
// root bucket, the freelist page, the high-water page id, the transaction id
// and an FNV-64a checksum of what precedes it) and fails when the file is
// shorter than the pages the newest valid meta says it has.
func checkBoltSize(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	size := fi.Size()
	const metaOff, metaLen = 16, 64
	var hwm uint64
	var best uint64
	found := false
	for _, pageSize := range []int64{int64(os.Getpagesize()), 4096} {
		for page := int64(0); page < 2; page++ {
			buf := make([]byte, metaOff+metaLen)
			if _, err := f.ReadAt(buf, page*pageSize); err != nil {
				continue
			}
			m := buf[metaOff:]
			if binary.LittleEndian.Uint32(m[0:4]) != 0xED0CDAED || int64(binary.LittleEndian.Uint32(m[8:12])) != pageSize {
				continue
			}
			h := fnv.New64a()
			h.Write(m[:56])
			if h.Sum64() != binary.LittleEndian.Uint64(m[56:64]) {
				continue
			}
			if txid := binary.LittleEndian.Uint64(m[48:56]); !found || txid > best {
				best, hwm, found = txid, binary.LittleEndian.Uint64(m[40:48])*uint64(pageSize), true
			}
		}
		if found {
			break
		}
	}
	if !found {
		return &DamageError{File: path, Reason: fmt.Sprintf("no valid bbolt meta page (file of %d bytes)", size)}
	}
	if uint64(size) < hwm {
		return &DamageError{File: path, Offset: size, Reason: fmt.Sprintf("the file is %d bytes but its meta page says it has %d: truncated", size, hwm)}
	}
	return nil
}

// segmentFiles lists the raft-wal segment files in a log dir.
func segmentFiles(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".wal") {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// stableKeys are the keys hashicorp/raft keeps in its stable store.
var stableKeys = []string{"CurrentTerm", "LastVoteTerm", "LastVoteCand"}

// ReadStable reads the stable store's keys (Raft's term and vote) from a
// log dir's wal-meta.db, read-only, for a server that sets its log aside.
func ReadStable(dir string) (map[string][]byte, error) {
	out := map[string][]byte{}
	if _, err := os.Stat(metaPath(dir)); errors.Is(err, fs.ErrNotExist) {
		return out, nil
	}
	err := checkBolt(metaPath(dir), false, func(tx *bbolt.Tx) error {
		b := tx.Bucket([]byte(metadb.StableBucket))
		if b == nil {
			return nil
		}
		for _, k := range stableKeys {
			if v := b.Get([]byte(k)); v != nil {
				out[k] = bytes.Clone(v)
			}
		}
		return nil
	})
	return out, err
}
