//go:build !linux

// Package cputime reads the calling thread's CPU time; off Linux it is not
// measured.
package cputime

import "time"

// Thread is 0 off Linux.
func Thread() time.Duration { return 0 }
