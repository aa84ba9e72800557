package engine

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The node's secret is made once (mode 0600) and read back by a later
// agent, so an engine's key outlives an agent restart; keys differ per
// replica; only vLLM and llama.cpp take one, in their environment.
func TestEngineKeys(t *testing.T) {
	dir := t.TempDir()
	a, err := LoadKeys(dir)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, KeysFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("secret file: %v %v", fi, err)
	}
	b, err := LoadKeys(dir)
	if err != nil {
		t.Fatal(err)
	}
	if a.For("m", 0) != b.For("m", 0) || a.For("m", 0) == a.For("m", 1) || a.For("m", 0) == a.For("n", 0) || !strings.HasPrefix(a.For("m", 0), "gpk-") {
		t.Fatalf("keys: %q %q %q %q", a.For("m", 0), b.For("m", 0), a.For("m", 1), a.For("n", 0))
	}
	var none *Keys
	if none.For("m", 0) != "" || KeyEnv(KindLlamaCpp, "") != nil {
		t.Fatal("a nil Keys gave a key")
	}
	if !slices.Equal(KeyEnv(KindVLLM, "k"), []string{"VLLM_API_KEY=k"}) || !slices.Equal(KeyEnv(KindLlamaCpp, "k"), []string{"LLAMA_API_KEY=k"}) ||
		KeyEnv(KindOllama, "k") != nil || KeyEnv(KindSim, "k") != nil {
		t.Fatal("KeyEnv")
	}
	os.WriteFile(filepath.Join(dir, KeysFile), []byte("zz"), 0o600)
	if _, err := LoadKeys(dir); err == nil || !strings.Contains(err.Error(), KeysFile) {
		t.Fatalf("a bad secret: %v", err)
	}
}
