package cluster

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/gpuplane/gpuplane/cluster/raftstore"
	"github.com/gpuplane/gpuplane/internal/atomicfile"
)

// Data dir layout (see DESIGN.md):
//
//	<data-dir>/node-id             the node name this data dir belongs to
//	<data-dir>/raft/log/           the Raft log and stable store (term, vote):
//	                               hashicorp/raft-wal's segments (*.wal) and
//	                               wal-meta.db (see package raftstore)
//	<data-dir>/raft/snapshots/     state snapshots (the last two), for fast restarts
//	<data-dir>/raft/hashes         hash chain head after each applied entry (audit)
const (
	nodeIDFile   = "node-id"
	raftDir      = "raft"
	logDirName   = "log"
	snapshotKeep = 2
)

// RaftDir is where a data dir keeps Raft's log, snapshots and the audit
// records beside them.
func RaftDir(dataDir string) string { return filepath.Join(dataDir, raftDir) }

// LogDir is where the Raft log of a data dir lives.
func LogDir(dataDir string) string { return filepath.Join(dataDir, raftDir, logDirName) }

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
	return atomicfile.Write(path, []byte(name+"\n"))
}

// openLogStore opens the data dir's Raft log and stable store, converting a
// log of an earlier version (raft/raft.db) first.
func openLogStore(dataDir string, logger hclog.Logger, segmentSize int) (*raftstore.Store, error) {
	opts := raftstore.Options{Logger: logger, SegmentSize: segmentSize}
	if err := raftstore.MigrateLegacy(filepath.Join(dataDir, raftDir), LogDir(dataDir), opts); err != nil {
		return nil, err
	}
	store, err := raftstore.Open(LogDir(dataDir), opts)
	if errors.Is(err, raftstore.ErrDamaged) {
		return nil, fmt.Errorf("%w\n%s", err, damagedHint)
	}
	return store, err
}

// damagedHint tells an operator what to do about a damaged log.
const damagedHint = "This server's log is damaged; it will not start on it, since it may lack entries it acknowledged. " +
	"If the other servers are healthy, start it with --recover: it sets the damaged Raft data aside (raft.damaged-<time>) " +
	"and rejoins, receiving the whole log from the leader. See the README, section 'A damaged log'."

// setAsideRaftData moves a server's Raft data (log, snapshots, hash
// records) to <data-dir>/raft.damaged-<time> for --recover, and returns the
// stable store's keys (term and vote) read from the old log when its
// wal-meta.db is readable: a server that forgot whom it voted for could
// vote twice in one term.
func setAsideRaftData(dataDir string, log *slog.Logger) (map[string][]byte, error) {
	from := filepath.Join(dataDir, raftDir)
	if _, err := os.Stat(from); errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	stable, err := raftstore.ReadStable(LogDir(dataDir))
	if err != nil {
		log.Warn("recover: the term and vote of the old log are unreadable; starting without them", "error", err)
	}
	to := filepath.Join(dataDir, "raft.damaged-"+time.Now().UTC().Format("20060102T150405Z"))
	if err := os.Rename(from, to); err != nil {
		return nil, fmt.Errorf("recover: set the Raft data aside: %w", err)
	}
	if err := os.MkdirAll(from, 0o700); err != nil {
		return nil, err
	}
	log.Warn("recover: Raft data set aside; this server rejoins with an empty log and receives the whole log from the leader",
		"moved_to", to, "kept_term_and_vote", len(stable) > 0)
	return stable, nil
}
