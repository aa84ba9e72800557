package cluster

import (
	"bytes"
	"fmt"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/hashicorp/go-msgpack/v2/codec"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"go.etcd.io/bbolt"
)

// TestDecodeStoredLog checks the hand-written raft.Log decoder against the
// library on entries raft-boltdb itself wrote (both of its time formats,
// every log type, edge values), and that whatever it takes on it decodes
// exactly as the library does, leaving the rest to the library.
func TestDecodeStoredLog(t *testing.T) {
	at := time.Date(2025, 1, 1, 12, 30, 45, 123456789, time.UTC)
	conf := raft.EncodeConfiguration(raft.Configuration{Servers: []raft.Server{
		{Suffrage: raft.Voter, ID: "s1", Address: "10.0.0.1:7001"}}})
	var logs []*raft.Log
	idx := uint64(0)
	add := func(l raft.Log) {
		idx++
		if l.Index == 0 {
			l.Index = idx
		}
		logs = append(logs, &l)
	}
	for _, typ := range []raft.LogType{raft.LogCommand, raft.LogNoop, raft.LogAddPeerDeprecated,
		raft.LogRemovePeerDeprecated, raft.LogBarrier, raft.LogConfiguration} {
		data := []byte("payload")
		if typ == raft.LogConfiguration {
			data = conf
		}
		if typ == raft.LogNoop || typ == raft.LogBarrier {
			data = nil
		}
		add(raft.Log{Term: 3, Type: typ, Data: data, AppendedAt: at})
		add(raft.Log{Term: 3, Type: typ, Data: data})
	}
	for _, n := range []int{0, 1, 31, 32, 255, 256, 65535, 65536, 200_000} {
		add(raft.Log{Term: 1, Type: raft.LogCommand, Data: bytes.Repeat([]byte{byte(n)}, n), AppendedAt: at})
	}
	add(raft.Log{Term: 1, Type: raft.LogCommand, Data: []byte{1}, Extensions: []byte("ext"), AppendedAt: at})
	add(raft.Log{Term: 1, Type: raft.LogCommand, Data: []byte{1}, Extensions: []byte{}, AppendedAt: at})
	add(raft.Log{Term: 1, Type: raft.LogCommand, Data: []byte{1}, AppendedAt: at.In(time.FixedZone("x", 3600))})
	add(raft.Log{Term: 1, Type: raft.LogCommand, Data: []byte{1}, AppendedAt: at.Local()})
	add(raft.Log{Term: 1 << 40, Type: raft.LogCommand, Data: []byte{2}, AppendedAt: time.Unix(0, 0)})
	for _, i := range []uint64{127, 128, 255, 256, 65535, 65536, 1<<32 - 1, 1 << 32, 1<<64 - 1} {
		add(raft.Log{Index: i, Term: i, Type: raft.LogCommand, Data: []byte{3}, AppendedAt: at})
	}

	for _, newTime := range []bool{false, true} {
		t.Run(fmt.Sprintf("newTimeFormat=%v", newTime), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "raft.db")
			store, err := raftboltdb.New(raftboltdb.Options{Path: path, MsgpackUseNewTimeFormat: newTime})
			if err != nil {
				t.Fatal(err)
			}
			if err := store.StoreLogs(logs); err != nil {
				t.Fatal(err)
			}
			if err := store.Close(); err != nil {
				t.Fatal(err)
			}
			db, err := bbolt.Open(path, 0o600, &bbolt.Options{ReadOnly: true})
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			fast := 0
			err = db.View(func(tx *bbolt.Tx) error {
				return tx.Bucket(boltLogsBucket).ForEach(func(k, v []byte) error {
					var want raft.Log
					if err := codec.NewDecoderBytes(v, &codec.MsgpackHandle{}).Decode(&want); err != nil {
						t.Fatalf("library decode: %v", err)
					}
					got, ok := decodeAll(v)
					if ok {
						fast++
						if !reflect.DeepEqual(got, want) {
							t.Errorf("entry %d: decoded %+v, library %+v", want.Index, got, want)
						}
					}
					// Every truncation and a changed byte (in the first
					// 600: the header and fields of every entry) either
					// decodes as the library does or is left to it.
					for i := range min(len(v), 600) {
						checkAgainstLibrary(t, v[:i])
						m := bytes.Clone(v)
						m[i] ^= 0x5a
						checkAgainstLibrary(t, m)
					}
					return nil
				})
			})
			if err != nil {
				t.Fatal(err)
			}
			// The store's default format is what the fast path is for: all
			// of it but the empty byte strings must take it.
			if !newTime && fast < len(logs)-2 {
				t.Errorf("only %d of %d entries took the fast path", fast, len(logs))
			}
			t.Logf("%d of %d entries decoded by the fast path", fast, len(logs))
		})
	}
}

func decodeAll(v []byte) (raft.Log, bool) {
	var l raft.Log
	var slab byteSlab
	return l, decodeStoredLog(v, &l, &slab)
}

// checkAgainstLibrary fails when the fast decoder accepts v but decodes it
// differently from the library, or accepts what the library rejects.
func checkAgainstLibrary(t *testing.T, v []byte) {
	t.Helper()
	got, ok := decodeAll(v)
	if !ok {
		return
	}
	var want raft.Log
	if err := codec.NewDecoderBytes(v, &codec.MsgpackHandle{}).Decode(&want); err != nil {
		t.Fatalf("fast decoder accepted %x, the library rejects it: %v", v, err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%x: decoded %+v, library %+v", v, got, want)
	}
}
