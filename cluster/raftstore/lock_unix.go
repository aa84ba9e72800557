//go:build linux || darwin

package raftstore

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// lockDir takes the log dir's lock without waiting: exclusive for the agent
// that writes the log, shared for offline readers, so a reader never sees a
// log half written and two agents never share one.
func lockDir(dir string, exclusive bool) (*os.File, error) {
	path := filepath.Join(dir, "LOCK")
	flag := os.O_RDONLY
	if exclusive {
		flag = os.O_RDWR | os.O_CREATE
	}
	f, err := os.OpenFile(path, flag, 0o600)
	if errors.Is(err, os.ErrNotExist) && !exclusive {
		// A log written before the lock existed, or a read-only copy: no
		// agent can be writing it without the file.
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	how := syscall.LOCK_SH
	if exclusive {
		how = syscall.LOCK_EX
	}
	if err := syscall.Flock(int(f.Fd()), how|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			if exclusive {
				return nil, fmt.Errorf("raft log %s is in use: another gpuplane agent (or an offline audit) has this data dir open", dir)
			}
			return nil, fmt.Errorf("raft log %s is in use: an agent is running on this data dir: stop it, or ask it with --addr instead of --data-dir", dir)
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return f, nil
}
