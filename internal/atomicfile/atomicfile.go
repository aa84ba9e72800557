// Package atomicfile writes small files that must survive a crash whole or
// not at all: a node's identity, an audit base, an archive's manifest.
package atomicfile

import (
	"fmt"
	"os"
	"path/filepath"
)

// Write writes a file atomically and durably: temp file, fsync,
// rename, fsync of the directory.
func Write(path string, data []byte) error {
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
