package realengine

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestFindOrder(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "my-llama")
	os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o755)
	plain := filepath.Join(dir, "plain")
	os.WriteFile(plain, nil, 0o644)
	e := Engine{Name: "gpuplane-no-such-engine", Env: "GPUPLANE_TEST_ENGINE"}

	t.Setenv(e.Env, bin)
	if p, err := Find(e); err != nil || p != bin {
		t.Fatalf("env set: %q, %v", p, err)
	}
	t.Setenv(e.Env, plain)
	if _, err := Find(e); err == nil || !strings.Contains(err.Error(), "GPUPLANE_TEST_ENGINE="+plain) {
		t.Fatalf("env naming a non-executable: %v", err)
	}
	t.Setenv(e.Env, "")
	t.Setenv("PATH", dir)
	_, err := Find(e)
	if err == nil || !strings.Contains(err.Error(), "GPUPLANE_TEST_ENGINE") || !strings.Contains(err.Error(), "shared/engines/gpuplane-no-such-engine") {
		t.Fatalf("missing everywhere: %v", err)
	}
	os.WriteFile(filepath.Join(dir, e.Name), []byte("#!/bin/sh\n"), 0o755)
	if p, err := Find(e); err != nil || p != filepath.Join(dir, e.Name) {
		t.Fatalf("on PATH: %q, %v", p, err)
	}
}

func TestRootHoldsGoMod(t *testing.T) {
	root, err := Root()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "internal", "realengine")); err != nil {
		t.Fatalf("root %s is not this repository's: %v", root, err)
	}
}
