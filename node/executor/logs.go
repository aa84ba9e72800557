package executor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// logFile is the name of a replica's engine log; rotated files are
// engine.log.1 (newest) to engine.log.N.
const logFile = "engine.log"

// logLock is the lock file that lets one log writer at a time write a
// replica's log.
const logLock = "engine.log.lock"

// maxLogFiles bounds the rotated files ReadLogs looks for.
const maxLogFiles = 32

// LogPath is the engine log of a replica.
func LogPath(dataDir, model string, replica uint32) string {
	return filepath.Join(ReplicaDir(dataDir, model, replica), logFile)
}

// logWriter writes a replica's engine log, rotating at write time so that
// the bytes on disk never exceed the cap, however fast the engine writes:
// engine.log and keep rotated files engine.log.1 … engine.log.keep each hold
// at most fileMax = maxBytes/(keep+1) bytes, and a write that would take
// engine.log past fileMax is split across a rotation. Rotation renames
// (engine.log.i becomes .i+1, the oldest is removed first), so whoever
// follows the log sees every file's content in order.
//
// It is not gopkg.in/natefinch/lumberjack.v2: lumberjack removes old files
// in a background goroutine after the rotation (so a burst leaves more than
// the cap on disk for a while), sizes files in whole megabytes and names
// rotated files by time rather than engine.log.N, which `replicas logs`
// reads in order.
type logWriter struct {
	dir     string
	fileMax int64
	keep    int
	f       *os.File
	size    int64
}

// openLogWriter opens dir/engine.log for appending. Files an older writer
// left beyond the cap (more files, or larger ones) are removed first, so
// the cap holds from the first write on.
func openLogWriter(dir string, maxBytes int64, keep int) (*logWriter, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("engine log: %w", err)
	}
	keep = max(keep, 0)
	w := &logWriter{dir: dir, keep: keep, fileMax: max(maxBytes/int64(keep+1), 1)}
	for i := 1; i <= maxLogFiles; i++ {
		if fi, err := os.Stat(w.path(i)); err == nil && (i > keep || fi.Size() > w.fileMax) {
			_ = os.Remove(w.path(i))
		}
	}
	if fi, err := os.Stat(w.path(0)); err == nil && fi.Size() > w.fileMax {
		_ = os.Remove(w.path(0))
	}
	if err := w.open(); err != nil {
		return nil, err
	}
	return w, nil
}

// path is engine.log (i = 0) or engine.log.i.
func (w *logWriter) path(i int) string {
	if i == 0 {
		return filepath.Join(w.dir, logFile)
	}
	return filepath.Join(w.dir, fmt.Sprintf("%s.%d", logFile, i))
}

func (w *logWriter) open() error {
	f, err := os.OpenFile(w.path(0), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("engine log: %w", err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("engine log: %w", err)
	}
	w.f, w.size = f, fi.Size()
	return nil
}

// Write appends p, rotating whenever engine.log is full.
func (w *logWriter) Write(p []byte) (int, error) {
	written := 0
	for len(p) > 0 {
		if w.f == nil || w.size >= w.fileMax {
			if err := w.rotate(); err != nil {
				return written, err
			}
		}
		n := min(int64(len(p)), w.fileMax-w.size)
		m, err := w.f.Write(p[:n])
		w.size += int64(m)
		written += m
		p = p[m:]
		if err != nil {
			return written, fmt.Errorf("engine log: %w", err)
		}
	}
	return written, nil
}

// rotate closes a full engine.log, shifts the rotated files by one (the
// oldest is removed before anything is renamed onto it) and starts an empty
// engine.log.
func (w *logWriter) rotate() error {
	if w.f != nil {
		w.f.Close()
		w.f = nil
	}
	if w.size >= w.fileMax { // else reopening after a failed write
		_ = os.Remove(w.path(w.keep))
		for i := w.keep - 1; i >= 0; i-- {
			_ = os.Rename(w.path(i), w.path(i+1))
		}
	}
	return w.open()
}

// Close closes engine.log.
func (w *logWriter) Close() error {
	if w.f == nil {
		return nil
	}
	err := w.f.Close()
	w.f = nil
	return err
}

// WriteLog copies an engine's output, r (the read end of the pipe that is
// the engine's stdout and stderr), into the replica's log in dir until r
// ends, that is until the engine and every process that inherited the pipe
// are gone. It is what `gpuplane engine log` runs: a process of its own next
// to the engine, so that the engine's log survives an agent restart the way
// the engine does. At most maxBytes of log stay on disk, in keep+1 files.
//
// It keeps reading when the disk refuses a write, so that an engine never
// blocks on its output: what cannot be written is dropped.
//
// With watch.AgentFile set, it also stops the engine once no agent has run
// for watch.Grace (orphan.go).
func WriteLog(r io.Reader, dir string, maxBytes int64, keep int, watch OrphanWatch) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("engine log: %w", err)
	}
	// The writer of a previous engine of this replica drains its last bytes
	// first; the lock is held until this process exits. A writer that does
	// not finish in time (a process of the old engine escaped and holds its
	// pipe) is not waited for: this engine's output must not block.
	if lock, err := os.OpenFile(filepath.Join(dir, logLock), os.O_RDWR|os.O_CREATE, 0o644); err == nil {
		defer lock.Close()
		deadline := time.Now().Add(10 * time.Second)
		for syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
	}
	w, err := openLogWriter(dir, maxBytes, keep)
	if err != nil {
		return err
	}
	defer w.Close()
	var mu sync.Mutex // w, written by the copy and the orphan watch
	write := func(b []byte) {
		mu.Lock()
		defer mu.Unlock()
		if _, err := w.Write(b); err != nil {
			// Dropped; the next write tries a fresh engine.log.
			w.Close()
		}
	}
	if watch.AgentFile != "" {
		done, watched := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(watched)
			watchOrphan(watch, dir, done, func(msg string) { write([]byte(msg)) })
		}()
		// Before the log closes: a watch stopping the engine finishes.
		defer func() {
			close(done)
			<-watched
		}()
	}
	buf := make([]byte, 64<<10)
	for {
		n, rerr := r.Read(buf)
		if n > 0 {
			write(buf[:n])
		}
		if rerr != nil {
			if errors.Is(rerr, io.EOF) {
				return nil
			}
			return fmt.Errorf("engine log: read the engine's output: %w", rerr)
		}
	}
}

// ReadLogs writes a replica's engine log to w, oldest rotated file first.
// With follow it then keeps writing what the engine appends, across
// restarts and rotations, until ctx ends (the `replicas logs --follow` of
// docs/cli.md); an engine that fills more than one file between two polls
// (200 ms) has the files in between left out of the follow, not off disk.
// A replica with no log yet is an error naming it.
func ReadLogs(ctx context.Context, dataDir, model string, replica uint32, follow bool, w io.Writer) error {
	path := LogPath(dataDir, model, replica)
	found := false
	for i := maxLogFiles; i >= 1; i-- { // rotated files, oldest first
		if _, err := copyFrom(fmt.Sprintf("%s.%d", path, i), 0, w); err == nil {
			found = true
		}
	}
	f, err := os.Open(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if !found && !follow {
			return fmt.Errorf("replica %s/%d has no engine log on this node", model, replica)
		}
		f = nil
	case err != nil:
		return err
	}
	defer func() {
		if f != nil {
			f.Close()
		}
	}()
	if f != nil {
		if _, err := io.Copy(w, f); err != nil {
			return err
		}
	}
	if !follow {
		return nil
	}
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if f != nil {
			if _, err := io.Copy(w, f); err != nil {
				return err
			}
			cur, err := f.Stat()
			if err != nil {
				return err
			}
			now, err := os.Stat(path)
			if err == nil && os.SameFile(cur, now) {
				if pos, _ := f.Seek(0, io.SeekCurrent); now.Size() < pos {
					_, _ = f.Seek(0, io.SeekStart) // truncated: written from the start again
				}
				continue
			}
			// Rotated: the rest of the old file (now engine.log.1) was
			// copied above; go on with the new engine.log.
			f.Close()
			f = nil
		}
		if f, err = os.Open(path); err != nil {
			if !errors.Is(err, fs.ErrNotExist) {
				return err
			}
			f = nil
			continue
		}
		if _, err := io.Copy(w, f); err != nil {
			return err
		}
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
