package sim

import (
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/internal/realengine"
	"github.com/gpuplane/gpuplane/internal/tinygguf"
)

func init() { conformanceEngines = append(conformanceEngines, ollamaConformance) }

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
	},
	sim: func(t *testing.T, loading bool) string {
		return startLoadingEngine(t, Config{ServedModelName: "tiny:1b", MemoryMiB: 1024, Dialect: DialectOllama,
			LoadTime: 50 * time.Millisecond, TokensPerSecond: 0})
	},
	real: func(t *testing.T, loading bool) string {
		base := realengine.StartOllama(t)
		realengine.CreateOllamaModel(t, base, "tiny:1b", tinygguf.Write(t).Model)
		return base
	},
}
