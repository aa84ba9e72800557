package gateway

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/gpuplane/gpuplane/node/gateway/queue"
	"github.com/gpuplane/gpuplane/node/sim"
)

// chatCreated is the chat deployment's creation time in the test's view.
const chatCreated = 1767225600

// conformance is one gateway in front of two real sim engines, shared by
// the SDK conformance subtests: "chat" (a generative model, context 2048,
// alias "assistant", adapters "sql" for everyone and "ledger" for acme)
// and "embed" (an embedding model, context 512, no creation time in the
// view: the gateway stamps one).
type conformance struct {
	url    string
	client openai.Client
}

func startConformance(t *testing.T) *conformance {
	t.Helper()
	chat := simEngineWith(t, sim.Config{ServedModelName: "chat", Runner: sim.RunnerGenerate, LoRALoad: sim.LoadDist{Fixed: time.Millisecond}})
	embed := simEngineWith(t, sim.Config{ServedModelName: "embed", Runner: sim.RunnerPooling})
	for _, a := range []string{"sql", "ledger"} {
		resp, err := http.Post(chat+"/v1/load_lora_adapter", "application/json",
			strings.NewReader(fmt.Sprintf(`{"lora_name":%q,"lora_path":"/adapters/%s"}`, a, a)))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("load adapter %s: %d %s", a, resp.StatusCode, b)
		}
	}
	replica := func(name, url string) []Replica {
		return []Replica{{Deployment: name, Node: "n1", Endpoint: url, Kind: "sim", Running: true, Resident: true}}
	}
	view := fixedView{[]Model{
		{Served: "chat", Deployment: "chat", Class: queue.Standard, Created: chatCreated, Aliases: []string{"assistant"},
			Adapters: map[string][]string{"sql": nil, "ledger": {"acme"}}, MaxModelLen: 2048, Task: TaskGenerate, Replicas: replica("chat", chat)},
		{Served: "embed", Deployment: "embed", Class: queue.Standard, MaxModelLen: 512, Task: TaskEmbed, Replicas: replica("embed", embed)},
	}}
	_, srv, _ := startGateway(t, Options{Node: "n1", Cluster: view})
	c := &conformance{url: srv.URL, client: openai.NewClient(option.WithBaseURL(srv.URL+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))}
	// Served once the first refresh has placed the replicas.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		code, _ := c.post(t, "/v1/completions", `{"model":"chat","prompt":"ping","max_tokens":1}`)
		if code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("chat not served: %d", code)
		}
	}
	return c
}

// post sends body to the gateway's path: the status and the answer.
func (c *conformance) post(t *testing.T, path, body string) (int, []byte) {
	t.Helper()
	resp, err := http.Post(c.url+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// wantError checks that err is the SDK's typed error with status, code and
// param, its message naming names.
func wantError(t *testing.T, err error, status int, code, param, names string) {
	t.Helper()
	var e *openai.Error
	if !errors.As(err, &e) {
		t.Fatalf("want an *openai.Error %d %s, got %v", status, code, err)
	}
	if e.StatusCode != status || e.Code != code || e.Param != param || e.Type == "" || !strings.Contains(e.Message, names) {
		t.Fatalf("error %d type %q code %q param %q: %s\nwant %d code %q param %q naming %q", e.StatusCode, e.Type, e.Code, e.Param, e.Message, status, code, param, names)
	}
}

// TestOpenAIConformance drives every endpoint the official OpenAI SDKs
// call for models, chat, completions and embeddings through the gateway
// with the official Go SDK: answers decode into its types, refusals are
// its typed errors with a string code and the param at fault.
func TestOpenAIConformance(t *testing.T) {
	c := startConformance(t)
	ctx := context.Background()
	sdk := c.client
	acme := option.WithHeader(TenantHeader, "acme")

	t.Run("models list", func(t *testing.T) {
		ids := func(opts ...option.RequestOption) map[string]openai.Model {
			t.Helper()
			page, err := sdk.Models.List(ctx, opts...)
			if err != nil {
				t.Fatalf("list: %v", err)
			}
			out := map[string]openai.Model{}
			for _, m := range page.Data {
				out[m.ID] = m
			}
			return out
		}
		all := ids()
		for _, id := range []string{"chat", "assistant", "sql", "embed"} {
			if _, ok := all[id]; !ok {
				t.Fatalf("models: no %q in %v", id, keys(all))
			}
		}
		if _, ok := all["ledger"]; ok || len(all) != 4 {
			t.Fatalf("models for the default tenant: %v; want chat, assistant, sql, embed (ledger is acme's)", keys(all))
		}
		if p := all["sql"].JSON.ExtraFields["parent"].Raw(); p != `"chat"` {
			t.Fatalf("adapter sql's parent: %s, want \"chat\"", p)
		}
		if r := all["assistant"].JSON.ExtraFields["root"].Raw(); r != `"chat"` {
			t.Fatalf("alias assistant's root: %s, want \"chat\"", r)
		}
		if all["chat"].Created != chatCreated || all["sql"].Created != chatCreated {
			t.Fatalf("created: chat %d, sql %d; want the deployment's %d", all["chat"].Created, all["sql"].Created, chatCreated)
		}
		if e := all["embed"].Created; e < time.Now().Add(-time.Hour).Unix() || ids()["embed"].Created != e {
			t.Fatalf("embed's created %d: want a recent time, the same on every listing", e)
		}
		if l := all["chat"].JSON.ExtraFields["max_model_len"].Raw(); l != "2048" {
			t.Fatalf("chat's max_model_len: %s, want 2048", l)
		}
		ac := ids(acme)
		if p := ac["ledger"].JSON.ExtraFields["parent"].Raw(); p != `"chat"` || len(ac) != 5 {
			t.Fatalf("models for acme: %v (ledger's parent %s); want ledger listed too, parent chat", keys(ac), p)
		}
	})

	t.Run("models retrieve", func(t *testing.T) {
		m, err := sdk.Models.Get(ctx, "chat")
		if err != nil || m.ID != "chat" || m.Created != chatCreated || m.Object != "model" {
			t.Fatalf("retrieve chat: %+v, %v", m, err)
		}
		for _, id := range []string{"sql", "chat:sql"} {
			m, err = sdk.Models.Get(ctx, id)
			if err != nil || m.ID != id || m.JSON.ExtraFields["parent"].Raw() != `"chat"` {
				t.Fatalf("retrieve %s: %+v, %v", id, m, err)
			}
		}
		if m, err = sdk.Models.Get(ctx, "ledger", acme); err != nil || m.ID != "ledger" {
			t.Fatalf("retrieve ledger as acme: %+v, %v", m, err)
		}
		_, err = sdk.Models.Get(ctx, "ledger")
		wantError(t, err, 404, "model_not_found", "model", "ledger")
		_, err = sdk.Models.Get(ctx, "no-such-model")
		wantError(t, err, 404, "model_not_found", "model", "no-such-model")
	})

	t.Run("chat", func(t *testing.T) {
		for _, model := range []string{"chat", "assistant", "sql", "chat:sql"} {
			r, err := sdk.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: model,
				Messages:  []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("be brief"), openai.UserMessage("hello there")},
				MaxTokens: openai.Int(5), Temperature: openai.Float(0.7), TopP: openai.Float(0.9), N: openai.Int(1)})
			if err != nil {
				t.Fatalf("chat with %s: %v", model, err)
			}
			if len(r.Choices) != 1 || len(strings.Fields(r.Choices[0].Message.Content)) != 5 || r.Usage.CompletionTokens != 5 || r.Object != "chat.completion" {
				t.Fatalf("chat with %s: %+v", model, r)
			}
		}
	})

	t.Run("completions", func(t *testing.T) {
		r, err := sdk.Completions.New(ctx, openai.CompletionNewParams{Model: "chat",
			Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("once upon")}, MaxTokens: openai.Int(3)})
		if err != nil || len(r.Choices) != 1 || len(strings.Fields(r.Choices[0].Text)) != 3 || r.Usage.CompletionTokens != 3 {
			t.Fatalf("completion: %+v, %v", r, err)
		}
		r, err = sdk.Completions.New(ctx, openai.CompletionNewParams{Model: "chat",
			Prompt: openai.CompletionNewParamsPromptUnion{OfArrayOfTokens: []int64{1, 2, 3}}, MaxTokens: openai.Int(2)})
		if err != nil || len(r.Choices) != 1 {
			t.Fatalf("completion of token ids: %+v, %v", r, err)
		}
	})

	t.Run("streaming with usage", func(t *testing.T) {
		s := sdk.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: "chat",
			Messages:      []openai.ChatCompletionMessageParamUnion{openai.UserMessage("stream please")},
			MaxTokens:     openai.Int(7),
			StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}})
		var acc openai.ChatCompletionAccumulator
		for s.Next() {
			acc.AddChunk(s.Current())
		}
		if err := s.Err(); err != nil {
			t.Fatalf("chat stream: %v", err)
		}
		if len(acc.Choices) != 1 || len(strings.Fields(acc.Choices[0].Message.Content)) != 7 || acc.Usage.CompletionTokens != 7 || acc.Usage.PromptTokens == 0 {
			t.Fatalf("chat stream: %+v, usage %+v; want 7 tokens and their usage", acc.Choices, acc.Usage)
		}
		cs := sdk.Completions.NewStreaming(ctx, openai.CompletionNewParams{Model: "sql",
			Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("once upon")}, MaxTokens: openai.Int(4),
			StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}})
		var text strings.Builder
		var usage int64
		for cs.Next() {
			if ch := cs.Current().Choices; len(ch) > 0 {
				text.WriteString(ch[0].Text)
			}
			if u := cs.Current().Usage; u.CompletionTokens > 0 {
				usage = u.CompletionTokens
			}
		}
		if err := cs.Err(); err != nil || len(strings.Fields(text.String())) != 4 || usage != 4 {
			t.Fatalf("completion stream of adapter sql: %q, usage %d, %v; want 4 tokens and their usage", text.String(), usage, err)
		}
	})

	t.Run("embeddings", func(t *testing.T) {
		in := openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: []string{"a b", "c"}}
		f, err := sdk.Embeddings.New(ctx, openai.EmbeddingNewParams{Model: "embed", Input: in, EncodingFormat: openai.EmbeddingNewParamsEncodingFormatFloat})
		if err != nil || len(f.Data) != 2 || len(f.Data[0].Embedding) == 0 || f.Usage.PromptTokens != 3 {
			t.Fatalf("float embeddings: %+v, %v", f, err)
		}
		b, err := sdk.Embeddings.New(ctx, openai.EmbeddingNewParams{Model: "embed", Input: in, EncodingFormat: openai.EmbeddingNewParamsEncodingFormatBase64})
		if err != nil || len(b.Data) != 2 {
			t.Fatalf("base64 embeddings: %+v, %v", b, err)
		}
		for i := range f.Data {
			var s string
			if err := json.Unmarshal([]byte(b.Data[i].JSON.Embedding.Raw()), &s); err != nil {
				t.Fatalf("base64 embedding %d is not a string: %s", i, b.Data[i].JSON.Embedding.Raw())
			}
			raw, err := base64.StdEncoding.DecodeString(s)
			if err != nil || len(raw) != 4*len(f.Data[i].Embedding) {
				t.Fatalf("base64 embedding %d: %d bytes (%v), want %d float32s", i, len(raw), err, len(f.Data[i].Embedding))
			}
			for j, want := range f.Data[i].Embedding {
				got := math.Float32frombits(binary.LittleEndian.Uint32(raw[4*j:]))
				if math.Abs(float64(got)-want) > 1e-6 {
					t.Fatalf("embedding %d[%d]: base64 %g, float %g", i, j, got, want)
				}
			}
		}
	})

	t.Run("errors", func(t *testing.T) {
		msgs := []openai.ChatCompletionMessageParamUnion{openai.UserMessage("x")}
		chat := func(p openai.ChatCompletionNewParams, opts ...option.RequestOption) error {
			if p.Model == "" {
				p.Model = "chat"
			}
			if p.Messages == nil {
				p.Messages = msgs
			}
			_, err := sdk.Chat.Completions.New(ctx, p, opts...)
			return err
		}
		wantError(t, chat(openai.ChatCompletionNewParams{Model: "no-such-model"}), 404, "model_not_found", "model", "no-such-model")
		wantError(t, chat(openai.ChatCompletionNewParams{Model: "chat:nope"}), 404, "adapter_not_found", "model", "nope")
		wantError(t, chat(openai.ChatCompletionNewParams{N: openai.Int(3)}), 400, "unsupported_value", "n", "n is 3: model \"chat\" runs on a sim engine")
		wantError(t, chat(openai.ChatCompletionNewParams{N: openai.Int(0)}), 400, "invalid_value", "n", "from 1 to 128")
		wantError(t, chat(openai.ChatCompletionNewParams{Temperature: openai.Float(5)}), 400, "invalid_value", "temperature", "from 0 to 2")
		wantError(t, chat(openai.ChatCompletionNewParams{TopP: openai.Float(1.5)}), 400, "invalid_value", "top_p", "from 0 to 1")
		wantError(t, chat(openai.ChatCompletionNewParams{PresencePenalty: openai.Float(-3)}), 400, "invalid_value", "presence_penalty", "from -2 to 2")
		wantError(t, chat(openai.ChatCompletionNewParams{MaxTokens: openai.Int(-1)}), 400, "invalid_value", "max_tokens", "negative")
		wantError(t, chat(openai.ChatCompletionNewParams{TopLogprobs: openai.Int(21)}), 400, "invalid_value", "top_logprobs", "from 0 to 20")
		wantError(t, chat(openai.ChatCompletionNewParams{StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}}),
			400, "invalid_value", "stream_options", "stream")
		wantError(t, chat(openai.ChatCompletionNewParams{Model: "embed"}), 400, "unsupported_model", "model", "embedding model")
		wantError(t, chat(openai.ChatCompletionNewParams{Messages: []openai.ChatCompletionMessageParamUnion{}}), 400, "invalid_value", "messages", "empty")
		long := strings.TrimSpace(strings.Repeat("word ", 2040))
		wantError(t, chat(openai.ChatCompletionNewParams{Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(long)}, MaxTokens: openai.Int(10)}),
			400, "context_length_exceeded", "messages", "2048")

		_, err := sdk.Embeddings.New(ctx, openai.EmbeddingNewParams{Model: "chat", Input: openai.EmbeddingNewParamsInputUnion{OfString: openai.String("x")}})
		wantError(t, err, 400, "unsupported_model", "model", "does not embed")
		_, err = sdk.Completions.New(ctx, openai.CompletionNewParams{Model: "chat",
			Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String(strings.Repeat("w ", 2049))}})
		wantError(t, err, 400, "context_length_exceeded", "prompt", "2049")
		_, err = sdk.Embeddings.New(ctx, openai.EmbeddingNewParams{Model: "embed", Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: []string{"short", strings.Repeat("w ", 600)}}})
		wantError(t, err, 400, "context_length_exceeded", "input", "512")

		// An engine control (vLLM's priority) is the gateway's to set: a
		// client's is refused in the same shape, naming the field
		// (TestEngineErrorShape covers the engines' own refusals).
		err = chat(openai.ChatCompletionNewParams{}, option.WithJSONSet("priority", 5))
		wantError(t, err, 400, "engine_control", "priority", "X-Gpuplane-Priority")
	})

	t.Run("raw refusals", func(t *testing.T) {
		for _, tc := range []struct {
			path, body    string
			code, param   string
			names, unsaid string
		}{
			{"/v1/chat/completions", `[{"model":"chat"}]`, "invalid_json", "", "JSON array", "Go value"},
			{"/v1/chat/completions", `{"model": "chat", "messages": [`, "invalid_json", "", "not valid JSON", ""},
			{"/v1/completions", `{"model":"chat"}`, "missing_required_parameter", "prompt", `"prompt"`, ""},
			{"/v1/completions", `{"model":"chat","prompt":null}`, "missing_required_parameter", "prompt", `"prompt"`, ""},
			{"/v1/completions", `{"model":"chat","prompt":{}}`, "invalid_type", "prompt", "an object", ""},
			{"/v1/completions", `{"model":"chat","prompt":"x","logprobs":9}`, "invalid_value", "logprobs", "from 0 to 5", ""},
			{"/v1/chat/completions", `{"model":5,"messages":[]}`, "invalid_type", "model", "must be a string", "Go"},
			{"/v1/chat/completions", `{"model":"chat","messages":[{"content":"x"}]}`, "missing_required_parameter", "messages[0].role", "role", ""},
			{"/v1/chat/completions", `{"model":"chat","messages":[{"role":"user","content":"x"}],"temperature":"hot"}`, "invalid_type", "temperature", "must be a number", "float64"},
			{"/v1/chat/completions", `{"model":"chat","messages":[{"role":"user","content":"x"}],"n":1.5}`, "invalid_type", "n", "an integer", "Go"},
			{"/v1/embeddings", `{"model":"embed"}`, "missing_required_parameter", "input", `"input"`, ""},
			{"/v1/embeddings", `{"model":"embed","input":[]}`, "invalid_value", "input", "empty", ""},
			{"/v1/embeddings", `{"model":"embed","input":"x","encoding_format":"hex"}`, "invalid_value", "encoding_format", "base64", ""},
		} {
			status, b := c.post(t, tc.path, tc.body)
			var e struct {
				Error struct {
					Message, Type string
					Param         *string
					Code          any
				} `json:"error"`
			}
			if err := json.Unmarshal(b, &e); err != nil || status != 400 {
				t.Fatalf("%s %s: %d %s", tc.path, tc.body, status, b)
			}
			param := ""
			if e.Error.Param != nil {
				param = *e.Error.Param
			}
			if e.Error.Code != tc.code || param != tc.param || e.Error.Type != "invalid_request_error" ||
				!strings.Contains(e.Error.Message, tc.names) || (tc.unsaid != "" && strings.Contains(e.Error.Message, tc.unsaid)) {
				t.Fatalf("%s %s: %s\nwant code %q param %q naming %q", tc.path, tc.body, b, tc.code, tc.param, tc.names)
			}
		}
	})

	t.Run("long prompt refused at once", func(t *testing.T) {
		// 600,000 words: over the 2048-token context by far; refused by
		// the gateway, not run by the engine.
		body := `{"model":"chat","prompt":"` + strings.Repeat("a ", 600_000) + `"}`
		status, b := c.post(t, "/v1/completions", body)
		if status != 400 || !bytes.Contains(b, []byte(`"context_length_exceeded"`)) || !bytes.Contains(b, []byte(strconv.Itoa(600_000))) {
			t.Fatalf("600,000-word prompt: %d %s", status, b)
		}
	})
}

func keys(m map[string]openai.Model) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
