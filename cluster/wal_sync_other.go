//go:build !linux

package cluster

import "os"

func fdatasync(f *os.File) error { return f.Sync() }
