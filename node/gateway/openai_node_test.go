package gateway

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// nodeScript drives the gateway with the official `openai` npm package:
// each step's outcome is printed as one JSON object for the Go test to
// judge. Its embeddings go as the package sends them by default, base64,
// which it decodes into floats.
const nodeScript = `
const OpenAI = require('openai');
const client = new OpenAI({ baseURL: process.env.GATEWAY + '/v1', apiKey: 'unused', maxRetries: 0 });
const out = {};
async function refusal(f) {
  try { await f(); return { ok: true }; }
  catch (e) { return { status: e.status, code: e.code, param: e.param, type: e.type, message: e.message, typed: e instanceof OpenAI.APIError }; }
}
(async () => {
  const list = await client.models.list();
  out.models = list.data.map(m => ({ id: m.id, parent: m.parent || '', created: m.created }));
  const sql = await client.models.retrieve('sql');
  out.retrieve = { id: sql.id, parent: sql.parent };
  const chat = await client.chat.completions.create({ model: 'sql', messages: [{ role: 'user', content: 'hello there' }], max_tokens: 5 });
  out.chat = { text: chat.choices[0].message.content, completion_tokens: chat.usage.completion_tokens };
  const stream = await client.chat.completions.create({ model: 'chat', messages: [{ role: 'user', content: 'stream' }], max_tokens: 6,
    stream: true, stream_options: { include_usage: true } });
  let text = '', usage = null;
  for await (const ch of stream) {
    if (ch.choices.length) text += ch.choices[0].delta.content || '';
    if (ch.usage) usage = ch.usage;
  }
  out.stream = { text, completion_tokens: usage ? usage.completion_tokens : -1 };
  const comp = await client.completions.create({ model: 'chat', prompt: 'once upon', max_tokens: 3 });
  out.completion = { text: comp.choices[0].text };
  const b64 = await client.embeddings.create({ model: 'embed', input: ['a b', 'c'] });
  const flt = await client.embeddings.create({ model: 'embed', input: ['a b', 'c'], encoding_format: 'float' });
  out.embeddings = { base64: b64.data.map(d => Array.from(d.embedding)), float: flt.data.map(d => d.embedding) };
  out.n = await refusal(() => client.chat.completions.create({ model: 'chat', messages: [{ role: 'user', content: 'x' }], n: 3 }));
  out.missing = await refusal(() => client.models.retrieve('ledger'));
  process.stdout.write(JSON.stringify(out));
})().catch(e => { process.stderr.write(String(e && e.stack || e)); process.exit(1); });
`

// TestOpenAINodeSDK runs the conformance steps with the official `openai`
// npm package where Node and the package are installed (NODE_PATH may
// point at a node_modules that holds it); it is skipped otherwise, and
// installs nothing.
func TestOpenAINodeSDK(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed")
	}
	if err := exec.Command(node, "-e", "require.resolve('openai')").Run(); err != nil {
		t.Skip("the openai npm package is not installed (npm install openai, and set NODE_PATH to its node_modules)")
	}
	c := startConformance(t)
	script := filepath.Join(t.TempDir(), "conformance.js")
	if err := os.WriteFile(script, []byte(nodeScript), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, script)
	cmd.Env = append(os.Environ(), "GATEWAY="+c.url)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdout, err := cmd.Output()
	if err != nil {
		t.Fatalf("node: %v\n%s", err, stderr.String())
	}
	var out struct {
		Models []struct {
			ID, Parent string
			Created    int64
		}
		Retrieve struct{ ID, Parent string }
		Chat     struct {
			Text             string
			CompletionTokens int `json:"completion_tokens"`
		}
		Stream struct {
			Text             string
			CompletionTokens int `json:"completion_tokens"`
		}
		Completion struct{ Text string }
		Embeddings struct{ Base64, Float [][]float64 }
		N, Missing struct {
			OK                         bool
			Status                     int
			Code, Param, Type, Message string
			Typed                      bool
		}
	}
	if err := json.Unmarshal(stdout, &out); err != nil {
		t.Fatalf("node's output: %v\n%s", err, stdout)
	}
	ids := map[string]string{}
	for _, m := range out.Models {
		if m.Created == 0 {
			t.Fatalf("model %s listed with created 0", m.ID)
		}
		ids[m.ID] = m.Parent
	}
	if len(ids) != 4 || ids["sql"] != "chat" || out.Retrieve != (struct{ ID, Parent string }{"sql", "chat"}) {
		t.Fatalf("models %v, retrieve sql %+v; want chat, assistant, sql (parent chat), embed", ids, out.Retrieve)
	}
	if len(strings.Fields(out.Chat.Text)) != 5 || out.Chat.CompletionTokens != 5 {
		t.Fatalf("chat with adapter sql: %+v", out.Chat)
	}
	if len(strings.Fields(out.Stream.Text)) != 6 || out.Stream.CompletionTokens != 6 {
		t.Fatalf("chat stream with usage: %+v", out.Stream)
	}
	if len(strings.Fields(out.Completion.Text)) != 3 {
		t.Fatalf("completion: %+v", out.Completion)
	}
	e := out.Embeddings
	if len(e.Base64) != 2 || len(e.Float) != 2 {
		t.Fatalf("embeddings: %+v", e)
	}
	for i := range e.Float {
		if len(e.Base64[i]) != len(e.Float[i]) || len(e.Float[i]) == 0 {
			t.Fatalf("embedding %d: base64 (the package's default) decoded to %d floats, float has %d", i, len(e.Base64[i]), len(e.Float[i]))
		}
		for j := range e.Float[i] {
			if d := e.Base64[i][j] - e.Float[i][j]; d > 1e-6 || d < -1e-6 {
				t.Fatalf("embedding %d[%d]: base64 %g, float %g", i, j, e.Base64[i][j], e.Float[i][j])
			}
		}
	}
	if n := out.N; !n.Typed || n.Status != 400 || n.Code != "unsupported_value" || n.Param != "n" || n.Type != "invalid_request_error" {
		t.Fatalf("n: 3: %+v, want a typed APIError 400 unsupported_value param n", n)
	}
	if m := out.Missing; !m.Typed || m.Status != 404 || m.Code != "model_not_found" || m.Param != "model" {
		t.Fatalf("retrieve ledger (acme's): %+v, want a typed APIError 404 model_not_found param model", m)
	}
}
