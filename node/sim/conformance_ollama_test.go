package sim

import (
	"strings"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/internal/realengine"
	"github.com/gpuplane/gpuplane/internal/tinygguf"
)

func init() { conformanceEngines = append(conformanceEngines, ollamaConformance) }

// helloDigest is the SHA-256 of "hello", a blob that is not GGUF;
// worldDigest that of "world".
const (
	helloDigest = "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
	worldDigest = "486ea46224d1bb4fb680f34f7c9ad96a8f24ec88be73ea8e5a6c65260e9cb8a7"
)

// ollamaErrorShape is Ollama's native error: {"error": message}.
func ollamaErrorShape(msg string) []string { return []string{"error=" + msg} }

// ollamaConformance: the model is tiny:1b in Ollama's store. A "loading"
// engine is one that has loaded no model yet: `ollama serve` answers at
// once and loads a model on the first request that names it (the driver's
// preload).
var ollamaConformance = conformanceEngine{
	name: DialectOllama,
	cases: []contract{
		{name: "version before any model is loaded", method: "GET", path: "/api/version", loading: true, status: 200,
			contentType: "application/json", shape: []string{"version"}},
		{name: "ps before any model is loaded", method: "GET", path: "/api/ps", loading: true, status: 200,
			contentType: "application/json", shape: []string{"models=[]"}},
		{name: "root", method: "GET", path: "/", status: 200, contentType: "text/plain", shape: []string{"~Ollama is running"}},
		{name: "no /health", method: "GET", path: "/health", status: 404, contentType: "text/plain", shape: []string{"~404 page not found"}},
		{name: "unknown route", method: "GET", path: "/nosuch", status: 404, contentType: "text/plain", shape: []string{"~404 page not found"}},
		{name: "load (the driver's preload)", method: "POST", path: "/api/generate", body: `{"model":"tiny:1b","keep_alive":-1}`, status: 200,
			contentType: "application/json", shape: []string{"model=tiny:1b", "done=true", "done_reason=load", "response="}},
		{name: "ps lists the loaded model", method: "GET", path: "/api/ps", status: 200, contentType: "application/json",
			shape: []string{"models.0.name=tiny:1b", "models.0.model=tiny:1b", "models.0.size", "models.0.size_vram", "models.0.expires_at"}},
		{name: "a name in another case and with library/", method: "POST", path: "/api/generate", body: `{"model":"library/TINY:1b","keep_alive":-1}`,
			status: 200, contentType: "application/json", shape: []string{"model=library/TINY:1b", "done_reason=load"}},
		{name: "load through /api/embed without input", method: "POST", path: "/api/embed", body: `{"model":"tiny:1b","keep_alive":-1}`, status: 200,
			contentType: "application/json", shape: []string{"model=tiny:1b", "embeddings=[]"}},
		{name: "embed", method: "POST", path: "/api/embed", body: `{"model":"tiny:1b","input":"hello"}`, status: 200,
			contentType: "application/json", shape: []string{"model=tiny:1b", "embeddings.0.0", "prompt_eval_count"}},
		{name: "unknown model (native)", method: "POST", path: "/api/generate", body: `{"model":"nosuch","keep_alive":-1}`, status: 404,
			contentType: "application/json", shape: ollamaErrorShape("model 'nosuch' not found")},
		{name: "unknown model (OpenAI)", method: "POST", path: "/v1/chat/completions", body: `{"model":"chat","messages":[{"role":"user","content":"hi"}]}`,
			status: 404, contentType: "application/json", shape: []string{"error.message=model 'chat' not found", "error.type=not_found_error"}},
		{name: "models", method: "GET", path: "/v1/models", status: 200, contentType: "application/json",
			shape: []string{"object=list", "data.0.id=tiny:1b"}},
		{name: "chat", method: "POST", path: "/v1/chat/completions",
			body: `{"model":"tiny:1b","messages":[{"role":"user","content":"hello"}],"max_tokens":2,"temperature":0}`, status: 200,
			contentType: "application/json", shape: []string{"object=chat.completion", "model=tiny:1b", "choices.0.message.role=assistant",
				"choices.0.message.content", "usage.completion_tokens=2", "usage.prompt_tokens"}},
		{name: "completion", method: "POST", path: "/v1/completions", body: `{"model":"tiny:1b","prompt":"hello","max_tokens":2,"temperature":0}`,
			status: 200, contentType: "application/json", shape: []string{"object=text_completion", "model=tiny:1b", "choices.0.text",
				"usage.completion_tokens=2"}},
		{name: "stream with usage", method: "POST", path: "/v1/chat/completions",
			body:   `{"model":"tiny:1b","messages":[{"role":"user","content":"hello"}],"max_tokens":2,"stream":true,"stream_options":{"include_usage":true}}`,
			status: 200, contentType: "text/event-stream", shape: []string{`~"model":"tiny:1b"`, `~"completion_tokens":2`, "~data: [DONE]"}},
		{name: "embeddings (OpenAI)", method: "POST", path: "/v1/embeddings", body: `{"model":"tiny:1b","input":["hello","the"]}`, status: 200,
			contentType: "application/json", shape: []string{"object=list", "data.0.embedding.0", "data.1.index=1", "model=tiny:1b"}},
		{name: "unload", method: "POST", path: "/api/generate", body: `{"model":"tiny:1b","keep_alive":0}`, status: 200,
			contentType: "application/json", shape: []string{"model=tiny:1b", "done=true", "done_reason=unload"}},
		// The store: blobs and /api/create (the driver's route for a
		// deployment whose model is a GGUF file).
		{name: "blob in the store", method: "HEAD", path: "/api/blobs/sha256:{tiny}", status: 200},
		{name: "blob not in the store", method: "HEAD", path: "/api/blobs/sha256:" + strings.Repeat("1", 64), status: 404,
			contentType: "application/json"},
		{name: "blob digest in another format", method: "POST", path: "/api/blobs/nonsense", body: "hello", status: 400,
			contentType: "application/json", shape: ollamaErrorShape("invalid digest format")},
		{name: "blob upload", method: "POST", path: "/api/blobs/sha256:" + helloDigest, body: "hello", status: 201},
		{name: "blob upload the store holds", method: "POST", path: "/api/blobs/sha256:" + helloDigest, body: "hello", status: 200},
		{name: "blob whose body is not its digest", method: "POST", path: "/api/blobs/sha256:" + strings.Repeat("0", 64), body: "world", status: 400,
			contentType: "application/json", shape: ollamaErrorShape(`digest mismatch, expected "sha256:` + strings.Repeat("0", 64) + `", got "sha256:` + worldDigest + `"`)},
		{name: "… is stored under its own digest all the same", method: "HEAD", path: "/api/blobs/sha256:" + worldDigest, status: 200},
		{name: "blob method", method: "GET", path: "/api/blobs/sha256:{tiny}", status: 405, contentType: "text/plain",
			shape: []string{"~405 method not allowed"}},
		{name: "create: a .gguf file that is not GGUF", method: "POST", path: "/api/create",
			body: `{"model":"made:1b","files":{"x.gguf":"sha256:` + helloDigest + `"},"stream":false}`, status: 400,
			contentType: "application/json", shape: ollamaErrorShape("supplied file was not in GGUF format")},
		{name: "create: no GGUF among the files", method: "POST", path: "/api/create",
			body: `{"model":"made:1b","files":{"x.txt":"sha256:` + helloDigest + `"},"stream":false}`, status: 400,
			contentType: "application/json", shape: ollamaErrorShape("unknown type")},
		{name: "create: a blob the store lacks", method: "POST", path: "/api/create",
			body: `{"model":"made:1b","files":{"x.gguf":"sha256:` + strings.Repeat("1", 64) + `"},"stream":false}`, status: 500,
			contentType: "application/json", shape: []string{"~/blobs/sha256-" + strings.Repeat("1", 64) + ": no such file or directory"}},
		{name: "create: a digest in another format", method: "POST", path: "/api/create",
			body: `{"model":"made:1b","files":{"x.gguf":"nonsense"},"stream":false}`, status: 500,
			contentType: "application/json", shape: ollamaErrorShape("invalid digest format")},
		{name: "create: an invalid name", method: "POST", path: "/api/create",
			body: `{"model":"made 1b!","files":{"tiny.gguf":"sha256:{tiny}"},"stream":false}`, status: 400,
			contentType: "application/json", shape: ollamaErrorShape("invalid model name")},
		{name: "create: no files", method: "POST", path: "/api/create", body: `{"model":"made:1b","stream":false}`, status: 400,
			contentType: "application/json", shape: ollamaErrorShape("neither 'from' or 'files' was specified")},
		{name: "create: a file path outside", method: "POST", path: "/api/create",
			body: `{"model":"made:1b","files":{"../tiny.gguf":"sha256:{tiny}"},"stream":false}`, status: 400,
			contentType: "application/json", shape: ollamaErrorShape("file path must be relative")},
		{name: "a model not yet created", method: "POST", path: "/api/generate", body: `{"model":"made:1b","keep_alive":-1}`, status: 404,
			contentType: "application/json", shape: ollamaErrorShape("model 'made:1b' not found")},
		{name: "create (the driver's)", method: "POST", path: "/api/create",
			body: `{"model":"made:1b","files":{"tiny.gguf":"sha256:{tiny}"},"stream":false}`, status: 200,
			contentType: "application/json", shape: []string{"status=success"}},
		{name: "create again, streaming", method: "POST", path: "/api/create",
			body: `{"model":"made:1b","files":{"tiny.gguf":"sha256:{tiny}"}}`, status: 200, contentType: "application/x-ndjson",
			shape: []string{`~{"status":"parsing GGUF"}` + "\n", `~{"status":"using existing layer sha256:{tiny}"}`, `~{"status":"success"}`}},
		{name: "create streaming a failure", method: "POST", path: "/api/create",
			body: `{"model":"made:1b","files":{"x.gguf":"sha256:` + helloDigest + `"}}`, status: 200, contentType: "application/x-ndjson",
			shape: []string{`~{"error":"supplied file was not in GGUF format"}`}},
		{name: "load the created model", method: "POST", path: "/api/generate", body: `{"model":"made:1b","keep_alive":-1}`, status: 200,
			contentType: "application/json", shape: []string{"model=made:1b", "done=true", "done_reason=load"}},
		{name: "ps lists the created model", method: "GET", path: "/api/ps", status: 200, contentType: "application/json",
			shape: []string{"models.0.name=made:1b", "models.0.model=made:1b"}},
		{name: "chat with the created model", method: "POST", path: "/v1/chat/completions",
			body: `{"model":"made:1b","messages":[{"role":"user","content":"hello"}],"max_tokens":2}`, status: 200,
			contentType: "application/json", shape: []string{"object=chat.completion", "model=made:1b", "usage.completion_tokens=2"}},
	},
	sim: func(t *testing.T, loading bool) string {
		base := startLoadingEngine(t, Config{ServedModelName: "tiny:1b", MemoryMiB: 1024, Dialect: DialectOllama,
			LoadTime: 50 * time.Millisecond, TokensPerSecond: 0})
		// The sim holds tiny:1b from the start; this puts the file's
		// blob in its store too, as on the real side.
		realengine.CreateOllamaModel(t, base, "tiny:1b", tinygguf.Write(t).Model)
		return base
	},
	real: func(t *testing.T, loading bool) string {
		base := realengine.StartOllama(t)
		realengine.CreateOllamaModel(t, base, "tiny:1b", tinygguf.Write(t).Model)
		return base
	},
}
