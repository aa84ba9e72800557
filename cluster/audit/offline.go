package audit

import (
	"errors"
	"fmt"
	"path/filepath"

	"github.com/gpuplane/gpuplane/cluster"
	"github.com/gpuplane/gpuplane/cluster/auditrec"
	"github.com/gpuplane/gpuplane/cluster/events"
	"github.com/gpuplane/gpuplane/cluster/raftstore"
)

// Offline is a stopped node's data dir opened read-only for audit: its Raft
// log, the per-entry hashes its state machine recorded, and its snapshots.
// Close it to release the data dir.
type Offline struct {
	*History
	store  *offlineLog
	hashes *auditrec.Hashes
}

// OpenOffline opens a stopped node's data dir read-only. It fails at once,
// naming the cause, when an agent is running on the dir, and with an error
// naming the file, offset and entry index when the log is damaged.
func OpenOffline(dataDir string) (*Offline, error) {
	dir, raftDir := cluster.LogDir(dataDir), cluster.RaftDir(dataDir)
	r, err := raftstore.OpenReadOnly(dir)
	if errors.Is(err, raftstore.ErrNoLog) && raftstore.HasLegacy(raftDir) {
		return nil, fmt.Errorf("data dir %s holds a Raft log in the layout of an earlier gpuplane (raft/raft.db): start this version's agent on it once (it converts the log), then stop it and run audit again", dataDir)
	}
	if errors.Is(err, raftstore.ErrNoLog) {
		return nil, fmt.Errorf("open %s: no Raft log in data dir %s: %w", dir, dataDir, err)
	}
	if err != nil {
		return nil, fmt.Errorf("open the Raft log read-only: %w", err)
	}
	log := &offlineLog{r}
	hashes, err := auditrec.OpenHashes(filepath.Join(raftDir, auditrec.HashesFile), true, nil)
	if err != nil {
		r.Close()
		return nil, err
	}
	return &Offline{
		History: &History{files: events.LogFiles{
			Log: log, Hashes: hashes,
			SnapshotDir: auditrec.SnapshotsDir(raftDir),
			BasePath:    filepath.Join(raftDir, auditrec.BaseFile),
		}},
		store: log, hashes: hashes,
	}, nil
}

// Close releases the data dir.
func (o *Offline) Close() error {
	return errors.Join(o.hashes.Close(), o.store.Close())
}
