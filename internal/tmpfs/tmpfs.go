// Package tmpfs mounts small filesystems for tests that need a disk to
// fill: the full-disk tests of the log store, the cluster and the agent.
package tmpfs

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"testing"
)

// Mount mounts a tmpfs of size bytes on a fresh directory and unmounts it
// when the test ends; it skips the test without root on Linux or where
// mount fails. lazy unmounts with -l (a killed process may still hold a
// file there for a moment); otherwise a file still open at the end is an
// error of the test.
func Mount(t testing.TB, size int, lazy bool) string {
	t.Helper()
	if runtime.GOOS != "linux" || os.Geteuid() != 0 {
		t.Skip("needs root on Linux to mount a small tmpfs")
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d", size), "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("mount tmpfs: %v: %s", err, out)
	}
	args := []string{dir}
	if lazy {
		args = []string{"-l", dir}
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", args...).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	return dir
}
