package cluster

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/hashicorp/raft"

	"github.com/gpuplane/gpuplane/fsm"
)

// auditBaseFile, in the raft dir, is the state machine's snapshot as of the
// entry just before the log's first once the log has been compacted
// (Compact): audit replays start from it instead of from index 1. A log
// never compacted has none.
const auditBaseFile = "audit-base.state"

// ErrCompacted is returned for log entries a server no longer holds: they
// were archived and compacted away, and are read from the archive.
var ErrCompacted = errors.New("compacted")

// readAuditBase returns the audit base in path, nil when there is none.
func readAuditBase(path string) (*fsm.FSM, error) {
	if path == "" {
		return nil, nil
	}
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the audit base: %w", err)
	}
	f := fsm.New()
	if err := f.Restore(data); err != nil {
		return nil, fmt.Errorf("audit base %s: %w", path, err)
	}
	return f, nil
}

// findAuditBase returns the state a log whose first entry is first is
// replayed from: the audit base Compact wrote, or else the oldest Raft
// snapshot in snapshotDir at or after first-1. A server that joined (or
// fell behind) after the others compacted their logs is sent a snapshot
// and keeps no older entries, and no audit base of its own: the snapshot
// is where its log begins. nil when there is neither.
func findAuditBase(basePath, snapshotDir string, first uint64) (*fsm.FSM, error) {
	base, err := readAuditBase(basePath)
	if err != nil || (base != nil && base.AppliedIndex()+1 >= first) {
		return base, err
	}
	entries, err := os.ReadDir(snapshotDir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("read snapshots: %w", err)
	}
	best, bestIndex := "", uint64(0)
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		meta, err := readSnapshotMeta(filepath.Join(snapshotDir, e.Name()))
		if err == nil && meta.Index+1 >= first && (best == "" || meta.Index < bestIndex) {
			best, bestIndex = e.Name(), meta.Index
		}
	}
	if best == "" {
		return nil, nil
	}
	data, err := readSnapshotBytes(filepath.Join(snapshotDir, best))
	if err != nil {
		return nil, err
	}
	f := fsm.New()
	if err := f.Restore(data); err != nil {
		return nil, fmt.Errorf("snapshot %s: %w", best, err)
	}
	return f, nil
}

func (c *Cluster) auditBasePath() string { return filepath.Join(c.cfg.DataDir, raftDir, auditBaseFile) }

// Compact drops this server's log entries before index before, which an
// archive holds (docs/audit.md: an operator's decision, never automatic). hash is
// the archive's hash chain head after entry before-1; unless it is the head
// this server recorded when it applied that entry, nothing changes: the
// archive is not of this log. The server first takes a snapshot at or after
// the cut (Raft sends it to a follower that needs the dropped entries) and
// writes the state at the cut as its audit base, so that `audit verify` and
// `audit replay` of later entries still work on the log that is left. It
// returns the log's first index afterwards.
func (c *Cluster) Compact(ctx context.Context, before uint64, hash string) (uint64, error) {
	if !c.IsServer() {
		return 0, ErrNoLog
	}
	cut := before - 1
	if before < 2 {
		return 0, fmt.Errorf("compact before index %d: nothing precedes it (the log starts at 1)", before)
	}
	if applied := c.AppliedIndex(); cut > applied {
		return 0, fmt.Errorf("compact before index %d: this server has applied only up to %d", before, applied)
	}
	first, err := c.store.FirstIndex()
	if err != nil {
		return 0, err
	}
	if first >= before {
		return first, nil
	}
	recorded, err := c.fsm.hashes.at(cut)
	if err != nil {
		return 0, err
	}
	switch {
	case recorded == "":
		return 0, fmt.Errorf("compact before index %d: this server has no record of its hash head at %d to check the archive against; it keeps its log", before, cut)
	case recorded != hash:
		return 0, fmt.Errorf("compact before index %d: the archive's hash head at %d is %s, this server's %s: the archive is not of this log; it keeps its log", before, cut, short(hash), short(recorded))
	}
	if err := c.raft.Snapshot().Error(); err != nil && !errors.Is(err, raft.ErrNothingNewToSnapshot) {
		return 0, fmt.Errorf("compact: snapshot: %w", err)
	}
	metas, err := c.snaps.List()
	if err != nil {
		return 0, fmt.Errorf("compact: list snapshots: %w", err)
	}
	if len(metas) == 0 || metas[0].Index < cut {
		return 0, fmt.Errorf("compact before index %d: the latest snapshot is older than the cut; it keeps its log", before)
	}
	h, err := c.History()
	if err != nil {
		return 0, err
	}
	base, err := h.StateAt(cut)
	if err != nil {
		return 0, fmt.Errorf("compact: replay to %d: %w", cut, err)
	}
	if base.Hash() != recorded {
		return 0, fmt.Errorf("compact: the replay to %d gives hash %s, this server recorded %s: run 'gpuplane audit verify'; it keeps its log", cut, short(base.Hash()), short(recorded))
	}
	data, err := base.Snapshot()
	if err != nil {
		return 0, err
	}
	if err := writeFileSync(c.auditBasePath(), data); err != nil {
		return 0, fmt.Errorf("compact: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if err := c.store.DeleteRange(first, cut); err != nil {
		return 0, fmt.Errorf("compact: delete entries %d..%d: %w", first, cut, err)
	}
	c.log.Info("log compacted after an archive", "before", before, "dropped_from", first)
	return c.store.FirstIndex()
}
