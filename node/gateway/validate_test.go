package gateway

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestEngineErrorShape: each engine's error answer, as it sends it, comes
// out in OpenAI's one shape with a string code, its message kept.
func TestEngineErrorShape(t *testing.T) {
	for _, tc := range []struct {
		name, body              string
		status                  int
		typ, code, param, names string
	}{
		{"vLLM", `{"error":{"message":"The model does not support Embeddings API","type":"BadRequestError","param":null,"code":400}}`,
			400, "invalid_request_error", "invalid_request", "", "Embeddings API"},
		{"vLLM without the wrapper", `{"object":"error","message":"The model ` + "`x`" + ` does not exist.","type":"NotFoundError","param":null,"code":404}`,
			404, "invalid_request_error", "model_not_found", "model", "does not exist"},
		{"llama.cpp", `{"error":{"code":501,"message":"This server does not support embeddings. Start it with --embeddings","type":"not_supported_error"}}`,
			501, "server_error", "not_supported_error", "", "--embeddings"},
		{"Ollama", `{"error":"model 'x' not found"}`, 404, "invalid_request_error", "model_not_found", "model", "not found"},
		{"plain text", "upstream connect error\n", 503, "server_error", "engine_unavailable", "", "upstream connect error"},
		{"a replica front", `{"error":{"message":"model chat cannot be loaded now","type":"model_not_loaded","param":null,"code":503}}`,
			503, "server_error", "model_not_loaded", "", "cannot be loaded"},
		{"OpenAI's own shape", `{"error":{"message":"bad n","type":"invalid_request_error","param":"n","code":"invalid_value"}}`,
			400, "invalid_request_error", "invalid_value", "n", "bad n"},
		{"empty", ``, 502, "server_error", "engine_error", "", "502 Bad Gateway"},
	} {
		var e struct {
			Error struct {
				Message, Type string
				Param         *string
				Code          any
			} `json:"error"`
		}
		out := engineError(tc.status, []byte(tc.body))
		if err := json.Unmarshal(out, &e); err != nil {
			t.Fatalf("%s: %v: %s", tc.name, err, out)
		}
		param := ""
		if e.Error.Param != nil {
			param = *e.Error.Param
		}
		if e.Error.Type != tc.typ || e.Error.Code != tc.code || param != tc.param || !strings.Contains(e.Error.Message, tc.names) {
			t.Errorf("%s: %s\nwant type %s code %s param %q naming %q", tc.name, out, tc.typ, tc.code, tc.param, tc.names)
		}
	}
}

// TestPromptWords: the lower bound on a prompt's tokens counts words of
// text (escaped newlines and tabs part them), token ids as given, and the
// longest prompt of a batch; chat counts the text of the messages' content.
func TestPromptWords(t *testing.T) {
	for _, tc := range []struct {
		raw  string
		want int
	}{
		{`"one two  three"`, 3},
		{`"line\nbreak\tand \"quoted\" words"`, 5},
		{`"  "`, 0},
		{`[1, 2, 3, 4]`, 4},
		{`["a b", "c d e", "f"]`, 3},
		{`[[1,2],[3,4,5,6]]`, 4},
	} {
		if got := promptWords(json.RawMessage(tc.raw)); got != tc.want {
			t.Errorf("promptWords(%s) = %d, want %d", tc.raw, got, tc.want)
		}
	}
	msgs := `[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"what is this"},{"type":"image_url","image_url":{"url":"data:x"}}]}]`
	b := body{Messages: json.RawMessage(msgs)}
	if err := b.checkMessages(); err != nil {
		t.Fatal(err.msg)
	}
	if got := messageWords(b.msgs); got != 5 {
		t.Errorf("messageWords = %d, want 5 (the text of the contents, not the keys or roles)", got)
	}
}

// TestChoicesByEngine: n > 1 goes to a vLLM engine, which generates the
// choices together (their output reserved in the queue), and is refused,
// naming n, for an engine that answers one choice.
func TestChoicesByEngine(t *testing.T) {
	for _, kind := range []string{"vllm", "llamacpp", "ollama", "sim"} {
		m := &Model{Served: "m", Replicas: []Replica{{Kind: kind}}}
		req := &request{path: "/v1/chat/completions", model: "m", n: 3, maxTokens: 100}
		err := req.checkFor(m)
		switch {
		case kind == "vllm" && (err != nil || req.maxTokens != 300):
			t.Errorf("n 3 on vllm: %v, reserves %d tokens; want served, reserving 300", err, req.maxTokens)
		case kind != "vllm" && (err == nil || err.param != "n" || !strings.Contains(err.msg, kind)):
			t.Errorf("n 3 on %s: %+v; want refused naming n and the engine", kind, err)
		}
	}
}

// BenchmarkParseBody is what the gateway's reading of a body costs: the
// checks (decodeBody, check, the prompt's words) against the one decode
// into the fields the gateway read before it checked them (legacy).
func BenchmarkParseBody(b *testing.B) {
	chat := []byte(`{"model":"chat","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"` +
		strings.Repeat("tell me about the weather today ", 30) + `"}],"max_tokens":256,"temperature":0.7,"top_p":0.9,"stream":true,"stream_options":{"include_usage":true}}`)
	long := []byte(`{"model":"chat","prompt":"` + strings.Repeat("word ", 200_000) + `","max_tokens":16}`)
	for _, tc := range []struct {
		name, path string
		body       []byte
	}{{"chat-1KiB", "/v1/chat/completions", chat}, {"prompt-1MB", "/v1/completions", long}} {
		b.Run(tc.name+"/legacy", func(b *testing.B) {
			b.SetBytes(int64(len(tc.body)))
			b.ReportAllocs()
			for b.Loop() {
				var f struct {
					Model               *string         `json:"model"`
					Stream              *bool           `json:"stream"`
					MaxTokens           *int            `json:"max_tokens"`
					MaxCompletionTokens *int            `json:"max_completion_tokens"`
					Prompt              json.RawMessage `json:"prompt"`
					Messages            json.RawMessage `json:"messages"`
					Input               json.RawMessage `json:"input"`
				}
				if err := json.Unmarshal(tc.body, &f); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(tc.name+"/checked", func(b *testing.B) {
			b.SetBytes(int64(len(tc.body)))
			b.ReportAllocs()
			for b.Loop() {
				f, err := decodeBody(tc.body)
				if err != nil {
					b.Fatal(err.msg)
				}
				if err := f.check(tc.path); err != nil {
					b.Fatal(err.msg)
				}
				if tc.path == "/v1/completions" {
					_ = promptWords(f.Prompt)
				} else {
					_ = messageWords(f.msgs)
				}
			}
		})
	}
}
