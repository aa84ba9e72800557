package realengine

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/gpuplane/gpuplane/internal/porttest"
)

// StartOllama runs `ollama serve` on a free loopback port with a model
// store and home of its own (in t.TempDir(); env, KEY=VALUE entries, may
// add to or override them), waits until /api/version answers 200 and
// returns its base URL. It runs as Start runs it: its process group is
// killed whole when t ends, and the runners `ollama serve` starts go with it.
func StartOllama(t testing.TB, env ...string) string {
	t.Helper()
	bin := Ollama(t)
	port := porttest.Free(t)
	dir := t.TempDir()
	base := "http://127.0.0.1:" + strconv.Itoa(port)
	cmd := exec.Command(bin, "serve")
	cmd.Env = append(os.Environ(), "OLLAMA_HOST=127.0.0.1:"+strconv.Itoa(port),
		"OLLAMA_MODELS="+filepath.Join(dir, "models"), "HOME="+dir, "OLLAMA_NUM_PARALLEL=1")
	cmd.Env = append(cmd.Env, env...)
	Start(t, cmd, base+"/api/version")
	return base
}

// CreateOllamaModel stores the GGUF file at path in the store of the
// `ollama serve` at base as name, as `ollama create` does: the file as a
// blob, then /api/create.
func CreateOllamaModel(t testing.TB, base, name, path string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	digest := "sha256:" + hex.EncodeToString(sum[:])
	resp, err := http.Post(base+"/api/blobs/"+digest, "application/octet-stream", bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusOK {
		t.Fatalf("POST /api/blobs/%s: %s", digest, resp.Status)
	}
	body, _ := json.Marshal(map[string]any{"model": name, "files": map[string]string{filepath.Base(path): digest}, "stream": false})
	resp, err = http.Post(base+"/api/create", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	msg, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST /api/create %s: %s: %s", name, resp.Status, msg)
	}
}
