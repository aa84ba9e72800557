package tinygguf_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuplane/gpuplane/internal/realengine"
	"github.com/gpuplane/gpuplane/internal/tinygguf"
)

func TestWriteIsDeterministic(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.gguf"), filepath.Join(dir, "b.gguf")
	for _, p := range []string{a, b} {
		if err := tinygguf.WriteModel(p, tinygguf.ModelOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	ab, _ := os.ReadFile(a)
	bb, _ := os.ReadFile(b)
	if !bytes.Equal(ab, bb) || !bytes.HasPrefix(ab, []byte("GGUF\x03\x00\x00\x00")) {
		t.Fatalf("two writes differ or lack the GGUF v3 header (%d and %d bytes)", len(ab), len(bb))
	}
	c := filepath.Join(dir, "c.gguf")
	if err := tinygguf.WriteModel(c, tinygguf.ModelOptions{Seed: 7}); err != nil {
		t.Fatal(err)
	}
	if cb, _ := os.ReadFile(c); bytes.Equal(ab, cb) {
		t.Fatal("another seed wrote the same weights")
	}
}

func TestWriteRefusesBadOptions(t *testing.T) {
	dir := t.TempDir()
	if err := tinygguf.WriteAdapter(filepath.Join(dir, "x.gguf"), tinygguf.AdapterOptions{Word: "nope"}); err == nil || !strings.Contains(err.Error(), `"nope"`) {
		t.Fatalf("unknown word: %v", err)
	}
	if err := tinygguf.WriteModel(filepath.Join(dir, "y.gguf"), tinygguf.ModelOptions{Embd: 6}); err == nil || !strings.Contains(err.Error(), "embd") {
		t.Fatalf("embd 6: %v", err)
	}
}

// TestRealTinyModelInLlamaServer loads the model and two adapters in the
// real llama-server: the base answers printable text that is not the
// adapters' word; each adapter at scale 1 makes every token its word.
func TestRealTinyModelInLlamaServer(t *testing.T) {
	f := tinygguf.Write(t, "ok", "hi")
	base := realengine.StartLlamaServer(t, "-m", f.Model, "--lora", f.Adapters["ok"], "--lora", f.Adapters["hi"],
		"--lora-init-without-apply", "-c", "512", "--parallel", "1")
	chat := func(lora string) string {
		body := `{"messages":[{"role":"user","content":"hello there"}],"temperature":0,"max_tokens":8,"lora":` + lora + `}`
		resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var r struct {
			Choices []struct{ Message struct{ Content string } }
		}
		if err := json.NewDecoder(resp.Body).Decode(&r); err != nil || resp.StatusCode != 200 || len(r.Choices) != 1 {
			t.Fatalf("lora %s: status %d, %v", lora, resp.StatusCode, err)
		}
		return r.Choices[0].Message.Content
	}
	baseText := chat(`[{"id":0,"scale":0},{"id":1,"scale":0}]`)
	for _, c := range baseText {
		if c < 0x20 || c > 0x7e {
			t.Fatalf("base answer %q holds a non-printable rune %q", baseText, c)
		}
	}
	if strings.Contains(baseText, "ok ok") || strings.Contains(baseText, "hi hi") || strings.TrimSpace(baseText) == "" {
		t.Fatalf("base answer %q looks like an adapter's (or is empty)", baseText)
	}
	if got := chat(`[{"id":0,"scale":1},{"id":1,"scale":0}]`); got != strings.Repeat(" ok", 8) {
		t.Fatalf("adapter ok at scale 1 answered %q", got)
	}
	if got := chat(`[{"id":0,"scale":0},{"id":1,"scale":1}]`); got != strings.Repeat(" hi", 8) {
		t.Fatalf("adapter hi at scale 1 answered %q", got)
	}
}
