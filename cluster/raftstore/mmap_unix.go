//go:build linux || darwin

package raftstore

import (
	"os"
	"syscall"
)

// mapFile maps a file read-only, exactly its current size (never past its
// end, where a read would fault). populate reads it all in at once: a
// replay reads every segment front to back, and one fault per page costs
// more than the read-ahead.
func mapFile(f *os.File, size int64, populate bool) ([]byte, func() error, error) {
	if size == 0 {
		return nil, func() error { return nil }, nil
	}
	flags := syscall.MAP_SHARED
	if populate {
		flags |= mapPopulate
	}
	data, err := syscall.Mmap(int(f.Fd()), 0, int(size), syscall.PROT_READ, flags)
	if err != nil {
		return nil, nil, err
	}
	return data, func() error { return syscall.Munmap(data) }, nil
}
