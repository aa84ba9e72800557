package raftstore

import (
	"encoding/binary"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
)

// encodeLegacyRecord writes entries in the earlier write-ahead segments'
// record format (what decodeLegacySegment reads), to build a data dir as the
// earlier version left it.
func encodeLegacyRecord(logs []*raft.Log) []byte {
	buf := make([]byte, 8)
	for _, l := range logs {
		buf = binary.AppendUvarint(buf, l.Index)
		buf = binary.AppendUvarint(buf, l.Term)
		buf = binary.AppendUvarint(buf, uint64(l.Type))
		var at int64
		if !l.AppendedAt.IsZero() {
			at = l.AppendedAt.UnixNano()
		}
		buf = binary.AppendVarint(buf, at)
		buf = binary.AppendUvarint(buf, uint64(len(l.Data)))
		buf = append(buf, l.Data...)
		buf = binary.AppendUvarint(buf, uint64(len(l.Extensions)))
		buf = append(buf, l.Extensions...)
	}
	binary.LittleEndian.PutUint32(buf[0:4], uint32(len(buf)-8))
	binary.LittleEndian.PutUint32(buf[4:8], crc32.Checksum(buf[8:], legacyCRC))
	return buf
}

// TestMigrateLegacy converts a data dir of the earlier layout as a killed
// node left it (entries 1..300 in raft.db, 301..340 only in its write-ahead
// segments, the second ending in a partial record): every entry and the
// stable store arrive in the new log, and the old files are gone.
func TestMigrateLegacy(t *testing.T) {
	raftDir := t.TempDir()
	rng := rand.New(rand.NewPCG(9, 9))
	var all []*raft.Log
	for i := uint64(1); i <= 340; i++ {
		all = append(all, entry(i, rng))
	}
	old, err := raftboltdb.New(raftboltdb.Options{Path: filepath.Join(raftDir, "raft.db")})
	if err != nil {
		t.Fatal(err)
	}
	if err := old.StoreLogs(all[:300]); err != nil {
		t.Fatal(err)
	}
	if err := old.SetUint64([]byte("CurrentTerm"), 7); err != nil { // LastVoteTerm never set: a server that never voted
		t.Fatal(err)
	}
	if err := old.Set([]byte("LastVoteCand"), []byte("n2")); err != nil {
		t.Fatal(err)
	}
	old.Close()
	walDir := filepath.Join(raftDir, "wal")
	os.MkdirAll(walDir, 0o700)
	// Entries 290..320 (overlapping raft.db, as a segment does until it is
	// deleted), then 321..340 and a record cut short.
	seg1 := encodeLegacyRecord(all[289:320])
	seg2 := append(encodeLegacyRecord(all[320:340]), encodeLegacyRecord(all[:3])[:20]...)
	os.WriteFile(filepath.Join(walDir, "wal-0000000000000001.log"), seg1, 0o600)
	os.WriteFile(filepath.Join(walDir, "wal-0000000000000002.log"), append(seg2, make([]byte, 4096)...), 0o600)

	logDir := filepath.Join(raftDir, "log")
	if !HasLegacy(raftDir) {
		t.Fatal("HasLegacy: false for a raft.db")
	}
	if err := MigrateLegacy(raftDir, logDir, Options{SegmentSize: smallSegments}); err != nil {
		t.Fatal(err)
	}
	if HasLegacy(raftDir) {
		t.Fatal("raft.db still there after the conversion")
	}
	if _, err := os.Stat(walDir); !os.IsNotExist(err) {
		t.Fatalf("old write-ahead log still there: %v", err)
	}
	checkAll(t, logDir, all)
	s, err := Open(logDir, Options{SegmentSize: smallSegments})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	last, _ := s.LastIndex()
	term, _ := s.GetUint64([]byte("CurrentTerm"))
	cand, _ := s.Get([]byte("LastVoteCand"))
	if last != 340 || term != 7 || string(cand) != "n2" {
		t.Fatalf("after conversion: last index %d, term %d, vote %q; want 340, 7, n2", last, term, cand)
	}
}

// TestMigrateLegacyInterrupted: a conversion that finished its new log but
// crashed before removing the old files only removes them on the next
// start; the new log is kept as it is.
func TestMigrateLegacyInterrupted(t *testing.T) {
	raftDir := t.TempDir()
	logDir := filepath.Join(raftDir, "log")
	acked := writeLog(t, logDir, 30, 4, 5)
	if err := os.WriteFile(filepath.Join(raftDir, "raft.db"), []byte("stale"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := MigrateLegacy(raftDir, logDir, Options{}); err != nil {
		t.Fatal(err)
	}
	if HasLegacy(raftDir) {
		t.Fatal("stale raft.db not removed")
	}
	checkAll(t, logDir, acked)
}
