package engine

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// IsGGUFPath says a deployment's spec.model names a GGUF file rather than a
// model the engine knows by name: an absolute path, or a name ending in
// ".gguf". For Ollama the driver creates the model in Ollama's own store
// from the file (OllamaGGUFName).
func IsGGUFPath(model string) bool {
	return strings.HasPrefix(model, "/") || strings.HasSuffix(strings.ToLower(model), ".gguf")
}

// OllamaGGUFName is the name the Ollama driver creates a GGUF file's model
// under in Ollama's store: the file's base name without ".gguf" (lower
// case, anything Ollama refuses in a name made "-"), tagged with the first
// 12 hex digits of the SHA-256 of the path as spec.model gives it, so that
// two files of the same name in different folders are two models.
func OllamaGGUFName(path string) string {
	base := strings.TrimSuffix(strings.ToLower(filepath.Base(path)), ".gguf")
	name := []byte(base)
	for i, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			name[i] = '-'
		}
	}
	// Ollama's model part starts with a letter or digit and is at most 80
	// characters.
	n := strings.TrimLeft(string(name), "_-.")
	if len(n) > 60 {
		n = n[:60]
	}
	if n == "" {
		n = "gguf"
	}
	sum := sha256.Sum256([]byte(path))
	return n + ":" + hex.EncodeToString(sum[:6])
}

// A StartError is a start failure that no retry of the same engine mends:
// the executor stops the engine and reports the replica Failed with it at
// once, rather than asking again until the start deadline.
type StartError struct{ Reason string }

func (e *StartError) Error() string { return e.Reason }

// Preload readies an engine that answers its health path before its model
// is loaded (Ollama): the executor runs it once per start after the health
// path first answers 200, and the engine is ready only once it returns nil.
type Preload interface {
	// Run readies the engine at baseURL ("http://127.0.0.1:8100"); status
	// is told each step as it begins, for the replica's progress. An
	// error is retried at the next health check unless it is a
	// *StartError.
	Run(ctx context.Context, baseURL string, status func(string)) error
	// String says what Run does.
	String() string
}

// ollamaPreload loads the model and keeps it (keep_alive -1), first
// creating it in Ollama's store when spec.model is a GGUF file.
type ollamaPreload struct {
	// model is the name Ollama knows the model by; gguf the file it is
	// created from, "" for a model already in the store.
	model, gguf string
	// store is where Ollama keeps its models (OLLAMA_MODELS), for the
	// reason a missing model fails with.
	store string
}

func newOllamaPreload(p Params) *ollamaPreload {
	pre := &ollamaPreload{model: p.ControlModel(), store: ollamaStore(p.Spec.GetEngine().GetEnv())}
	if m := p.Spec.GetModel(); IsGGUFPath(m) {
		pre.gguf = m
	}
	return pre
}

// ollamaStore is the OLLAMA_MODELS an engine started with env (added to
// the agent's environment) uses: Ollama's default is ~/.ollama/models.
func ollamaStore(env map[string]string) string {
	if d := env["OLLAMA_MODELS"]; d != "" {
		return d
	}
	if d := os.Getenv("OLLAMA_MODELS"); d != "" {
		return d
	}
	home := env["HOME"]
	if home == "" {
		home, _ = os.UserHomeDir()
	}
	return filepath.Join(home, ".ollama", "models")
}

func (o *ollamaPreload) String() string {
	if o.gguf != "" {
		return fmt.Sprintf("create %s in Ollama's store from %s, then load it (keep_alive -1)", o.model, o.gguf)
	}
	return fmt.Sprintf("load %s (keep_alive -1)", o.model)
}

func (o *ollamaPreload) Run(ctx context.Context, baseURL string, status func(string)) error {
	c := caller{Target{BaseURL: baseURL}}
	if o.gguf != "" {
		if err := c.ollamaCreate(ctx, o.model, o.gguf, status); err != nil {
			return err
		}
	}
	status("loading " + o.model)
	err := c.ollamaLoad(ctx, o.model)
	var se *statusError
	if errors.As(err, &se) && se.Code == http.StatusNotFound {
		return &StartError{Reason: fmt.Sprintf("model %q is not in Ollama's store (%s): pull it there with `ollama pull %s` "+
			"(as the agent's user, with OLLAMA_MODELS=%s), or set spec.model to the path of a GGUF file; Ollama answered: %s",
			o.model, o.store, o.model, o.store, se.Body)}
	}
	return err
}

// ollamaLoad loads model and keeps it loaded (keep_alive -1): an
// /api/generate without a prompt, or, for an embedding model, which Ollama
// refuses to generate with (400 "does not support generate"), an
// /api/embed without input, which loads any model.
func (c caller) ollamaLoad(ctx context.Context, model string) error {
	var out struct {
		Done       bool   `json:"done"`
		DoneReason string `json:"done_reason"`
	}
	err := c.call(ctx, http.MethodPost, "/api/generate", map[string]any{"model": model, "keep_alive": -1}, &out)
	var se *statusError
	if errors.As(err, &se) && se.Code == http.StatusBadRequest && strings.Contains(se.Body, "does not support generate") {
		return c.call(ctx, http.MethodPost, "/api/embed", map[string]any{"model": model, "keep_alive": -1}, nil)
	}
	if err != nil {
		return err
	}
	if !out.Done || out.DoneReason != "load" {
		return fmt.Errorf("POST /api/generate answered done=%t done_reason=%q, want \"load\"", out.Done, out.DoneReason)
	}
	return nil
}

// ollamaCreate creates model in Ollama's store from the GGUF file at path,
// as `ollama create` does: the file goes up as a blob unless Ollama holds
// one of its digest already (a later start only hashes it), then
// /api/create names it. A file that cannot be read, or that Ollama cannot
// make a model of, is a *StartError.
func (c caller) ollamaCreate(ctx context.Context, model, path string, status func(string)) error {
	digest, size, err := fileDigest(path, func(done, size int64) {
		status(fmt.Sprintf("hashing %s (%s)", path, percent(done, size)))
	})
	if err != nil {
		return &StartError{Reason: fmt.Sprintf("spec.model: %v", err)}
	}
	blob := "/api/blobs/" + digest
	req, err := http.NewRequestWithContext(ctx, http.MethodHead, c.url(blob), nil)
	if err != nil {
		return err
	}
	resp, err := c.client().Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		if err := c.upload(ctx, blob, path, size, func(done, size int64) {
			status(fmt.Sprintf("copying %s into Ollama's store (%s of %d MiB)", path, percent(done, size), size>>20))
		}); err != nil {
			return err
		}
	}
	status(fmt.Sprintf("creating %s from %s", model, path))
	body := map[string]any{"model": model, "files": map[string]string{filepath.Base(path): digest}, "stream": false}
	err = c.call(ctx, http.MethodPost, "/api/create", body, nil)
	var se *statusError
	if errors.As(err, &se) && se.Code/100 == 4 {
		return &StartError{Reason: fmt.Sprintf("Ollama could not create model %s from spec.model %s: %s", model, path, se.Body)}
	}
	return err
}

// upload posts the file at path as the blob at blobPath, telling
// progress how far it got.
func (c caller) upload(ctx context.Context, blobPath, path string, size int64, progress func(done, size int64)) error {
	f, err := os.Open(path)
	if err != nil {
		return &StartError{Reason: fmt.Sprintf("spec.model: %v", err)}
	}
	defer f.Close()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url(blobPath), &progressReader{r: f, size: size, tell: progress})
	if err != nil {
		return err
	}
	req.ContentLength = size
	resp, err := c.client().Do(req)
	if err != nil {
		return fmt.Errorf("POST %s: %w", blobPath, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("POST %s: %s: %s", blobPath, resp.Status, strings.TrimSpace(string(data)))
	}
	return nil
}

// digests caches fileDigest by path, size and modification time: a model
// file is hashed once per agent, not at every start of its engine.
var digests struct {
	sync.Mutex
	m map[digestKey]string
}

type digestKey struct {
	path string
	size int64
	mod  time.Time
}

// progressReader tells how much of size it has read, at every whole
// percent: a long copy or hash shows the executor's stall detector
// progress (the replica's probe changes).
type progressReader struct {
	r          io.Reader
	done, size int64
	last       int64
	tell       func(done, size int64)
}

func (p *progressReader) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	p.done += int64(n)
	if pct := p.done * 100 / max(p.size, 1); p.done == int64(n) || pct != p.last {
		p.last = pct
		p.tell(p.done, p.size)
	}
	return n, err
}

// percent is done of size as a whole percentage.
func percent(done, size int64) string {
	return fmt.Sprintf("%d%%", done*100/max(size, 1))
}

// fileDigest is the "sha256:<hex>" of the file at path, and its size;
// progress is told how far the hash got.
func fileDigest(path string, progress func(done, size int64)) (string, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", 0, err
	}
	if !fi.Mode().IsRegular() {
		return "", 0, fmt.Errorf("%s is not a file", path)
	}
	k := digestKey{path, fi.Size(), fi.ModTime()}
	digests.Lock()
	d, ok := digests.m[k]
	digests.Unlock()
	if ok {
		return d, fi.Size(), nil
	}
	h := sha256.New()
	if _, err := io.Copy(h, &progressReader{r: f, size: fi.Size(), tell: progress}); err != nil {
		return "", 0, fmt.Errorf("read %s: %w", path, err)
	}
	d = "sha256:" + hex.EncodeToString(h.Sum(nil))
	digests.Lock()
	if digests.m == nil {
		digests.m = map[digestKey]string{}
	}
	digests.m[k] = d
	digests.Unlock()
	return d, fi.Size(), nil
}
