package sim

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"regexp"
	"strings"
	"sync"

	"github.com/gpuplane/gpuplane/internal/ollamaname"
)

// The ollama dialect's model store, as Ollama 0.24 answers it
// (server/routes.go HeadBlobHandler, CreateBlobHandler, CreateHandler;
// TestRealConformance checks each answer against the real binary): blobs
// go up by digest (POST /api/blobs/sha256:<hex>, HEAD to ask for one),
// then POST /api/create {model, files: {name: digest}} makes a model of a
// GGUF blob. A model created so is served as the engine's own model: the
// sim has one set of weights, whatever file the model came from. The
// store lives as long as the engine (Ollama's is on disk): a restarted
// sim has only its --served-model-name, as if pulled.
type ollamaStore struct {
	mu sync.Mutex
	// blobs: "sha256-<hex>" as the digest named it (Ollama's file name)
	// to whether the blob starts as a GGUF file does.
	blobs map[string]bool
	// models are the names /api/create made.
	models []string
	// loadedAs is the created model a load last named, which /api/ps
	// lists; "": the served name.
	loadedAs string
}

// ollamaBlobsDir is where the dialect says its blobs are, in the errors
// Ollama words with a path.
const ollamaBlobsDir = "/sim/ollama/models/blobs"

// ollamaDigest is Ollama's digest format (GetBlobsPath): sha256, ':' or
// '-', 64 hex digits of either case.
var ollamaDigest = regexp.MustCompile(`^sha256[:-][0-9a-fA-F]{64}$`)

// blobFile is the blob's file name for a digest, "" for one not in
// Ollama's format.
func blobFile(digest string) string {
	if !ollamaDigest.MatchString(digest) {
		return ""
	}
	return "sha256-" + digest[len("sha256:"):]
}

// ollamaBlob answers /api/blobs/{digest}: HEAD says whether the store
// holds the blob (200, or 404 `blob "<digest>" not found`), POST stores
// the body as it unless the store holds it already (200 without reading
// it): 201, or 400 "digest mismatch" when the body's SHA-256 is not the
// digest (the body is kept under its own). A digest not in Ollama's format is 400 "invalid digest format";
// another method is gin's plain 405.
func (s *server) ollamaBlob(w http.ResponseWriter, r *http.Request) {
	digest := r.PathValue("digest")
	if r.Method != http.MethodHead && r.Method != http.MethodPost {
		w.Header().Set("Allow", "HEAD, POST")
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusMethodNotAllowed)
		fmt.Fprint(w, "405 method not allowed")
		return
	}
	file := blobFile(digest)
	if file == "" {
		ollamaError(w, http.StatusBadRequest, "invalid digest format")
		return
	}
	st := &s.store
	st.mu.Lock()
	_, have := st.blobs[file]
	st.mu.Unlock()
	if r.Method == http.MethodHead {
		if !have {
			ollamaError(w, http.StatusNotFound, fmt.Sprintf("blob %q not found", digest))
			return
		}
		w.WriteHeader(http.StatusOK)
		return
	}
	if have {
		w.Header().Set("Connection", "close")
		w.WriteHeader(http.StatusOK)
		return
	}
	h := sha256.New()
	var head bytes.Buffer
	if _, err := io.Copy(io.MultiWriter(h, &prefixWriter{buf: &head, n: 4}), r.Body); err != nil {
		ollamaError(w, http.StatusInternalServerError, err.Error())
		return
	}
	// Ollama stores the body under its own digest ("sha256:" and
	// lower-case hex) before it compares that with the one named: a
	// mismatched body stays in the store.
	sum := hex.EncodeToString(h.Sum(nil))
	st.mu.Lock()
	if st.blobs == nil {
		st.blobs = map[string]bool{}
	}
	st.blobs["sha256-"+sum] = head.String() == "GGUF"
	st.mu.Unlock()
	if got := "sha256:" + sum; got != digest {
		ollamaError(w, http.StatusBadRequest, fmt.Sprintf("digest mismatch, expected %q, got %q", digest, got))
		return
	}
	w.WriteHeader(http.StatusCreated)
}

// prefixWriter keeps the first n bytes written to it.
type prefixWriter struct {
	buf *bytes.Buffer
	n   int
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	if rest := p.n - p.buf.Len(); rest > 0 {
		p.buf.Write(b[:min(rest, len(b))])
	}
	return len(b), nil
}

// ollamaCreate answers POST /api/create from files: the request is
// checked first (400 "invalid model name", "neither 'from' or 'files'
// was specified", "file path must be relative"), then each file's blob
// is read: a digest not in Ollama's format or a blob the store lacks is
// a 500, a ".gguf" file that is not GGUF 400 "supplied file was not in
// GGUF format", and files with no GGUF among them 400 "unknown type".
// With "stream": false the answer is one JSON object (the error's
// status, or 200 {"status":"success"}); otherwise it is 200 NDJSON
// progress ending in {"status":"success"} or {"error":…}. A name already
// in the store is made anew.
func (s *server) ollamaCreate(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model  string            `json:"model"`
		From   string            `json:"from"`
		Files  map[string]string `json:"files"`
		Stream *bool             `json:"stream"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&req); err != nil {
		ollamaError(w, http.StatusBadRequest, err.Error())
		return
	}
	if !validOllamaName(req.Model) {
		ollamaError(w, http.StatusBadRequest, "invalid model name")
		return
	}
	if req.From == "" && req.Files == nil {
		ollamaError(w, http.StatusBadRequest, "neither 'from' or 'files' was specified")
		return
	}
	for name := range req.Files {
		if !fs.ValidPath(name) {
			ollamaError(w, http.StatusBadRequest, "file path must be relative")
			return
		}
	}
	stream := req.Stream == nil || *req.Stream
	var progress []string
	code, msg := s.createFromFiles(req.Model, req.From, req.Files, func(status string) { progress = append(progress, status) })
	if !stream {
		if msg != "" {
			ollamaError(w, code, msg)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"status":"success"}`)
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	enc := json.NewEncoder(w)
	for _, p := range progress {
		enc.Encode(map[string]string{"status": p})
	}
	if msg != "" {
		enc.Encode(map[string]string{"error": msg})
		return
	}
	enc.Encode(map[string]string{"status": "success"})
}

// createFromFiles makes model from files (name to digest), telling
// progress each step; it says the failure's status and message, or "".
func (s *server) createFromFiles(model, from string, files map[string]string, progress func(string)) (int, string) {
	if len(files) == 0 && from != "" {
		// Ollama pulls a model it lacks from its registry, which no
		// sim reaches.
		return http.StatusInternalServerError, fmt.Sprintf("pull model manifest: the sim engine reaches no registry for %q", from)
	}
	st := &s.store
	st.mu.Lock()
	defer st.mu.Unlock()
	var gguf []string
	for name, digest := range files {
		isGGUF := strings.HasSuffix(strings.ToLower(name), ".gguf")
		if !isGGUF {
			// Ollama looks inside a file without the extension.
			file := blobFile(digest)
			isGGUF = file != "" && st.blobs[file]
		}
		if isGGUF {
			gguf = append(gguf, digest)
		}
	}
	if len(gguf) == 0 {
		return http.StatusBadRequest, "unknown type"
	}
	progress("parsing GGUF")
	for _, digest := range gguf {
		file := blobFile(digest)
		if file == "" {
			return http.StatusInternalServerError, "invalid digest format"
		}
		magic, ok := st.blobs[file]
		if !ok {
			return http.StatusInternalServerError, fmt.Sprintf("open %s/%s: no such file or directory", ollamaBlobsDir, file)
		}
		if !magic {
			return http.StatusBadRequest, "supplied file was not in GGUF format"
		}
		progress("using existing layer sha256:" + file[len("sha256-"):])
	}
	progress("writing manifest")
	for _, m := range st.models {
		if ollamaname.Same(m, model) {
			return 0, ""
		}
	}
	st.models = append(st.models, model)
	return 0, ""
}

// created says whether /api/create made a model of that name.
func (s *server) created(model string) bool {
	st := &s.store
	st.mu.Lock()
	defer st.mu.Unlock()
	for _, m := range st.models {
		if ollamaname.Same(m, model) {
			return true
		}
	}
	return false
}

// noteLoaded records the model a load named, for /api/ps: one of the
// created models, or the served name.
func (s *server) noteLoaded(model string) {
	st := &s.store
	st.mu.Lock()
	defer st.mu.Unlock()
	st.loadedAs = ""
	if ollamaname.Same(model, s.cfg.ServedModelName) {
		return
	}
	for _, m := range st.models {
		if ollamaname.Same(m, model) {
			st.loadedAs = m
		}
	}
}

// psName is the name /api/ps lists the loaded model by.
func (s *server) psName() string {
	st := &s.store
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.loadedAs != "" {
		return st.loadedAs
	}
	return s.cfg.ServedModelName
}

// validOllamaName is Ollama's Name.IsValid for a name to create: a model
// part, and any host, namespace and tag, each starting with a letter or
// digit and at most 80 characters (host up to 350) of letters, digits,
// '_', '-' and, but in the namespace, '.'.
func validOllamaName(s string) bool {
	if s == "" || strings.Contains(s, "@") {
		return false
	}
	rest, tag := s, ""
	if i := strings.LastIndex(s, ":"); i > strings.LastIndex(s, "/") {
		rest, tag = s[:i], s[i+1:]
		if !namePart(tag, 80, true) {
			return false
		}
	}
	parts := strings.Split(rest, "/")
	if len(parts) > 3 || !namePart(parts[len(parts)-1], 80, true) {
		return false
	}
	if len(parts) >= 2 && !namePart(parts[len(parts)-2], 80, false) {
		return false
	}
	if len(parts) == 3 && !namePart(parts[0], 350, true) {
		return false
	}
	return true
}

func namePart(p string, maxLen int, dots bool) bool {
	if p == "" || len(p) > maxLen {
		return false
	}
	for i, c := range p {
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if i == 0 && !alnum || !alnum && c != '_' && c != '-' && !(dots && c == '.') {
			return false
		}
	}
	return true
}
