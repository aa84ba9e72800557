// Package realengine finds the real engine binaries (llama.cpp's
// llama-server, Ollama) for the tests that run them.
//
// A binary is looked up, in order: the environment variable naming it
// (GPUPLANE_LLAMA_SERVER, GPUPLANE_OLLAMA), then ../shared/engines/<name>
// relative to the repository root (the directory holding go.mod), then PATH.
// Where none is found a test skips with one line naming what is missing;
// with GPUPLANE_REQUIRE_REAL_ENGINES=1 (CI) it fails instead.
//
// Tests that run a real engine are named TestReal…, so CI can list and count
// them.
package realengine

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// RequireEnv names the variable that turns a missing engine from a skip into
// a failure.
const RequireEnv = "GPUPLANE_REQUIRE_REAL_ENGINES"

// Engine names one real engine binary.
type Engine struct {
	Name string // file name in ../shared/engines and on PATH
	Env  string // variable holding its path
}

var (
	LlamaServerEngine = Engine{Name: "llama-server", Env: "GPUPLANE_LLAMA_SERVER"}
	OllamaEngine      = Engine{Name: "ollama", Env: "GPUPLANE_OLLAMA"}
)

// Find returns the path of e's binary, or an error naming every place looked.
func Find(e Engine) (string, error) {
	if p := os.Getenv(e.Env); p != "" {
		if err := executable(p); err != nil {
			return "", fmt.Errorf("%s=%s: %v", e.Env, p, err)
		}
		return p, nil
	}
	var shared string
	if root, err := Root(); err == nil {
		shared = filepath.Join(filepath.Dir(root), "shared", "engines", e.Name)
		if executable(shared) == nil {
			return shared, nil
		}
	}
	if p, err := exec.LookPath(e.Name); err == nil {
		return p, nil
	}
	where := "PATH"
	if shared != "" {
		where = shared + " or PATH"
	}
	return "", fmt.Errorf("real engine %s not found: set %s or put it at %s", e.Name, e.Env, where)
}

// Root returns the repository root: the nearest directory at or above the
// working directory that holds go.mod.
func Root() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		up := filepath.Dir(dir)
		if up == dir {
			return "", errors.New("no go.mod at or above the working directory")
		}
		dir = up
	}
}

func executable(p string) error {
	fi, err := os.Stat(p)
	if err != nil {
		return err
	}
	if fi.IsDir() || fi.Mode()&0o111 == 0 {
		return fmt.Errorf("%s is not an executable file", p)
	}
	return nil
}

// Require returns e's path, or skips t (fails it when RequireEnv is 1) with
// one line naming what is missing.
func Require(t testing.TB, e Engine) string {
	t.Helper()
	p, err := Find(e)
	if err != nil {
		if os.Getenv(RequireEnv) == "1" {
			t.Fatalf("%v (%s=1)", err, RequireEnv)
		}
		t.Skip(err)
	}
	return p
}

// LlamaServer returns the path of llama.cpp's llama-server or skips t.
func LlamaServer(t testing.TB) string { t.Helper(); return Require(t, LlamaServerEngine) }

// Ollama returns the path of ollama or skips t.
func Ollama(t testing.TB) string { t.Helper(); return Require(t, OllamaEngine) }
