package cluster

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"go.etcd.io/bbolt"
)

// Data dir layout (see DESIGN.md):
//
//	<data-dir>/node-id             the node name this data dir belongs to
//	<data-dir>/raft/raft.db        bbolt: the whole Raft log from index 1, and term/vote
//	<data-dir>/raft/wal/           the log's newest entries, until they are moved into
//	                               raft.db (within half a second; see walStore)
//	<data-dir>/raft/snapshots/     state snapshots (the last two), for fast restarts
const (
	nodeIDFile   = "node-id"
	raftDir      = "raft"
	raftDBFile   = "raft.db"
	snapshotKeep = 2
)

// RaftDBPath is where the Raft log of a data dir lives.
func RaftDBPath(dataDir string) string { return filepath.Join(dataDir, raftDir, raftDBFile) }

// checkNodeID binds a data dir to one node name. Raft's server id is the node
// name, so reusing a data dir under another name would present one log under
// two identities.
func checkNodeID(dataDir, name string) error {
	path := filepath.Join(dataDir, nodeIDFile)
	have, err := os.ReadFile(path)
	switch {
	case err == nil:
		if got := string(bytes.TrimSpace(have)); got != name {
			return fmt.Errorf("data dir %s belongs to node %q, not %q: use --node-name %s or another --data-dir", dataDir, got, name, got)
		}
		return nil
	case !errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("read node id: %w", err)
	}
	return writeFileSync(path, []byte(name+"\n"))
}

// writeFileSync writes a file atomically and durably: temp file, fsync,
// rename, fsync of the directory.
func writeFileSync(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("sync %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	dir, err := os.Open(filepath.Dir(path))
	if err != nil {
		return fmt.Errorf("sync dir of %s: %w", path, err)
	}
	defer dir.Close()
	return dir.Sync()
}

// openLogStore opens the bbolt file that holds Raft's log and its
// StableStore (walStore writes the log into it), in raft-boltdb/v2's format
// (boltStore).
//
//   - NoSync is false: every commit is fsynced, so raft.db is consistent
//     after a power loss (the write-ahead log holds what it lacks).
//   - FreelistMapType (etcd's choice) keeps page allocation O(1) as the file
//     grows; the log is never compacted, so the file only grows.
//   - NoFreelistSync stays false, unlike etcd: because nothing is ever
//     deleted, the freelist holds only copy-on-write pages and is cheap to
//     write, whereas skipping it makes every open scan the whole, ever-growing
//     file to rebuild it.
//   - Timeout makes a second process on the same data dir fail at once with
//     a clear error instead of waiting forever on the file lock.
//   - InitialMmapSize 1 GiB (address space, not memory; etcd reserves 10
//     GiB): bbolt otherwise remaps the file, blocking readers, each time
//     it doubles on its way there.
func openLogStore(dataDir string) (*boltStore, error) {
	path := RaftDBPath(dataDir)
	store, err := openBoltStore(path, &bbolt.Options{
		Timeout:         time.Second,
		FreelistType:    bbolt.FreelistMapType,
		InitialMmapSize: 1 << 30,
	})
	if errors.Is(err, bbolt.ErrTimeout) {
		return nil, fmt.Errorf("open %s: another gpuplane agent is using this data dir", path)
	}
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	return store, nil
}
