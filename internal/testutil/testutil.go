// Package testutil holds what the tests of several packages share: waiting
// for a state to be reached, with a deadline generous enough for a loaded CI
// machine and a message that says what never happened.
//
// It is imported by tests only.
package testutil

import (
	"os"
	"runtime/pprof"
	"testing"
	"time"
)

// Eventually calls check until it returns nil and returns how long that took.
// If within passes first, it fails t with what and check's last error (and,
// when GPUPLANE_TEST_LOG is set, dumps every goroutine to stderr: a state
// never reached is usually a goroutine stuck somewhere).
//
// The pause between calls starts at 10 ms and doubles up to 100 ms, so a
// state reached at once is seen at once and a slow one costs few calls.
func Eventually(t testing.TB, within time.Duration, what string, check func() error) time.Duration {
	t.Helper()
	start := time.Now()
	pause := 10 * time.Millisecond
	for {
		err := check()
		if err == nil {
			return time.Since(start)
		}
		if time.Since(start) >= within {
			if os.Getenv("GPUPLANE_TEST_LOG") != "" {
				_ = pprof.Lookup("goroutine").WriteTo(os.Stderr, 1)
			}
			if what == "" {
				t.Fatalf("not within %v: %v", within, err)
			}
			t.Fatalf("%s: not within %v: %v", what, within, err)
			return 0
		}
		time.Sleep(pause)
		pause = min(2*pause, 100*time.Millisecond)
	}
}

// errNotYet is what Until's condition reports while it does not hold.
type errNotYet struct{}

func (errNotYet) Error() string { return "condition never held" }

// Until is Eventually for a condition that has no error to report.
func Until(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	Eventually(t, within, what, func() error {
		if cond() {
			return nil
		}
		return errNotYet{}
	})
}
