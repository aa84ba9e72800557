package cluster

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/go-msgpack/v2/codec"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"go.etcd.io/bbolt"
)

// storedLogCases are entries at the edges of every msgpack width the
// encoder chooses between.
func storedLogCases() []*raft.Log {
	var out []*raft.Log
	ints := []uint64{0, 1, 0x7f, 0x80, 0xff, 0x100, 0xffff, 0x10000, 0xffffffff, 0x100000000, math.MaxUint64}
	sizes := []int{-1, 0, 1, 31, 32, 255, 256, 0xffff, 0x10000}
	times := []time.Time{{}, time.Unix(1700000000, 123456789), time.Now(), time.Now().UTC(),
		time.Date(2026, 11, 30, 10, 0, 0, 1, time.FixedZone("x", 5*3600+30*60)), time.Unix(0, 0), time.Date(1, 1, 1, 0, 0, 0, 1, time.UTC)}
	bytesOf := func(n int) []byte {
		if n < 0 {
			return nil
		}
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(i * 7)
		}
		return b
	}
	for i, v := range ints {
		out = append(out, &raft.Log{Index: v, Term: ints[len(ints)-1-i], Type: raft.LogType(v), Data: bytesOf(sizes[i%len(sizes)]),
			Extensions: bytesOf(sizes[(i+3)%len(sizes)]), AppendedAt: times[i%len(times)]})
	}
	for _, n := range sizes {
		for _, t := range times {
			out = append(out, &raft.Log{Index: uint64(n + 2), Term: 3, Type: raft.LogCommand, Data: bytesOf(n), AppendedAt: t})
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		out = append(out, &raft.Log{Index: r.Uint64() >> r.IntN(64), Term: r.Uint64() >> r.IntN(64), Type: raft.LogType(r.IntN(7)),
			Data: bytesOf(r.IntN(300) - 1), Extensions: bytesOf(r.IntN(40) - 20), AppendedAt: time.Unix(r.Int64N(4e9), r.Int64N(1e9))})
	}
	return out
}

// TestEncodeStoredLogMatchesRaftBoltDB: the hand encoding is byte for byte
// what raft-boltdb/v2 writes, and decodes (by the library and by
// decodeStoredLog) to the same entry.
func TestEncodeStoredLogMatchesRaftBoltDB(t *testing.T) {
	h := &codec.MsgpackHandle{}
	h.TimeNotBuiltin = true
	for i, l := range storedLogCases() {
		var want []byte
		if err := codec.NewEncoderBytes(&want, h).Encode(l); err != nil {
			t.Fatal(err)
		}
		got := appendStoredLog([]byte("prefix"), l)
		if !bytes.HasPrefix(got, []byte("prefix")) || !bytes.Equal(got[6:], want) {
			t.Fatalf("case %d %+v:\n got %x\nwant %x", i, *l, got[6:], want)
		}
		if storedLogSize(l) < len(want) {
			t.Fatalf("case %d: storedLogSize %d < %d", i, storedLogSize(l), len(want))
		}
	}
}

// TestBoltStoreInterchangesWithRaftBoltDB: a raft.db written by boltStore
// reads back the same through raft-boltdb, and one written by raft-boltdb
// through boltStore, log and stable store alike.
func TestBoltStoreInterchangesWithRaftBoltDB(t *testing.T) {
	logs := storedLogCases()
	for i, l := range logs {
		l.Index = uint64(i + 1)
	}
	check := func(t *testing.T, s interface {
		GetLog(uint64, *raft.Log) error
		FirstIndex() (uint64, error)
		LastIndex() (uint64, error)
		GetUint64([]byte) (uint64, error)
		Get([]byte) ([]byte, error)
	}) {
		t.Helper()
		first, _ := s.FirstIndex()
		last, _ := s.LastIndex()
		if first != 1 || last != uint64(len(logs)-5) {
			t.Fatalf("log holds %d..%d, want 1..%d", first, last, len(logs)-5)
		}
		for _, w := range logs[:len(logs)-5] {
			var got raft.Log
			if err := s.GetLog(w.Index, &got); err != nil {
				t.Fatal(err)
			}
			if got.Index != w.Index || got.Term != w.Term || got.Type != w.Type || !bytes.Equal(got.Data, w.Data) ||
				!bytes.Equal(got.Extensions, w.Extensions) || !got.AppendedAt.Equal(w.AppendedAt) {
				t.Fatalf("entry %d: got %+v, want %+v", w.Index, got, *w)
			}
		}
		if v, err := s.GetUint64([]byte("CurrentTerm")); err != nil || v != 42 {
			t.Fatalf("CurrentTerm: %d, %v", v, err)
		}
		if _, err := s.Get([]byte("missing")); err == nil || err.Error() != "not found" {
			t.Fatalf("missing key: %v, want raft-boltdb's \"not found\"", err)
		}
	}
	write := func(s interface {
		StoreLogs([]*raft.Log) error
		DeleteRange(uint64, uint64) error
		SetUint64([]byte, uint64) error
	}) {
		for i := 0; i < len(logs); i += 17 {
			if err := s.StoreLogs(logs[i:min(i+17, len(logs))]); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.DeleteRange(uint64(len(logs)-4), uint64(len(logs))); err != nil {
			t.Fatal(err)
		}
		if err := s.SetUint64([]byte("CurrentTerm"), 42); err != nil {
			t.Fatal(err)
		}
	}
	for _, writer := range []string{"boltStore", "raft-boltdb"} {
		t.Run(fmt.Sprintf("written by %s", writer), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "raft.db")
			if writer == "boltStore" {
				s, err := openBoltStore(path, nil)
				if err != nil {
					t.Fatal(err)
				}
				write(s)
				check(t, s)
				s.Close()
				rb, err := raftboltdb.New(raftboltdb.Options{Path: path})
				if err != nil {
					t.Fatal(err)
				}
				check(t, rb)
				rb.Close()
			} else {
				rb, err := raftboltdb.New(raftboltdb.Options{Path: path})
				if err != nil {
					t.Fatal(err)
				}
				write(rb)
				rb.Close()
			}
			s, err := openBoltStore(path, &bbolt.Options{Timeout: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			check(t, s)
		})
	}
}

// TestBoltStoreGetLogCopies: an entry read from raft.db stays intact after
// the file grows and bbolt maps it anew (Raft keeps entries it read).
func TestBoltStoreGetLogCopies(t *testing.T) {
	s, err := openBoltStore(filepath.Join(t.TempDir(), "raft.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	want := bytes.Repeat([]byte("entry one "), 50)
	if err := s.StoreLogs([]*raft.Log{{Index: 1, Term: 1, Type: raft.LogCommand, Data: want}}); err != nil {
		t.Fatal(err)
	}
	var l raft.Log
	if err := s.GetLog(1, &l); err != nil {
		t.Fatal(err)
	}
	big := make([]byte, 1<<20)
	for i := uint64(2); i < 66; i++ { // 64 MiB: several remaps
		if err := s.StoreLogs([]*raft.Log{{Index: i, Term: 1, Type: raft.LogCommand, Data: big}}); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(l.Data, want) {
		t.Fatalf("entry 1 read before the file grew now holds %q", l.Data[:20])
	}
}

// TestBoltStoreFillsPages: the log's keys only grow, so its pages are
// filled before they split; at bbolt's default they stay half empty and
// raft.db, which is never compacted, takes twice the disk.
func TestBoltStoreFillsPages(t *testing.T) {
	s, err := openBoltStore(filepath.Join(t.TempDir(), "raft.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	data := make([]byte, 150)
	index := uint64(1)
	for range 400 { // batches of 50, as the write-ahead log's flushes bring them
		logs := make([]*raft.Log, 50)
		for j := range logs {
			logs[j] = &raft.Log{Index: index, Term: 1, Type: raft.LogCommand, Data: data}
			index++
		}
		if err := s.StoreLogs(logs); err != nil {
			t.Fatal(err)
		}
	}
	err = s.db.View(func(tx *bbolt.Tx) error {
		st := tx.Bucket(boltLogsBucket).Stats()
		if used := float64(st.LeafInuse) / float64(st.LeafAlloc); used < 0.8 {
			return fmt.Errorf("log pages %.0f%% full (%d of %d bytes), want 80%% or more", 100*used, st.LeafInuse, st.LeafAlloc)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
