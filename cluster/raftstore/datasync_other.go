//go:build !linux

package raftstore

import "syscall"

// datasync is fsync where fdatasync is not at hand.
func datasync(fd uintptr) error { return syscall.Fsync(int(fd)) }
