package auditrec

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/gpuplane/gpuplane/fsm"
)

// BaseFile, in the raft dir, is the state machine's snapshot as of the
// entry just before the log's first once the log has been compacted
// (Compact): audit replays start from it instead of from index 1. A log
// never compacted has none.
const BaseFile = "audit-base.state"

// ReadBase returns the audit base in path, nil when there is none.
func ReadBase(path string) (*fsm.FSM, error) {
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

// FindBase returns the state a log whose first entry is first is
// replayed from: the audit base Compact wrote, or else the oldest Raft
// snapshot in snapshotDir at or after first-1. A server that joined (or
// fell behind) after the others compacted their logs is sent a snapshot
// and keeps no older entries, and no audit base of its own: the snapshot
// is where its log begins. nil when there is neither.
func FindBase(basePath, snapshotDir string, first uint64) (*fsm.FSM, error) {
	base, err := ReadBase(basePath)
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
		meta, err := ReadSnapshotMeta(filepath.Join(snapshotDir, e.Name()))
		if err == nil && meta.Index+1 >= first && (best == "" || meta.Index < bestIndex) {
			best, bestIndex = e.Name(), meta.Index
		}
	}
	if best == "" {
		return nil, nil
	}
	data, err := ReadSnapshotBytes(filepath.Join(snapshotDir, best))
	if err != nil {
		return nil, err
	}
	f := fsm.New()
	if err := f.Restore(data); err != nil {
		return nil, fmt.Errorf("snapshot %s: %w", best, err)
	}
	return f, nil
}

// Short is a hash head as messages show it: its first 12 hex digits,
// "(none)" for no record.
func Short(hash string) string {
	if len(hash) > 12 {
		return hash[:12]
	}
	if hash == "" {
		return "(none)"
	}
	return hash
}
