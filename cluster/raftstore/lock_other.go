//go:build !linux && !darwin

package raftstore

import "os"

// lockDir does not lock where flock is not available.
func lockDir(string, bool) (*os.File, error) { return nil, nil }
