package executor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

// logFile is the name of a replica's engine log; rotated copies are
// engine.log.1 (newest) to engine.log.N.
const logFile = "engine.log"

// LogPath is the engine log of a replica.
func LogPath(dataDir, model string, replica uint32) string {
	return filepath.Join(ReplicaDir(dataDir, model, replica), logFile)
}

// openLog opens a replica's engine log for an engine to append to,
// rotating it first when it has grown past maxBytes.
func openLog(dir string, maxBytes int64, keep int) (*os.File, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("engine log: %w", err)
	}
	path := filepath.Join(dir, logFile)
	if err := rotateLog(path, maxBytes, keep); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("engine log: %w", err)
	}
	return f, nil
}

// rotateLog rotates path when it is larger than maxBytes: engine.log.i
// becomes .i+1 (the oldest beyond keep is dropped), a copy of engine.log
// becomes .1 and engine.log is truncated in place. Copying and truncating,
// rather than renaming, lets a running engine keep appending to its open
// file; lines written between the copy and the truncation are lost.
func rotateLog(path string, maxBytes int64, keep int) error {
	fi, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) || (err == nil && fi.Size() <= maxBytes) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("rotate engine log: %w", err)
	}
	_ = os.Remove(fmt.Sprintf("%s.%d", path, keep))
	for i := keep - 1; i >= 1; i-- {
		_ = os.Rename(fmt.Sprintf("%s.%d", path, i), fmt.Sprintf("%s.%d", path, i+1))
	}
	if keep >= 1 {
		if err := copyFile(path, path+".1"); err != nil {
			return fmt.Errorf("rotate engine log: %w", err)
		}
	}
	if err := os.Truncate(path, 0); err != nil {
		return fmt.Errorf("rotate engine log: %w", err)
	}
	return nil
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(to)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// ReadLogs writes a replica's engine log to w, oldest rotated file first.
// With follow it then keeps writing what the engine appends, across
// restarts and rotations, until ctx ends (the `replicas logs --follow` of
// SPEC §3). A replica with no log yet is an error naming it.
func ReadLogs(ctx context.Context, dataDir, model string, replica uint32, follow bool, w io.Writer) error {
	path := LogPath(dataDir, model, replica)
	found := false
	for i := 32; i >= 1; i-- { // rotated copies, oldest first
		if _, err := copyFrom(fmt.Sprintf("%s.%d", path, i), 0, w); err == nil {
			found = true
		}
	}
	offset, err := copyFrom(path, 0, w)
	if errors.Is(err, fs.ErrNotExist) {
		if !found && !follow {
			return fmt.Errorf("replica %s/%d has no engine log on this node", model, replica)
		}
		offset, err = 0, nil
	}
	if err != nil || !follow {
		return err
	}
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if fi, err := os.Stat(path); err == nil && fi.Size() < offset {
			offset = 0 // rotated: the engine writes from the start again
		}
		n, err := copyFrom(path, offset, w)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		offset += max(n, 0)
	}
}

// copyFrom copies path from offset to w and returns how much it copied.
func copyFrom(path string, offset int64, w io.Writer) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return -1, err
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return -1, err
	}
	return io.Copy(w, f)
}
