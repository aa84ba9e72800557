package cluster

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/hashicorp/raft"

	"github.com/gpuplane/gpuplane/cluster/auditrec"
	"github.com/gpuplane/gpuplane/internal/atomicfile"
)

func (c *Cluster) auditBasePath() string {
	return filepath.Join(RaftDir(c.cfg.DataDir), auditrec.BaseFile)
}

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
	recorded, err := c.fsm.hashes.At(cut)
	if err != nil {
		return 0, err
	}
	switch {
	case recorded == "":
		return 0, fmt.Errorf("compact before index %d: this server has no record of its hash head at %d to check the archive against; it keeps its log", before, cut)
	case recorded != hash:
		return 0, fmt.Errorf("compact before index %d: the archive's hash head at %d is %s, this server's %s: the archive is not of this log; it keeps its log", before, cut, auditrec.Short(hash), auditrec.Short(recorded))
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
	files, err := c.LogFiles()
	if err != nil {
		return 0, err
	}
	base, err := files.StateAt(cut)
	if err != nil {
		return 0, fmt.Errorf("compact: replay to %d: %w", cut, err)
	}
	if base.Hash() != recorded {
		return 0, fmt.Errorf("compact: the replay to %d gives hash %s, this server recorded %s: run 'gpuplane audit verify'; it keeps its log", cut, auditrec.Short(base.Hash()), auditrec.Short(recorded))
	}
	data, err := base.Snapshot()
	if err != nil {
		return 0, err
	}
	if err := atomicfile.Write(c.auditBasePath(), data); err != nil {
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
