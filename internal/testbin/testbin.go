// Package testbin builds the gpuplane binary for tests that run its engines
// (the sim engine, log writers) as real processes.
package testbin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Build compiles ./cmd/gpuplane of the module at root into a fresh temporary
// directory named after prefix, and returns the binary's path and a function
// that removes it.
func Build(root, prefix string) (bin string, remove func(), err error) {
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		return "", nil, err
	}
	remove = func() { os.RemoveAll(dir) }
	bin = filepath.Join(dir, "gpuplane")
	if err := BuildTo(root, bin); err != nil {
		remove()
		return "", nil, err
	}
	return bin, remove, nil
}

// BuildTo compiles ./cmd/gpuplane of the module at root into out, with the
// build tags given: the one way tests, e2e and jepsen build the binary. Cgo
// is on (the NVIDIA bindings need it); go-nvml's deprecation warnings are
// silenced unless CGO_CFLAGS is set.
func BuildTo(root, out string, tags ...string) error {
	args := []string{"build", "-o", out}
	if len(tags) > 0 {
		args = append(args, "-tags", strings.Join(tags, ","))
	}
	cmd := exec.Command("go", append(args, "./cmd/gpuplane")...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
	if os.Getenv("CGO_CFLAGS") == "" {
		cmd.Env = append(cmd.Env, "CGO_CFLAGS=-Wno-deprecated-declarations")
	}
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go %s ./cmd/gpuplane: %v\n%s", strings.Join(args, " "), err, b)
	}
	return nil
}

// Main is a TestMain body for packages whose tests run the binary: it builds
// the binary into *bin, runs the tests and removes it, then exits with the
// tests' code.
func Main(m *testing.M, root, prefix string, bin *string) {
	b, remove, err := Build(root, prefix)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	*bin = b
	code := m.Run()
	remove()
	os.Exit(code)
}
