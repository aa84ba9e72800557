package agent_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/gpuplane/gpuplane/cluster/tlsutil"
	"github.com/gpuplane/gpuplane/cmd/gpuplane/agent"
	"github.com/gpuplane/gpuplane/internal/testutil"
	"github.com/gpuplane/gpuplane/node/gateway/queue"
)

// devNode starts a --dev agent with one simulated L4 and gateway tuning gw.
func devNode(t *testing.T, name string, gw agent.GatewayConfig) *node {
	t.Helper()
	n := newNode(t, name, true, "l4=1")
	n.cfg.Dev, n.cfg.BootstrapExpect = true, 0
	n.cfg.Gateway = gw
	n.start(t)
	return n
}

// deploySim applies a sim deployment on a shared L4 accelerator (made if
// missing) with extra engine args, and waits for the gateway to answer
// for it through n.
func deploySim(t *testing.T, n *node, name, residency string, args ...string) {
	t.Helper()
	deploySimAs(t, n, nil, name, residency, args...)
}

// deploySimAs is deploySim with global CLI flags (a --token).
func deploySimAs(t *testing.T, n *node, global []string, name, residency string, args ...string) {
	t.Helper()
	if _, err := tryCLI(n, append(global, "accelerators", "get", "shared")...); err != nil {
		gpuplane(t, n, append(global, "accelerators", "create", "shared", "--device", "l4", "--tenancy", "shared", "--max-models", "4")...)
	}
	quoted := make([]string, len(args))
	for i, a := range args {
		quoted[i] = strconv.Quote(a)
	}
	spec := fmt.Sprintf(`resource: ModelDeployment
resourceVersion: v1
metadata: {name: %s}
spec:
  model: /models/%s
  residency: %s
  placement: {accelerator: shared}
  engine: {kind: sim, memoryPercent: 20, args: [%s]}
`, name, name, residency, strings.Join(quoted, ", "))
	path := filepath.Join(t.TempDir(), name+".yaml")
	if err := os.WriteFile(path, []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	gpuplane(t, n, append(global, "apply", "-f", path)...)
}

// waitServed waits until gateway base answers a completion for model.
func waitServed(t *testing.T, base, model string) {
	t.Helper()
	testutil.Eventually(t, 90*time.Second, model+" served through "+base, func() error {
		resp, err := http.Post(base+"/v1/completions", "application/json",
			strings.NewReader(fmt.Sprintf(`{"model":%q,"prompt":"ping","max_tokens":1}`, model)))
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%d: %s", resp.StatusCode, b)
		}
		return nil
	})
}

func openaiClient(n *node, opts ...option.RequestOption) openai.Client {
	return openai.NewClient(append([]option.RequestOption{option.WithBaseURL(n.a.GatewayURL() + "/v1/"),
		option.WithAPIKey("unused"), option.WithMaxRetries(0)}, opts...)...)
}

// metric sums the samples of a series on n's /metrics whose labels contain
// every one of match.
func metric(t *testing.T, n *node, name string, match ...string) float64 {
	t.Helper()
	return metricAs(t, n, "", name, match...)
}

// metricAs is metric read with token (with ACLs on, /metrics wants one).
func metricAs(t *testing.T, n *node, token, name string, match ...string) float64 {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, n.url()+"/metrics", nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics: %s: %s", resp.Status, b)
	}
	sum := 0.0
	re := regexp.MustCompile(`^` + regexp.QuoteMeta(name) + `(\{[^}]*\})? (\S+)$`)
	for line := range strings.SplitSeq(string(b), "\n") {
		m := re.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		all := true
		for _, s := range match {
			all = all && strings.Contains(m[1], s)
		}
		if all {
			v, _ := strconv.ParseFloat(m[2], 64)
			sum += v
		}
	}
	return sum
}

// TestGatewayOpenAIClient: the official OpenAI Go client against a --dev
// agent's gateway: models, chat, completions (streamed and not),
// embeddings; every refusal is an OpenAI error naming what is wrong, and
// none reaches a queue.
func TestGatewayOpenAIClient(t *testing.T) {
	n := devNode(t, "gw", agent.GatewayConfig{})
	deploySim(t, n, "chat", "pinned", "--tokens-per-second", "0")
	waitServed(t, n.a.GatewayURL(), "chat")
	// The checks the real engines pass too (real_engines_test.go).
	checkOpenAIServes(t, n, "chat", "chat")
	ctx := context.Background()
	c := openaiClient(n)

	page, err := c.Models.List(ctx)
	if err != nil {
		t.Fatalf("list models: %v", err)
	}
	if len(page.Data) != 1 || page.Data[0].ID != "chat" {
		t.Fatalf("models: %+v, want chat only", page.Data)
	}

	chat, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "chat",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello there")}, MaxTokens: openai.Int(5)})
	if err != nil {
		t.Fatalf("chat: %v", err)
	}
	if len(chat.Choices) != 1 || len(strings.Fields(chat.Choices[0].Message.Content)) != 5 || chat.Usage.CompletionTokens != 5 {
		t.Fatalf("chat answer: %+v", chat)
	}

	stream := c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: "chat",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("stream please")}, MaxTokens: openai.Int(7)})
	var text strings.Builder
	chunks := 0
	for stream.Next() {
		chunks++
		if ch := stream.Current().Choices; len(ch) > 0 {
			text.WriteString(ch[0].Delta.Content)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("chat stream: %v", err)
	}
	if chunks < 7 || len(strings.Fields(text.String())) != 7 {
		t.Fatalf("chat stream: %d chunks, text %q; want 7 tokens, one chunk each", chunks, text.String())
	}

	comp, err := c.Completions.New(ctx, openai.CompletionNewParams{Model: "chat",
		Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("once upon")}, MaxTokens: openai.Int(3)})
	if err != nil || len(comp.Choices) != 1 || len(strings.Fields(comp.Choices[0].Text)) != 3 {
		t.Fatalf("completion: %+v, %v", comp, err)
	}
	cs := c.Completions.NewStreaming(ctx, openai.CompletionNewParams{Model: "chat",
		Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("once upon")}, MaxTokens: openai.Int(4)})
	text.Reset()
	for cs.Next() {
		if ch := cs.Current().Choices; len(ch) > 0 {
			text.WriteString(ch[0].Text)
		}
	}
	if err := cs.Err(); err != nil || len(strings.Fields(text.String())) != 4 {
		t.Fatalf("completion stream: %q, %v", text.String(), err)
	}

	emb, err := c.Embeddings.New(ctx, openai.EmbeddingNewParams{Model: "chat",
		Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: []string{"a b", "c"}}})
	if err != nil || len(emb.Data) != 2 || len(emb.Data[0].Embedding) == 0 {
		t.Fatalf("embeddings: %+v, %v", emb, err)
	}

	// Isolation: the gateway salts each tenant's requests, so tenant B
	// sending tenant A's exact prompt gets no cached tokens; A resending
	// gets a hit.
	prompt := strings.TrimSpace(strings.Repeat("summarise the quarterly report for the board ", 7)) + " please"
	cached := func(tenant string) int64 {
		t.Helper()
		r, err := c.Completions.New(ctx, openai.CompletionNewParams{Model: "chat",
			Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String(prompt)}, MaxTokens: openai.Int(2)},
			option.WithHeader("X-Gpuplane-Tenant", tenant))
		if err != nil {
			t.Fatalf("completion for %s: %v", tenant, err)
		}
		return r.Usage.PromptTokensDetails.CachedTokens
	}
	if a1, b1, a2 := cached("acme"), cached("globex"), cached("acme"); a1 != 0 || b1 != 0 || a2 == 0 {
		t.Fatalf("cached tokens: acme first %d, globex with acme's prompt %d, acme again %d; want 0, 0, more than 0", a1, b1, a2)
	}

	queued := metric(t, n, "gpuplane_gateway_queue_seconds_count")
	if queued == 0 {
		t.Fatal("no queue time recorded for the requests served")
	}

	// Refusals through the client: OpenAI errors with status and code.
	apiErr := func(err error, status int, code, names string) {
		t.Helper()
		var e *openai.Error
		if !errors.As(err, &e) {
			t.Fatalf("want an OpenAI error %d %s, got %v", status, code, err)
		}
		if e.StatusCode != status || e.Code != code || !strings.Contains(e.Message, names) || e.Type == "" {
			t.Fatalf("error %d %q %q %q, want %d %s naming %q", e.StatusCode, e.Type, e.Code, e.Message, status, code, names)
		}
	}
	_, err = c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "no-such-model",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("x")}})
	apiErr(err, 404, "model_not_found", "no-such-model")
	_, err = c.Completions.New(ctx, openai.CompletionNewParams{Model: "chat:no-such-adapter",
		Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("x")}})
	apiErr(err, 404, "adapter_not_found", "no-such-adapter")
	_, err = c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "chat",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("x")}, MaxTokens: openai.Int(-1)})
	apiErr(err, 400, "invalid_value", "max_tokens")
	_, err = c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "chat",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("x")}},
		option.WithHeader("X-Gpuplane-Tenant", "evil\ttenant"))
	apiErr(err, 400, "invalid_tenant", "X-Gpuplane-Tenant")

	// Refusals the client cannot send: raw HTTP, the same error shape.
	raw := func(body []byte, status int, code string) {
		t.Helper()
		resp, err := http.Post(n.a.GatewayURL()+"/v1/chat/completions", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var e struct {
			Error struct{ Message, Type, Code string } `json:"error"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&e); err != nil || resp.StatusCode != status || e.Error.Code != code || e.Error.Message == "" || e.Error.Type == "" {
			t.Fatalf("raw request: %d %+v (%v), want %d %s", resp.StatusCode, e, err, status, code)
		}
	}
	raw([]byte(`{"model": "chat", "messages": [`), 400, "invalid_json")
	raw(append([]byte(`{"model":"chat","messages":[{"role":"user","content":"`), append(bytes.Repeat([]byte("a"), 5<<20), `"}]}`...)...), 413, "request_too_large")
	if got := metric(t, n, "gpuplane_gateway_queue_seconds_count"); got != queued {
		t.Fatalf("refused requests were queued: queue time count %v, was %v", got, queued)
	}
}

// TestGatewayForwardsAcrossNodes: three servers without cards and two
// client nodes, one replica on one client: a request to any node's gateway
// reaches it (forwarded once, by the nodes that do not hold it).
func TestGatewayForwardsAcrossNodes(t *testing.T) {
	if testing.Short() {
		t.Skip("starts five agents")
	}
	servers := []*node{newNode(t, "s1", true, ""), newNode(t, "s2", true, ""), newNode(t, "s3", true, "")}
	clients := []*node{newNode(t, "c1", false, "l4=1"), newNode(t, "c2", false, "l4=1")}
	all := startCluster(t, servers, clients)
	testutil.Eventually(t, 60*time.Second, "cluster forms with both clients' cards", func() error {
		d, err := device(servers[0], "l4")
		if err != nil {
			return err
		}
		if d.Total != 2 {
			return fmt.Errorf("l4 total %d, want 2", d.Total)
		}
		return nil
	})
	deploySim(t, servers[0], "chat", "pinned", "--tokens-per-second", "0")
	var holder string
	testutil.Eventually(t, 60*time.Second, "chat placed", func() error {
		out, err := tryCLI(servers[0], "replicas", "list", "-o", "json")
		if err != nil {
			return err
		}
		var rs []struct{ Model, Node string }
		if err := json.Unmarshal([]byte(out), &rs); err != nil {
			return err
		}
		if len(rs) != 1 || rs[0].Node == "" {
			return fmt.Errorf("replicas: %s", out)
		}
		holder = rs[0].Node
		return nil
	})
	for _, n := range all {
		t.Logf("through %s (%s); chat is on %s", n.cfg.NodeName, n.a.GatewayURL(), holder)
		waitServed(t, n.a.GatewayURL(), "chat")
		c := openaiClient(n)
		s := c.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{Model: "chat",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}, MaxTokens: openai.Int(3)})
		var text strings.Builder
		for s.Next() {
			if ch := s.Current().Choices; len(ch) > 0 {
				text.WriteString(ch[0].Delta.Content)
			}
		}
		if err := s.Err(); err != nil || len(strings.Fields(text.String())) != 3 {
			t.Fatalf("stream through %s: %q, %v", n.cfg.NodeName, text.String(), err)
		}
		fwd := metric(t, n, "gpuplane_gateway_forwarded_total", `node="`+holder+`"`)
		if n.cfg.NodeName == holder && fwd != 0 || n.cfg.NodeName != holder && fwd == 0 {
			t.Fatalf("%s forwarded %v requests to %s, the holder", n.cfg.NodeName, fwd, holder)
		}
	}
	// A forwarded request is served where it lands or refused: never
	// forwarded again.
	req, _ := http.NewRequest(http.MethodPost, servers[1].a.GatewayURL()+"/v1/completions",
		strings.NewReader(`{"model":"chat","prompt":"x","max_tokens":1}`))
	req.Header.Set("X-Gpuplane-Forwarded-By", "s2")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(b), "no_replica") {
		t.Fatalf("a forwarded request at a node without a replica: %d %s, want 503 no_replica", resp.StatusCode, b)
	}
}

// waitCold waits until model's replica is placed and cold.
func waitCold(t *testing.T, n *node, model string) {
	t.Helper()
	testutil.Eventually(t, 60*time.Second, model+" placed, cold", func() error {
		out, err := tryCLI(n, "replicas", "list")
		if err != nil {
			return err
		}
		for line := range strings.SplitSeq(out, "\n") {
			if strings.HasPrefix(line, model+" ") && strings.Contains(line, "Cold") {
				return nil
			}
		}
		return fmt.Errorf("replicas:\n%s", out)
	})
}

// TestGatewayACL: with ACLs on, the gateway wants a token (the OpenAI
// client's API key) and takes the tenant from it, whatever the
// X-Gpuplane-Tenant header says.
func TestGatewayACL(t *testing.T) {
	n := newNode(t, "aclgw", true, "l4=1")
	n.cfg.Dev, n.cfg.BootstrapExpect, n.cfg.ACL = true, 0, true
	n.start(t)
	secret := func(out string) string {
		return strings.TrimSpace(strings.SplitN(strings.SplitN(out, "secret: ", 2)[1], "\n", 2)[0])
	}
	root := secret(gpuplane(t, n, "acl", "bootstrap", "--name", "root"))
	acme := secret(gpuplane(t, n, "--token", root, "acl", "token", "create", "--name", "acme", "--role", "read"))
	deploySimAs(t, n, []string{"--token", root}, "chat", "pinned", "--tokens-per-second", "0")

	ask := func(c openai.Client, opts ...option.RequestOption) error {
		_, err := c.Completions.New(context.Background(), openai.CompletionNewParams{Model: "chat",
			Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("x")}, MaxTokens: openai.Int(2)}, opts...)
		return err
	}
	testutil.Eventually(t, 90*time.Second, "chat served to acme", func() error {
		return ask(openaiClient(n, option.WithAPIKey(acme)))
	})
	var e *openai.Error
	for key, want := range map[string]string{"": "invalid_api_key", "not-a-token": "invalid_api_key"} {
		err := ask(openai.NewClient(option.WithBaseURL(n.a.GatewayURL()+"/v1/"), option.WithAPIKey(key), option.WithMaxRetries(0)))
		if !errors.As(err, &e) || e.StatusCode != http.StatusUnauthorized || e.Code != want {
			t.Fatalf("key %q: %v, want 401 %s", key, err, want)
		}
	}
	if err := ask(openaiClient(n, option.WithAPIKey(acme)), option.WithHeader("X-Gpuplane-Tenant", "someone-else")); err != nil {
		t.Fatal(err)
	}
	if got := metricAs(t, n, acme, "gpuplane_gateway_queue_seconds_count", `tenant="someone-else"`); got != 0 {
		t.Fatalf("a client with a token named its own tenant: %v requests queued as someone-else", got)
	}
	if got := metricAs(t, n, acme, "gpuplane_gateway_queue_seconds_count", `tenant="acme"`); got < 2 {
		t.Fatalf("%v requests queued as acme, want the token's tenant on each", got)
	}
}

// TestGatewaySecureForwarding: in a cluster with TLS and ACLs, a request at
// the node without the replica reaches it over TLS, authenticated as a node,
// and is served there as the tenant of the client's token.
func TestGatewaySecureForwarding(t *testing.T) {
	dir := t.TempDir()
	if _, err := tlsutil.CreateCA(dir); err != nil {
		t.Fatal(err)
	}
	s1, s2 := secureNode(t, dir, "s1", true, ""), secureNode(t, dir, "s2", true, "")
	join := []string{s1.gossip(), s2.gossip()}
	s1.cfg.Join, s2.cfg.Join = join, join
	s1.start(t)
	s2.start(t)
	ca := []string{"--ca", dir + "/" + tlsutil.CACertFile}
	var boot struct{ Secret string }
	testutil.Eventually(t, 30*time.Second, "acl bootstrap", func() error {
		out, errOut, code := secureCLI(s1, ca, "acl", "bootstrap", "-o", "json")
		if code != 0 {
			return errors.New(errOut)
		}
		return json.Unmarshal([]byte(out), &boot)
	})
	admin := append([]string{"--token", boot.Secret}, ca...)
	run := func(args ...string) string {
		t.Helper()
		out, errOut, code := secureCLI(s1, admin, args...)
		if code != 0 {
			t.Fatalf("%v: %s", args, errOut)
		}
		return out
	}
	app := strings.TrimSpace(strings.SplitN(strings.SplitN(run("acl", "token", "create", "--name", "app", "--role", "read", "--tenant", "acme"), "secret: ", 2)[1], "\n", 2)[0])
	run("accelerators", "create", "shared", "--device", "l4", "--tenancy", "shared", "--max-models", "2")
	run("models", "deploy", "chat", "--accelerator", "shared", "--model", "/models/chat", "--engine", "sim", "--memory-percent", "20")
	var holder string
	testutil.Eventually(t, 60*time.Second, "chat placed", func() error {
		var rs []struct{ Node string }
		if err := json.Unmarshal([]byte(run("replicas", "list", "-o", "json")), &rs); err != nil {
			return err
		}
		if len(rs) != 1 || rs[0].Node == "" {
			return fmt.Errorf("replicas: %+v", rs)
		}
		holder = rs[0].Node
		return nil
	})
	other, held := s1, s2
	if holder == "s1" {
		other, held = s2, s1
	}
	pool, err := tlsutil.LoadCAPool(dir + "/" + tlsutil.CACertFile)
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	if !strings.HasPrefix(other.a.GatewayURL(), "https://") {
		t.Fatalf("gateway URL %s: want https with TLS on", other.a.GatewayURL())
	}
	c := openaiClient(other, option.WithHTTPClient(hc), option.WithAPIKey(app))
	testutil.Eventually(t, 90*time.Second, "chat served through "+other.cfg.NodeName, func() error {
		_, err := c.Completions.New(context.Background(), openai.CompletionNewParams{Model: "chat",
			Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("x")}, MaxTokens: openai.Int(2)})
		return err
	})
	metricTLS := func(n *node, name string, match ...string) float64 {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, n.httpsURL()+"/metrics", nil)
		req.Header.Set("Authorization", "Bearer "+boot.Secret)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		sum := 0.0
		for line := range strings.SplitSeq(string(b), "\n") {
			if !strings.HasPrefix(line, name) {
				continue
			}
			all := true
			for _, m := range match {
				all = all && strings.Contains(line, m)
			}
			if f := strings.Fields(line); all && len(f) == 2 {
				v, _ := strconv.ParseFloat(f[1], 64)
				sum += v
			}
		}
		return sum
	}
	if got := metricTLS(other, "gpuplane_gateway_forwarded_total", `node="`+held.cfg.NodeName+`"`); got == 0 {
		t.Fatalf("%s forwarded nothing to %s", other.cfg.NodeName, held.cfg.NodeName)
	}
	if got := metricTLS(held, "gpuplane_gateway_queue_seconds_count", `tenant="acme"`); got == 0 {
		t.Fatalf("%s served nothing as the token's tenant acme", held.cfg.NodeName)
	}
}

// TestGatewayServesAdapters: `NAME:ADAPTER`, or the adapter's bare name,
// through the gateway reaches the replica's front, which pages the adapter
// onto the card; an adapter private to another tenant, or one the
// deployment lacks, is a 404 naming it, and nothing is loaded for it.
// /v1/models lists the adapters a tenant may use, with their parent; the
// deployment's maxModelLen and --runner are enforced by the gateway.
func TestGatewayServesAdapters(t *testing.T) {
	n := devNode(t, "adapters", agent.GatewayConfig{})
	gpuplane(t, n, "accelerators", "create", "shared", "--device", "l4", "--tenancy", "shared", "--max-models", "4")
	spec := `resource: ModelDeployment
resourceVersion: v1
metadata: {name: chat}
spec:
  model: /models/chat
  placement: {accelerator: shared}
  adapters:
    - {name: sql, source: /adapters/sql, rank: 8}
    - {name: law, source: /adapters/law, rank: 8, tenants: [acme]}
  engine: {kind: sim, memoryPercent: 30, maxAdapters: 2, maxModelLen: 64, args: ["--load-seconds", "0.2", "--runner", "generate"]}
`
	path := filepath.Join(t.TempDir(), "chat.yaml")
	if err := os.WriteFile(path, []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	gpuplane(t, n, "apply", "-f", path)
	base := n.a.GatewayURL()
	waitServed(t, base, "chat")

	ask := func(model, tenant string) (int, string) {
		req, _ := http.NewRequest("POST", base+"/v1/chat/completions", strings.NewReader(fmt.Sprintf(
			`{"model":%q,"messages":[{"role":"user","content":"hello"}],"max_tokens":4}`, model)))
		req.Header.Set("Content-Type", "application/json")
		if tenant != "" {
			req.Header.Set("X-Gpuplane-Tenant", tenant)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := ask("chat:sql", "bob"); code != 200 {
		t.Errorf("chat:sql for bob = %d %s, want 200", code, body)
	}
	if code, body := ask("chat:law", "bob"); code != 404 || !strings.Contains(body, `"code":"adapter_not_found"`) || !strings.Contains(body, `adapter \"law\"`) {
		t.Errorf("chat:law for bob = %d %s, want 404 adapter_not_found naming law", code, body)
	}
	if code, body := ask("chat:nope", "acme"); code != 404 || !strings.Contains(body, `adapter \"nope\"`) {
		t.Errorf("chat:nope = %d %s, want 404 naming nope", code, body)
	}
	if code, body := ask("chat:law", "acme"); code != 200 {
		t.Errorf("chat:law for acme = %d %s, want 200", code, body)
	}
	if code, body := ask("sql", "bob"); code != 200 || !strings.Contains(body, `"model":"sql"`) {
		t.Errorf("bare sql for bob = %d %s, want 200 from adapter sql", code, body)
	}
	if code, body := ask("law", "bob"); code != 404 || !strings.Contains(body, `"code":"model_not_found"`) {
		t.Errorf("bare law for bob = %d %s, want 404 model_not_found", code, body)
	}
	if code, body := ask("law", "acme"); code != 200 {
		t.Errorf("bare law for acme = %d %s, want 200", code, body)
	}
	c := openaiClient(n)
	listed := func(tenant string) map[string]string {
		page, err := c.Models.List(context.Background(), option.WithHeader("X-Gpuplane-Tenant", tenant))
		if err != nil {
			t.Fatalf("models for %s: %v", tenant, err)
		}
		out := map[string]string{}
		for _, m := range page.Data {
			if m.Created == 0 {
				t.Errorf("model %s listed with created 0", m.ID)
			}
			out[m.ID] = m.JSON.ExtraFields["parent"].Raw()
		}
		return out
	}
	if bob := listed("bob"); len(bob) != 2 || bob["sql"] != `"chat"` {
		t.Errorf("models for bob: %v, want chat and sql (parent chat)", bob)
	}
	if acme := listed("acme"); len(acme) != 3 || acme["law"] != `"chat"` {
		t.Errorf("models for acme: %v, want chat, sql and law (parent chat)", acme)
	}
	if m, err := c.Models.Get(context.Background(), "chat:sql"); err != nil || m.ID != "chat:sql" {
		t.Errorf("retrieve chat:sql: %+v, %v", m, err)
	}
	// The deployment's maxModelLen (64) and --runner generate, read from
	// its spec: refused at the gateway, with the field at fault.
	_, err := c.Completions.New(context.Background(), openai.CompletionNewParams{Model: "chat",
		Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String(strings.Repeat("word ", 60))}, MaxTokens: openai.Int(10)})
	var e *openai.Error
	if !errors.As(err, &e) || e.StatusCode != 400 || e.Code != "context_length_exceeded" || e.Param != "prompt" {
		t.Errorf("70 tokens on a 64-token model: %v", err)
	}
	_, err = c.Embeddings.New(context.Background(), openai.EmbeddingNewParams{Model: "chat", Input: openai.EmbeddingNewParamsInputUnion{OfString: openai.String("x")}})
	if !errors.As(err, &e) || e.StatusCode != 400 || e.Code != "unsupported_model" || e.Param != "model" {
		t.Errorf("embeddings of a generative model: %v", err)
	}
	// Both adapters the tenants could use are on the card now, and the
	// refused ones were never loaded.
	testutil.Eventually(t, 30*time.Second, "adapter tiers in models get", func() error {
		out, err := tryCLI(n, "models", "get", "chat")
		if err != nil {
			return err
		}
		for _, a := range []string{"sql", "law"} {
			line := ""
			for l := range strings.SplitSeq(out, "\n") {
				if f := strings.Fields(l); len(f) > 0 && f[0] == a {
					line = l
				}
			}
			if !strings.Contains(strings.ToLower(line), "card") {
				return fmt.Errorf("adapter %s not on the card:\n%s", a, out)
			}
		}
		return nil
	})
}

// TestGatewayOnDemandPlacedAgain: an onDemand model deleted and deployed
// again under the same name before the gateway reads the cluster again
// (here: never again, Refresh an hour) is loaded for the gateway's next
// request and served, not left waiting on its old front's watch until 503
// model_not_loaded.
func TestGatewayOnDemandPlacedAgain(t *testing.T) {
	n := devNode(t, "again", agent.GatewayConfig{Refresh: time.Hour, Queue: queue.Config{ColdWait: 20 * time.Second}})
	c := openaiClient(n)
	ask := func() error {
		_, err := c.Completions.New(context.Background(), openai.CompletionNewParams{Model: "lazy",
			Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("x")}, MaxTokens: openai.Int(2)})
		return err
	}
	deploySim(t, n, "lazy", "onDemand", "--tokens-per-second", "0", "--load-seconds", "0.2")
	waitCold(t, n, "lazy")
	// The gateway reads the cluster for a model it does not know yet.
	if err := ask(); err != nil {
		t.Fatalf("the first request for a cold onDemand model: %v", err)
	}
	gpuplane(t, n, "models", "delete", "lazy")
	testutil.Eventually(t, 60*time.Second, "lazy's replica gone", func() error {
		out, err := tryCLI(n, "replicas", "list")
		if err != nil {
			return err
		}
		if strings.Contains(out, "lazy ") {
			return fmt.Errorf("replicas:\n%s", out)
		}
		return nil
	})
	deploySim(t, n, "lazy", "onDemand", "--tokens-per-second", "0", "--load-seconds", "0.2")
	waitCold(t, n, "lazy")
	// Its front is served: the replica's endpoint is the front's.
	testutil.Eventually(t, 60*time.Second, "lazy's front served", func() error {
		out, err := tryCLI(n, "replicas", "list")
		if err != nil {
			return err
		}
		for line := range strings.SplitSeq(out, "\n") {
			if strings.HasPrefix(line, "lazy ") && strings.Contains(line, "http://") {
				return nil
			}
		}
		return fmt.Errorf("replicas:\n%s", out)
	})
	if err := ask(); err != nil {
		t.Fatalf("a request for the model deployed again: %v", err)
	}
}
