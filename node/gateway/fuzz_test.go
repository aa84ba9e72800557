package gateway

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/gpuplane/gpuplane/node/gateway/queue"
)

// FuzzRequest feeds the gateway's request parsing and limits (parse, the
// engine controls, checkFor against a model's context length and engine
// kind, the sizes the queue is given) any body for each endpoint. Nothing
// panics; an error answer is a client error naming what it can; and a
// request let through fits the model's context by exact arithmetic, with
// sizes the queue takes.
func FuzzRequest(f *testing.F) {
	for _, s := range []struct {
		path       uint8
		body       string
		maxLen, n  int
		vllm, fits bool
	}{
		{0, `{"model":"chat","prompt":"hi","max_tokens":9223372036854775807}`, 100, 1, true, false},
		{1, `{"model":"chat","messages":[{"role":"user","content":"a b c"}],"max_completion_tokens":9223372036854775806,"n":2}`, 4096, 2, true, false},
		{0, `{"model":"chat","prompt":[[1,2],[3]],"max_tokens":3,"n":128}`, 10, 128, true, true},
		{2, `{"model":"chat","input":["x y","z"],"dimensions":3}`, 2, 1, false, true},
		{1, `{"model":"chat","messages":[{"role":"user","content":[{"type":"text","text":"hi\\nthere"}]}],"stream":true,"stream_options":{"include_usage":true}}`, 0, 1, false, true},
		{0, `{"model":"chat","prompt":"hi","lora":[{"id":0,"scale":1}]}`, 0, 1, false, false},
		{0, `{"model":"chat","prompt":"hi","\u0063ache_prompt":false,"keep_alive":"5m"}`, 0, 1, false, true},
	} {
		f.Add(s.path, []byte(s.body), s.maxLen, s.vllm)
	}
	paths := []string{"/v1/completions", "/v1/chat/completions", "/v1/embeddings"}
	g, err := New(Options{Node: "n1", Cluster: fixedView{}, MaxBodyBytes: 1 << 16})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, p uint8, body []byte, maxLen int, vllm bool) {
		path := paths[int(p)%len(paths)]
		r := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
		w := httptest.NewRecorder()
		req, aerr := g.parse(w, r)
		if aerr == nil {
			// Give its body back to the budget of buffered bodies, as the
			// gateway does once a request is done: held across inputs, the
			// fuzzer's accepted bodies filled the budget and the next
			// parse answered 503 bodies_buffered.
			defer g.done(req)
			kind := "sim"
			if vllm {
				kind = "vllm"
			}
			m := &Model{Served: "chat", Deployment: "chat", Class: queue.Standard, MaxModelLen: max(maxLen, 0),
				Replicas: []Replica{{Deployment: "chat", Kind: kind}}}
			aerr = req.checkFor(m)
			if aerr == nil {
				if req.maxTokens < 0 || req.promptTokens < 0 || req.words < 0 {
					t.Fatalf("accepted with negative sizes: maxTokens %d promptTokens %d words %d", req.maxTokens, req.promptTokens, req.words)
				}
				if m.MaxModelLen > 0 && req.words > 0 && (req.words > m.MaxModelLen || max(req.outTokens, 0) > m.MaxModelLen-req.words) {
					t.Fatalf("accepted %d words and %d of output on a model of %d tokens' context", req.words, req.outTokens, m.MaxModelLen)
				}
				var v map[string]json.RawMessage
				if json.Unmarshal(req.body, &v) != nil {
					t.Fatalf("accepted a body that is not a JSON object: %q", req.body)
				}
				return
			}
		}
		if aerr.status != http.StatusBadRequest && aerr.status != http.StatusRequestEntityTooLarge {
			t.Fatalf("error status %d for a request's own fault: %s", aerr.status, aerr.body())
		}
		if aerr.msg == "" || aerr.code == "" {
			t.Fatalf("an error without a message or code: %s", aerr.body())
		}
	})
}
