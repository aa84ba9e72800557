// Package cputime reads the calling thread's CPU time, which benchmarks
// report beside wall time: on a shared machine the wall-clock tail is set by
// waiting for a core, not by the code measured. Callers lock their goroutine
// to its thread (runtime.LockOSThread) while they measure.
package cputime

import (
	"time"

	"golang.org/x/sys/unix"
)

// Thread is the calling thread's CPU time (CLOCK_THREAD_CPUTIME_ID), 0 when
// it cannot be read.
func Thread() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}
