// Package testbin builds the gpuplane binary for tests that run its engines
// (the sim engine, log writers) as real processes.
package testbin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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
	build := exec.Command("go", "build", "-o", bin, "./cmd/gpuplane")
	build.Dir = root
	build.Env = append(os.Environ(), "CGO_CFLAGS=-Wno-deprecated-declarations")
	if out, err := build.CombinedOutput(); err != nil {
		remove()
		return "", nil, fmt.Errorf("build gpuplane: %v\n%s", err, out)
	}
	return bin, remove, nil
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
