package cluster

import (
	"os"
	"syscall"
)

// fdatasync syncs f's data and the metadata needed to read it back (its
// size), not its times, as bbolt does on Linux.
func fdatasync(f *os.File) error { return syscall.Fdatasync(int(f.Fd())) }
