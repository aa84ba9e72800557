package raftstore

import (
	"bytes"
	"testing"
)

// Segments written through datasyncFS read back, and a sync that cannot
// happen (the file is closed) is an error, never a silent success: raft-wal
// acknowledges entries on the strength of it.
func TestDatasyncFSSyncs(t *testing.T) {
	dir := t.TempDir()
	vfs := newDatasyncFS()
	f, err := vfs.Create(dir, "seg", 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	data := []byte("an entry")
	for i := range 3 { // the first sync is raft-wal's own (fsync, and the dir), later ones fdatasync
		if _, err := f.WriteAt(data, int64(i*len(data))); err != nil {
			t.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			t.Fatalf("sync %d: %v", i, err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err == nil {
		t.Fatal("sync of a closed segment reported success")
	}
	r, err := vfs.OpenReader(dir, "seg")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	got := make([]byte, 3*len(data))
	if _, err := r.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if want := bytes.Repeat(data, 3); !bytes.Equal(got, want) {
		t.Fatalf("read back %q, want %q", got, want)
	}
	w, err := vfs.OpenWriter(dir, "seg")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for i := range 2 {
		if err := w.Sync(); err != nil {
			t.Fatalf("sync %d of a reopened segment: %v", i, err)
		}
	}
}
