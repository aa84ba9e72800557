package agent_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/gpuplane/gpuplane/internal/realengine"
	"github.com/gpuplane/gpuplane/internal/testutil"
	"github.com/gpuplane/gpuplane/internal/tinygguf"
	"github.com/gpuplane/gpuplane/node/executor"
)

// Real engines behind a real agent: an in-process --dev agent with a
// simulated card starts the real llama-server and `ollama serve` (the CPU
// builds realengine finds) from its drivers' commands, and clients reach
// them through its gateway.

// realEnginesOnPath puts the real llama-server and ollama first on the
// PATH the agent starts engines from, as a user installs them.
func realEnginesOnPath(t *testing.T) {
	t.Helper()
	dir := t.TempDir()
	for name, path := range map[string]string{"llama-server": realengine.LlamaServer(t), "ollama": realengine.Ollama(t)} {
		if err := os.Symlink(path, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
}

// realNode is a --dev agent with one simulated L4, the real engines on its
// PATH, and a shared accelerator on it. Its engines run under MPS's hard
// limits (CUDA_MPS_* in their environment, which these CPU builds ignore):
// a node runs Ollama, which has no memory knob, on a share of a card only
// under hard limits. Nothing runs MPS here, so a listening socket where
// its control daemon would listen stands for it, as the simulated card
// stands for the GPU.
func realNode(t *testing.T) *node {
	t.Helper()
	realEnginesOnPath(t)
	pipes, err := os.MkdirTemp("", "mps")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(pipes) })
	ln, err := net.Listen("unix", filepath.Join(pipes, "control"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	t.Setenv("CUDA_MPS_PIPE_DIRECTORY", pipes)
	n := newNode(t, "real", true, "l4=1")
	n.cfg.Dev, n.cfg.BootstrapExpect, n.cfg.Enforce = true, 0, "mps"
	n.start(t)
	gpuplane(t, n, "accelerators", "create", "shared", "--device", "l4", "--tenancy", "shared", "--max-models", "4")
	return n
}

// ollamaDeployment is the spec of an Ollama deployment of model whose
// `ollama serve` keeps its models in store, its keys under home.
func ollamaDeployment(name, model, residency, store, home string) string {
	return fmt.Sprintf(`resource: ModelDeployment
resourceVersion: v1
metadata: {name: %s}
spec:
  model: %s
  residency: %s
  placement: {accelerator: shared}
  engine: {kind: ollama, memoryPercent: 20, env: {OLLAMA_MODELS: %q, HOME: %q, OLLAMA_NUM_PARALLEL: "1"}}
`, name, model, residency, store, home)
}

// llamaDeployment is the spec of a llama.cpp deployment of the GGUF file
// at model with extra llama-server args.
func llamaDeployment(name, model string, args ...string) string {
	quoted := []string{`"--threads"`, `"1"`}
	for _, a := range args {
		quoted = append(quoted, fmt.Sprintf("%q", a))
	}
	return fmt.Sprintf(`resource: ModelDeployment
resourceVersion: v1
metadata: {name: %s}
spec:
  model: %s
  residency: pinned
  placement: {accelerator: shared}
  engine: {kind: llamacpp, memoryPercent: 20, maxModelLen: 512, args: [%s]}
`, name, model, strings.Join(quoted, ", "))
}

// checkOpenAIServes drives chat, streamed chat with usage, completions and
// (when embed is set) embeddings through n's gateway with the official
// OpenAI Go client: each answer names the model the client asked for and
// counts the tokens it generated. TestGatewayOpenAIClient runs it against
// the sim, the TestReal… tests against the real engines.
func checkOpenAIServes(t *testing.T, n *node, chat, embed string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := openaiClient(n)
	resp, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: chat,
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello there")}, MaxTokens: openai.Int(5), Temperature: openai.Float(0)})
	if err != nil {
		t.Fatalf("%s chat: %v", chat, err)
	}
	if len(resp.Choices) != 1 || resp.Model != chat || resp.Usage.CompletionTokens < 1 || resp.Usage.CompletionTokens > 5 || resp.Usage.PromptTokens < 1 {
		t.Fatalf("%s chat answer: model %q, %d choices, usage %+v", chat, resp.Model, len(resp.Choices), resp.Usage)
	}

	stream := c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: chat,
		Messages:      []openai.ChatCompletionMessageParamUnion{openai.UserMessage("stream please")},
		MaxTokens:     openai.Int(6),
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}})
	var text strings.Builder
	chunks, usage := 0, int64(-1)
	for stream.Next() {
		ch := stream.Current()
		chunks++
		if ch.Model != chat {
			t.Fatalf("%s stream: a chunk names model %q", chat, ch.Model)
		}
		if len(ch.Choices) > 0 {
			text.WriteString(ch.Choices[0].Delta.Content)
		}
		if ch.Usage.CompletionTokens > 0 {
			usage = ch.Usage.CompletionTokens
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("%s chat stream: %v", chat, err)
	}
	if chunks < 2 || text.Len() == 0 || usage < 1 || usage > 6 {
		t.Fatalf("%s chat stream: %d chunks, text %q, usage %d; want text and a usage chunk", chat, chunks, text.String(), usage)
	}

	comp, err := c.Completions.New(ctx, openai.CompletionNewParams{Model: openai.CompletionNewParamsModel(chat),
		Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("once upon")}, MaxTokens: openai.Int(3)})
	if err != nil || len(comp.Choices) != 1 || comp.Model != chat || comp.Usage.CompletionTokens < 1 {
		t.Fatalf("%s completion: %+v, %v", chat, comp, err)
	}

	if embed == "" {
		return
	}
	emb, err := c.Embeddings.New(ctx, openai.EmbeddingNewParams{Model: embed,
		Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: []string{"a b", "c"}}, EncodingFormat: openai.EmbeddingNewParamsEncodingFormatFloat})
	if err != nil || len(emb.Data) != 2 || len(emb.Data[0].Embedding) == 0 || len(emb.Data[1].Embedding) != len(emb.Data[0].Embedding) {
		t.Fatalf("%s embeddings: %+v, %v", embed, emb, err)
	}
}

// replicaRow is a replica as `replicas list -o json` shows it.
type replicaRow struct {
	Model, State, Reason, Residency, Endpoint string
}

func replicaOf(t *testing.T, n *node, model string) (replicaRow, bool) {
	t.Helper()
	out, err := tryCLI(n, "replicas", "list", "-o", "json")
	if err != nil {
		return replicaRow{}, false
	}
	var rs []replicaRow
	if err := json.Unmarshal([]byte(out), &rs); err != nil {
		t.Fatalf("replicas list: %v: %s", err, out)
	}
	for _, r := range rs {
		if r.Model == model {
			return r, true
		}
	}
	return replicaRow{}, false
}

// TestRealOllamaThroughTheGateway: Ollama deployments whose model is a
// GGUF file (the driver creates each in Ollama's store): a completion
// model answers chat, streamed chat with usage and completions through the
// gateway with the OpenAI client, naming the deployment, not Ollama's tag;
// an embedding model becomes ready (preloaded through /api/embed) and
// embeds; `models unload` sleeps the warm model (its Ollama's /api/ps
// empties while `ollama serve` stays), `models load` loads it again, and a
// request wakes it from sleep.
func TestRealOllamaThroughTheGateway(t *testing.T) {
	n := realNode(t)
	dir := t.TempDir()
	store := filepath.Join(dir, "models")
	files := tinygguf.Write(t)
	embedFile := filepath.Join(dir, "tiny-embed.gguf")
	if err := tinygguf.WriteModel(embedFile, tinygguf.ModelOptions{Pooling: 1, Name: "tiny-embed"}); err != nil {
		t.Fatal(err)
	}
	applySpec(t, n, "otiny", ollamaDeployment("otiny", files.Model, "warm", store, dir))
	applySpec(t, n, "oembed", ollamaDeployment("oembed", embedFile, "pinned", store, dir))
	waitReplica(t, n, "otiny", "Resident")
	waitReplica(t, n, "oembed", "Running")
	if ps := ollamaPS(t, n, "otiny"); ps == "" {
		t.Fatal("otiny Resident, but its Ollama lists nothing in /api/ps")
	}

	// Before any traffic (after it, the controller's forecast wakes a
	// model it expects requests for at once).
	t.Logf("models unload otiny:\n%s", gpuplane(t, n, "models", "unload", "otiny"))
	waitReplica(t, n, "otiny", "Sleeping")
	if ps := ollamaPS(t, n, "otiny"); ps != "" {
		t.Fatalf("otiny asleep, but its Ollama lists %s in /api/ps", ps)
	}
	gpuplane(t, n, "models", "load", "otiny")
	waitReplica(t, n, "otiny", "Resident")
	if ps := ollamaPS(t, n, "otiny"); ps == "" {
		t.Fatal("otiny loaded, but its Ollama lists nothing in /api/ps")
	}
	gpuplane(t, n, "models", "unload", "otiny")
	waitReplica(t, n, "otiny", "Sleeping")
	// A request wakes it.
	checkOpenAIServes(t, n, "otiny", "oembed")
	if ps := ollamaPS(t, n, "otiny"); ps == "" {
		t.Fatal("otiny answered, but its Ollama lists nothing in /api/ps")
	}
}

// ollamaPS is what the `ollama serve` of model's replica lists in /api/ps
// (its names, comma-separated), found through the engine process the
// agent recorded.
func ollamaPS(t *testing.T, n *node, model string) string {
	t.Helper()
	base := engineURL(t, n, model)
	resp, err := http.Get(base + "/api/ps")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Models []struct{ Name string } `json:"models"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range out.Models {
		names = append(names, m.Name)
	}
	return strings.Join(names, ",")
}

// engineURL is the address of model's replica 0's engine, from the record
// the agent keeps of it (pid.json).
func engineURL(t *testing.T, n *node, model string) string {
	t.Helper()
	path := executor.ReplicaDir(n.cfg.DataDir, model, 0) + "/pid.json"
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rec struct {
		Port int `json:"port"`
	}
	if err := json.Unmarshal(data, &rec); err != nil || rec.Port == 0 {
		t.Fatalf("engine record %s: %v: %s", path, err, data)
	}
	return fmt.Sprintf("http://127.0.0.1:%d", rec.Port)
}

// TestRealOllamaMissingModelFails: an Ollama deployment of a tag its
// store does not hold fails its replica within seconds, with a reason that
// names the model, the store and the fix.
func TestRealOllamaMissingModelFails(t *testing.T) {
	n := realNode(t)
	dir := t.TempDir()
	start := time.Now()
	applySpec(t, n, "gone", ollamaDeployment("gone", "tiny:1b", "pinned", filepath.Join(dir, "models"), dir))
	var r replicaRow
	testutil.Eventually(t, 30*time.Second, "gone Failed", func() error {
		var ok bool
		if r, ok = replicaOf(t, n, "gone"); !ok || !strings.EqualFold(r.State, "Failed") {
			return fmt.Errorf("replica %+v", r)
		}
		return nil
	})
	took := time.Since(start)
	t.Logf("Failed after %s: %s", took.Round(time.Millisecond), r.Reason)
	if took > 10*time.Second {
		t.Errorf("the replica failed %s after the apply; want under 10s", took.Round(time.Millisecond))
	}
	for _, want := range []string{`"tiny:1b" is not in Ollama's store`, "ollama pull tiny:1b", "GGUF"} {
		if !strings.Contains(r.Reason, want) {
			t.Errorf("reason %q does not say %q", r.Reason, want)
		}
	}
	// A request for it is answered at once with the reason, not queued
	// for an engine that is not coming (the replica restarts with backoff:
	// asked while Failed).
	testutil.Eventually(t, 30*time.Second, "a request refused with the reason", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		c := openaiClient(n)
		_, err := c.Completions.New(ctx, openai.CompletionNewParams{Model: openai.CompletionNewParamsModel("gone"),
			Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("x")}, MaxTokens: openai.Int(2)})
		var e *openai.Error
		if !errors.As(err, &e) || e.StatusCode != http.StatusServiceUnavailable || e.Code != "model_failed" ||
			!strings.Contains(e.Message, "ollama pull tiny:1b") {
			return fmt.Errorf("answer: %v", err)
		}
		t.Logf("a request for it: %d %s", e.StatusCode, e.Message)
		return nil
	})
}

// TestRealLlamaCppThroughTheGateway: llama.cpp deployments of a GGUF file,
// one generating and one embedding (--embeddings), answer chat, streamed
// chat with usage, completions and embeddings through the gateway.
func TestRealLlamaCppThroughTheGateway(t *testing.T) {
	n := realNode(t)
	files := tinygguf.Write(t)
	applySpec(t, n, "ltiny", llamaDeployment("ltiny", files.Model))
	applySpec(t, n, "lembed", llamaDeployment("lembed", files.Model, "--embeddings", "--pooling", "mean"))
	waitReplica(t, n, "ltiny", "Running")
	waitReplica(t, n, "lembed", "Running")
	checkOpenAIServes(t, n, "ltiny", "lembed")
}
