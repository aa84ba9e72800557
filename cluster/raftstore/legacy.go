package raftstore

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"github.com/hashicorp/raft-wal/migrate"
	"go.etcd.io/bbolt"
)

// The layout of gpuplane before this package: raft.db (bbolt in
// raft-boltdb/v2's format: the whole log and the stable store) and, in
// front of it, write-ahead segments under wal/ holding the newest entries
// until they were moved into raft.db. Both are only read here, to convert
// a data dir on its first start.
const (
	legacyDBFile = "raft.db"
	legacyWALDir = "wal"
)

// HasLegacy reports whether raftDir (a data dir's raft/) holds a log in the
// earlier layout.
func HasLegacy(raftDir string) bool {
	_, err := os.Stat(filepath.Join(raftDir, legacyDBFile))
	return err == nil
}

// MigrateLegacy converts a log in the earlier layout under raftDir into a
// raft-wal log in logDir, then removes the old files. It copies every entry
// raft.db holds and those only its write-ahead segments hold (a node killed
// before it moved them), and the stable store (term, vote). The new log is
// built in a temporary dir and renamed into place, so a crash at any point
// leaves either the old layout whole or the new log whole (then the old
// files are removed on the next start). It does nothing without a legacy
// log.
func MigrateLegacy(raftDir, logDir string, opts Options) error {
	dbPath := filepath.Join(raftDir, legacyDBFile)
	if !HasLegacy(raftDir) {
		return nil
	}
	if _, err := os.Stat(metaPath(logDir)); err == nil {
		// Converted before a crash that left the old files behind.
		return removeLegacy(raftDir)
	}
	log := opts.Logger
	if log == nil {
		log = hclog.NewNullLogger()
	}
	if err := checkBolt(dbPath, false, func(*bbolt.Tx) error { return nil }); err != nil {
		return fmt.Errorf("convert the raft log of an earlier version: %w", err)
	}
	old, err := raftboltdb.New(raftboltdb.Options{Path: dbPath, BoltOptions: &bbolt.Options{ReadOnly: true, Timeout: time.Second}})
	if err != nil {
		return fmt.Errorf("convert the raft log of an earlier version: open %s: %w", dbPath, err)
	}
	defer old.Close()
	last, err := old.LastIndex()
	if err != nil {
		return err
	}
	tail, err := readLegacyTail(filepath.Join(raftDir, legacyWALDir), last)
	if err != nil {
		return fmt.Errorf("convert the raft log of an earlier version: write-ahead log %s: %w", filepath.Join(raftDir, legacyWALDir), err)
	}
	src := &legacyLog{BoltStore: old, boltLast: last, tail: tail}
	if len(tail) > 0 {
		src.boltLast = tail[0].Index - 1
	}

	tmp := logDir + ".converting"
	if err := os.RemoveAll(tmp); err != nil {
		return err
	}
	dst, err := Open(tmp, opts)
	if err != nil {
		return err
	}
	ctx := context.Background()
	if err := migrate.CopyLogs(ctx, dst, src, 4<<20, nil); err != nil {
		dst.Close()
		return fmt.Errorf("convert the raft log of an earlier version: %w", err)
	}
	if err := copyStable(dst, old); err != nil {
		dst.Close()
		return fmt.Errorf("convert the raft log of an earlier version: stable store: %w", err)
	}
	first, _ := dst.FirstIndex()
	newLast, _ := dst.LastIndex()
	if err := dst.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, logDir); err != nil {
		return err
	}
	if err := syncDir(raftDir); err != nil {
		return err
	}
	log.Info("raft log: converted the log of an earlier version (raft.db) to raft-wal", "dir", logDir, "first_index", first, "last_index", newLast, "entries_from_wal", len(tail))
	return removeLegacy(raftDir)
}

// copyStable copies the keys hashicorp/raft keeps in its stable store (as
// migrate.CopyStable does, which fails on a key never set: a server that
// never voted has no LastVoteTerm).
func copyStable(dst *Store, src *raftboltdb.BoltStore) error {
	for _, k := range []string{"CurrentTerm", "LastVoteTerm"} {
		v, err := src.GetUint64([]byte(k))
		if errors.Is(err, raftboltdb.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return fmt.Errorf("%s: %w", k, err)
		}
		if err := dst.SetUint64([]byte(k), v); err != nil {
			return err
		}
	}
	v, err := src.Get([]byte("LastVoteCand"))
	if errors.Is(err, raftboltdb.ErrKeyNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("LastVoteCand: %w", err)
	}
	return dst.Set([]byte("LastVoteCand"), v)
}

func removeLegacy(raftDir string) error {
	if err := os.RemoveAll(filepath.Join(raftDir, legacyWALDir)); err != nil {
		return err
	}
	if err := os.Remove(filepath.Join(raftDir, legacyDBFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return syncDir(raftDir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// legacyLog is raft.db's log followed by the entries only the write-ahead
// segments hold: the source migrate.CopyLogs reads.
type legacyLog struct {
	*raftboltdb.BoltStore
	boltLast uint64
	tail     []*raft.Log // tail[i].Index == boltLast+1+i
}

func (l *legacyLog) FirstIndex() (uint64, error) {
	if l.boltLast == 0 && len(l.tail) > 0 {
		return l.tail[0].Index, nil
	}
	return l.BoltStore.FirstIndex()
}

func (l *legacyLog) LastIndex() (uint64, error) {
	if len(l.tail) > 0 {
		return l.tail[len(l.tail)-1].Index, nil
	}
	return l.BoltStore.LastIndex()
}

func (l *legacyLog) GetLog(index uint64, out *raft.Log) error {
	if index <= l.boltLast {
		return l.BoltStore.GetLog(index, out)
	}
	if i := index - l.boltLast - 1; i < uint64(len(l.tail)) {
		*out = *l.tail[i]
		return nil
	}
	return raft.ErrLogNotFound
}

// readLegacyTail reads the earlier write-ahead segments under dir and
// returns the entries they hold after index last (raft.db's last), in index
// order: what a node killed before moving them into raft.db had
// acknowledged. A later record for an index replaces an earlier one; a
// partial last record (never acknowledged) is ignored; the entries must
// continue raft.db's log without a gap.
func readLegacyTail(dir string, last uint64) ([]*raft.Log, error) {
	segs, err := legacySegments(dir)
	if err != nil {
		return nil, err
	}
	byIndex := map[uint64]*raft.Log{}
	for _, name := range segs {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return nil, err
		}
		for _, l := range decodeLegacySegment(data) {
			if l.Index > last {
				byIndex[l.Index] = l
			}
		}
	}
	if len(byIndex) == 0 {
		return nil, nil
	}
	idx := slices.Sorted(maps.Keys(byIndex))
	if idx[0] != last+1 && last > 0 {
		return nil, fmt.Errorf("the log in raft.db ends at %d but the write-ahead log goes on from %d", last, idx[0])
	}
	tail := make([]*raft.Log, 0, len(idx))
	for i, x := range idx {
		if i > 0 && x != idx[i-1]+1 {
			return nil, fmt.Errorf("write-ahead log entries %d..%d are missing", idx[i-1]+1, x-1)
		}
		tail = append(tail, byIndex[x])
	}
	return tail, nil
}

// legacySegments lists the segment files (wal-<hex seq>.log) under dir in
// append order; a missing dir holds none.
func legacySegments(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	seq := func(name string) uint64 {
		hex, ok := strings.CutPrefix(name, "wal-")
		if !ok {
			return 0
		}
		if hex, ok = strings.CutSuffix(hex, ".log"); !ok {
			return 0
		}
		n, _ := strconv.ParseUint(hex, 16, 64)
		return n
	}
	var names []string
	for _, e := range ents {
		if seq(e.Name()) > 0 {
			names = append(names, e.Name())
		}
	}
	slices.SortFunc(names, func(a, b string) int { return cmp.Compare(seq(a), seq(b)) })
	return names, nil
}

var legacyCRC = crc32.MakeTable(crc32.Castagnoli)

// decodeLegacySegment returns the entries of a legacy segment's whole
// records. A record is one append: its payload's length and CRC-32C (4 bytes
// little-endian each), then each entry as uvarint index, term, type, varint
// appended-at (unix nanoseconds, 0 for none), data and extensions (uvarint
// length first). Zeros end the records (segments were zero-filled).
func decodeLegacySegment(data []byte) []*raft.Log {
	var logs []*raft.Log
	for len(data) >= 8 {
		n := int(binary.LittleEndian.Uint32(data[0:4]))
		sum := binary.LittleEndian.Uint32(data[4:8])
		if n == 0 || n > len(data)-8 || crc32.Checksum(data[8:8+n], legacyCRC) != sum {
			break
		}
		entries, ok := decodeLegacyPayload(data[8 : 8+n])
		if !ok {
			break
		}
		logs = append(logs, entries...)
		data = data[8+n:]
	}
	return logs
}

func decodeLegacyPayload(p []byte) ([]*raft.Log, bool) {
	r := bytes.NewReader(p)
	var logs []*raft.Log
	for r.Len() > 0 {
		var l raft.Log
		var typ uint64
		var at int64
		var err error
		if l.Index, err = binary.ReadUvarint(r); err != nil {
			return nil, false
		}
		if l.Term, err = binary.ReadUvarint(r); err != nil {
			return nil, false
		}
		if typ, err = binary.ReadUvarint(r); err != nil || typ > 255 {
			return nil, false
		}
		l.Type = raft.LogType(typ)
		if at, err = binary.ReadVarint(r); err != nil {
			return nil, false
		}
		if at != 0 {
			l.AppendedAt = time.Unix(0, at)
		}
		var ok bool
		if l.Data, ok = readLegacyBytes(r); !ok {
			return nil, false
		}
		if l.Extensions, ok = readLegacyBytes(r); !ok {
			return nil, false
		}
		logs = append(logs, &l)
	}
	return logs, true
}

func readLegacyBytes(r *bytes.Reader) ([]byte, bool) {
	n, err := binary.ReadUvarint(r)
	if err != nil || n > uint64(r.Len()) {
		return nil, false
	}
	if n == 0 {
		return nil, true
	}
	b := make([]byte, n)
	_, err = r.Read(b)
	return b, err == nil
}
