package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/internal/porttest"
	"github.com/gpuplane/gpuplane/internal/realengine"
	"github.com/gpuplane/gpuplane/internal/tinygguf"
	"github.com/gpuplane/gpuplane/node/engine"
	"github.com/gpuplane/gpuplane/node/gateway/queue"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// realLlama runs the real llama-server as the llamacpp driver starts it
// for spec (its own flags, on a free loopback port, one thread) and
// returns its URL.
func realLlama(t *testing.T, spec *pb.ModelSpec, env ...string) string {
	t.Helper()
	bin := realengine.LlamaServer(t)
	port := porttest.Free(t)
	d, err := engine.For(engine.KindLlamaCpp)
	if err != nil {
		t.Fatal(err)
	}
	cmd, err := d.Command(engine.Params{Model: "tiny", Spec: spec, Replica: &pb.Replica{MemoryMib: 1024}, Host: "127.0.0.1", Port: port})
	if err != nil {
		t.Fatal(err)
	}
	url := "http://127.0.0.1:" + strconv.Itoa(port)
	realengine.Run(t, bin, append(cmd.Args, "--threads", "1", "--no-webui"), append(cmd.Env, env...), url+cmd.HealthPath)
	return url
}

// tinyLlamaSpec is a llamacpp deployment of the tiny model with two
// adapters, each private to one tenant: "okay" (tenant a) makes every
// token " ok", "hey" (tenant b) every token " hi".
func tinyLlamaSpec(t *testing.T, slots int) *pb.ModelSpec {
	f := tinygguf.Write(t, "ok", "hi")
	return &pb.ModelSpec{Model: f.Model, Engine: &pb.EngineSpec{Kind: engine.KindLlamaCpp, MaxModelLen: 256,
		Args: []string{"--parallel", strconv.Itoa(slots)}},
		Adapters: []*pb.Adapter{{Name: "okay", Source: f.Adapters["ok"], Tenants: []string{"a"}},
			{Name: "hey", Source: f.Adapters["hi"], Tenants: []string{"b"}}}}
}

// gatewayFor serves a gateway in front of engineURL for spec as the agent
// describes the deployment (adapters, their ids and tenants, slots), and
// waits until the replica is placed.
func gatewayFor(t *testing.T, spec *pb.ModelSpec, engineURL string) string {
	t.Helper()
	return gatewayWith(t, spec, engineURL, nil)
}

// gatewayWith is gatewayFor with the engine keys keys.
func gatewayWith(t *testing.T, spec *pb.ModelSpec, engineURL string, keys *engine.Keys) string {
	t.Helper()
	adapters := map[string][]string{}
	for _, a := range spec.GetAdapters() {
		adapters[a.GetName()] = a.GetTenants()
	}
	slots := engine.LlamaSlots(spec.GetEngine())
	_, srv, _ := startGateway(t, Options{Node: "n1", EngineKeys: keys, Cluster: fixedView{[]Model{{Served: "tiny", Deployment: "tiny", Class: queue.Standard,
		Adapters: adapters, AdapterIDs: engine.LlamaAdapterIDs(spec), MaxModelLen: int(spec.GetEngine().GetMaxModelLen()),
		Replicas: []Replica{{Deployment: "tiny", Node: "n1", Endpoint: engineURL, Kind: "llamacpp", Slots: slots, Running: true, Resident: true}}}}}})
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if code, _, _ := askAs(t, srv.URL, "warm-up", "tiny", "warm"); code == http.StatusOK {
			return srv.URL
		}
		if time.Now().After(deadline) {
			t.Fatal("the gateway never placed the replica")
		}
	}
}

// askAs sends a greedy completion of prompt for model as tenant and
// returns the status, the text and the cached prompt tokens.
func askAs(t *testing.T, url, tenant, model, prompt string) (code int, text string, cached int) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": model, "prompt": prompt, "max_tokens": 6, "temperature": 0})
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/completions", strings.NewReader(string(body)))
	req.Header.Set(TenantHeader, tenant)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var v struct {
		Choices []struct{ Text string }
		Usage   struct {
			Details struct {
				Cached int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		}
	}
	if resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(data, &v); err != nil || len(v.Choices) != 1 {
			t.Fatalf("%s as %s: %v %s", model, tenant, err, data)
		}
		return resp.StatusCode, v.Choices[0].Text, v.Usage.Details.Cached
	}
	return resp.StatusCode, string(data), 0
}

// engineSaw is the prompt tokens the engine has processed (llama-server's
// llamacpp:prompt_tokens_total): it moves with every request it runs.
func engineSaw(t *testing.T, engineURL string) string {
	t.Helper()
	resp, err := http.Get(engineURL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	for l := range strings.Lines(string(data)) {
		if v, ok := strings.CutPrefix(l, "llamacpp:n_decode_total "); ok {
			return strings.TrimSpace(v)
		}
	}
	t.Fatalf("no llamacpp:n_decode_total in /metrics:\n%s", data)
	return ""
}

// TestRealLlamaCppAdaptersStayWithTheirTenants: on the real llama-server,
// as the driver starts it with two private adapters, the gateway runs a
// base request on the base alone (llama-server would otherwise apply every
// --lora at scale 1: " ok ok …"), each adapter for its own tenant, and
// refuses another tenant's adapter and an unknown one without the engine
// running anything.
func TestRealLlamaCppAdaptersStayWithTheirTenants(t *testing.T) {
	spec := tinyLlamaSpec(t, 2)
	eng := realLlama(t, spec)
	gw := gatewayFor(t, spec, eng)
	okText, hiText := strings.Repeat(" ok", 6), strings.Repeat(" hi", 6)
	for _, tenant := range []string{"a", "b", "c"} {
		code, text, _ := askAs(t, gw, tenant, "tiny", "hello there")
		if code != http.StatusOK || text == okText || text == hiText || strings.Contains(text, "ok ok") || strings.Contains(text, "hi hi") {
			t.Errorf("base request as tenant %s: %d %q; want the base model's text, no adapter's", tenant, code, text)
		}
	}
	if code, text, _ := askAs(t, gw, "a", "tiny:okay", "hello there"); code != http.StatusOK || text != okText {
		t.Errorf("tiny:okay as tenant a: %d %q; want %q", code, text, okText)
	}
	if code, text, _ := askAs(t, gw, "b", "tiny:hey", "hello there"); code != http.StatusOK || text != hiText {
		t.Errorf("tiny:hey as tenant b: %d %q; want %q", code, text, hiText)
	}
	before := engineSaw(t, eng)
	for _, c := range []struct{ tenant, model string }{{"b", "tiny:okay"}, {"a", "tiny:hey"}, {"a", "tiny:nosuch"}, {"c", "okay"}} {
		code, body, _ := askAs(t, gw, c.tenant, c.model, "hello there")
		if code != http.StatusNotFound || !strings.Contains(body, "not_found") {
			t.Errorf("%s as tenant %s: %d %s; want 404 before the engine", c.model, c.tenant, code, body)
		}
	}
	if after := engineSaw(t, eng); after != before {
		t.Errorf("the engine decoded tokens for refused requests (n_decode_total %s → %s)", before, after)
	}
}

// TestRealLlamaCppCachesStayWithTheirTenantAndAdapter: llama-server's
// prompt cache (a slot's KV) and host-RAM prompt cache (--cache-ram) reuse
// a prefix by its tokens alone. Through the gateway, a prompt computed for
// one tenant, or under one adapter, is never reused for another tenant or
// adapter (0 cached tokens), while a tenant resending its own prompt on the
// same adapter does reuse it. The control at the end shows the engine's
// caches would have served it: the same requests sent straight to an
// engine started with llama-server's defaults, without the gateway's slot
// and adapter controls, reuse another tenant's and another adapter's
// prompt.
func TestRealLlamaCppCachesStayWithTheirTenantAndAdapter(t *testing.T) {
	prompt := "the private prompt of one tenant, long enough to be worth caching: " + strings.Repeat("alpha beta gamma ", 6)
	for _, slots := range []int{1, 2} {
		t.Run(fmt.Sprintf("%d slots", slots), func(t *testing.T) {
			spec := tinyLlamaSpec(t, slots)
			gw := gatewayFor(t, spec, realLlama(t, spec))
			steps := []struct {
				tenant, model string
				hit           bool
			}{
				{"a", "tiny", false}, {"a", "tiny", true}, // a's own prompt is reused
				{"b", "tiny", false},                           // b never reuses a's
				{"a", "tiny:okay", false},                      // the base's KV never serves the adapter
				{"a", "tiny:okay", true},                       // the adapter's own KV does
				{"a", "tiny", false},                           // nor the adapter's the base
				{"b", "tiny:hey", false}, {"c", "tiny", false}, // nor anyone's another
			}
			for i, s := range steps {
				code, text, cached := askAs(t, gw, s.tenant, s.model, prompt)
				if code != http.StatusOK {
					t.Fatalf("step %d, %s as %s: %d %s", i+1, s.model, s.tenant, code, text)
				}
				if s.hit && cached == 0 || !s.hit && cached != 0 {
					t.Errorf("step %d, %s as tenant %s: %d cached tokens; want reuse: %v", i+1, s.model, s.tenant, cached, s.hit)
				}
			}
		})
	}
	// The controls: the steps that make llama-server's host-RAM cache
	// hand one tenant's prompt, computed on the base, to another tenant's
	// request under an adapter, sent straight to one slot (no id_slot, as
	// a client of llama-server alone would): with llama-server's defaults
	// the third request reuses the first's prompt; with the driver's flags
	// (--cache-ram 0) it reuses nothing.
	f := tinygguf.Write(t, "ok")
	for _, c := range []struct {
		name  string
		flags []string
		reuse bool
	}{{"control: llama-server's defaults", nil, true}, {"control: the driver's flags", []string{"--cache-ram", "0"}, false}} {
		t.Run(c.name, func(t *testing.T) {
			eng := realengine.StartLlamaServer(t, append([]string{"-m", f.Model, "--lora", f.Adapters["ok"], "--lora-init-without-apply", "--parallel", "1", "-c", "512"}, c.flags...)...)
			cached := func(prompt string, scale int) int {
				resp, err := http.Post(eng+"/v1/completions", "application/json", strings.NewReader(
					`{"prompt":`+strconv.Quote(prompt)+`,"max_tokens":2,"temperature":0,"lora":[{"id":0,"scale":`+strconv.Itoa(scale)+`}]}`))
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				var v struct {
					Usage struct {
						Details struct {
							Cached int `json:"cached_tokens"`
						} `json:"prompt_tokens_details"`
					}
				}
				if err := json.NewDecoder(resp.Body).Decode(&v); err != nil || resp.StatusCode != http.StatusOK {
					t.Fatalf("%d %v", resp.StatusCode, err)
				}
				return v.Usage.Details.Cached
			}
			cached(prompt, 0)                                             // tenant a, on the base
			cached("something else entirely, another tenant's prompt", 1) // tenant b, its adapter
			n := cached(prompt, 1)                                        // tenant b, a's prompt, its adapter
			// Without reuse the slot still holds tenant b's own previous
			// prompt, which shares its first tokens (BOS and the first
			// piece) with this one; tenant a's prompt is some 40 tokens.
			if c.reuse && n < 20 || !c.reuse && n > 2 {
				t.Errorf("tenant b's request under the adapter reused %d tokens of tenant a's prompt computed on the base; want reuse: %v", n, c.reuse)
			}
		})
	}
}

// TestRealLlamaCppEngineKeyThroughTheGateway: a real llama-server started
// with its engine key (as the executor starts it) answers the gateway,
// which sends the key, and refuses a request without it.
func TestRealLlamaCppEngineKeyThroughTheGateway(t *testing.T) {
	keys := engine.NewKeys([]byte("0123456789abcdef0123456789abcdef"))
	spec := tinyLlamaSpec(t, 1)
	eng := realLlama(t, spec, engine.KeyEnv(engine.KindLlamaCpp, keys.For("tiny", 0))...)
	gw := gatewayWith(t, spec, eng, keys)
	if code, text, _ := askAs(t, gw, "a", "tiny:okay", "hello"); code != http.StatusOK || text != strings.Repeat(" ok", 6) {
		t.Errorf("through the gateway: %d %q", code, text)
	}
	resp, err := http.Post(eng+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"hello","max_tokens":1}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("straight to the engine without its key: %d, want 401", resp.StatusCode)
	}
}

// smallSendBuffers is a listener whose connections send through a small
// kernel buffer (SO_SNDBUF): a client that stops reading blocks the
// server's writes within tens of kilobytes, not the megabytes loopback's
// autotuning lets a socket hold.
type smallSendBuffers struct{ net.Listener }

func (l smallSendBuffers) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetWriteBuffer(4 << 10)
	}
	return c, err
}

// TestRealLlamaCppSlowStreamHandsItsSlotBack: on the real llama-server
// with one slot, a streamed answer (some 800 tokens, far more than the
// sockets between the gateway and its client hold) whose client stops
// reading after the first event does not keep the slot, nor the replica's
// one place in the scheduler, once the engine has finished: another
// tenant's request runs on the engine and is answered while the first
// client has still not read its stream's end, and that client, reading
// again, then gets the whole stream to its [DONE]. Before, the slot was
// handed back only once the client had taken the last event, so the second
// request waited for the first client (here until the gateway cut the
// stalled stream off).
func TestRealLlamaCppSlowStreamHandsItsSlotBack(t *testing.T) {
	f := tinygguf.Write(t)
	spec := &pb.ModelSpec{Model: f.Model, Engine: &pb.EngineSpec{Kind: engine.KindLlamaCpp, MaxModelLen: 1024, Args: []string{"--parallel", "1"}}}
	slowStreamHandsItsSlotBack(t, realLlama(t, spec))
}

// slowStreamHandsItsSlotBack runs TestRealLlamaCppSlowStreamHandsItsSlotBack
// against the llama.cpp engine at eng (one slot, model "tiny", a context of
// at least 1024 tokens).
func slowStreamHandsItsSlotBack(t *testing.T, eng string) {
	t.Helper()
	g, err := New(Options{Node: "n1", StreamStall: 10 * time.Second, Cluster: fixedView{[]Model{{Served: "tiny", Deployment: "tiny", Class: queue.Standard, MaxModelLen: 1024,
		Replicas: []Replica{{Deployment: "tiny", Node: "n1", Endpoint: eng, Kind: "llamacpp", Slots: 1, Running: true, Resident: true}}}}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go g.Run(ctx)
	srv := httptest.NewUnstartedServer(g)
	srv.Listener = smallSendBuffers{srv.Listener}
	srv.Start()
	t.Cleanup(func() { srv.Close(); cancel() })
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if code, _, _ := askAs(t, srv.URL, "warm-up", "tiny", "warm"); code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the gateway never placed the replica")
		}
	}

	// The slow client: a small receive buffer, and it stops reading after
	// the stream's first event.
	var conn *net.TCPConn
	slow := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetReadBuffer(4 << 10)
			conn = tc
		}
		return c, err
	}}}
	defer slow.CloseIdleConnections()
	const tokens = 800
	body := fmt.Sprintf(`{"model":"tiny","prompt":"once upon a time","max_tokens":%d,"temperature":0,"ignore_eos":true,"stream":true}`, tokens)
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/completions", strings.NewReader(body))
	req.Header.Set(TenantHeader, "a")
	resp, err := slow.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(resp.Body)
		t.Fatalf("the stream: %d %s", resp.StatusCode, data)
	}
	br := bufio.NewReader(resp.Body)
	firstEvent, err := br.ReadString('\n')
	if err != nil || !strings.HasPrefix(firstEvent, "data: {") {
		t.Fatalf("the stream's first event: %q %v", firstEvent, err)
	}

	// Tenant b's request needs the one slot; the first client reads
	// nothing more until it is answered.
	code, text, _ := askAs(t, srv.URL, "b", "tiny", "hello there")
	if code != http.StatusOK || text == "" {
		t.Fatalf("tenant b's request while tenant a's stream is unread: %d %q", code, text)
	}
	// It reads the rest at full speed (a 4 KiB window is slow).
	_ = conn.SetReadBuffer(1 << 20)
	rest, err := io.ReadAll(br)
	events, got := 0, 0
	for l := range strings.Lines(firstEvent + string(rest)) {
		if strings.HasPrefix(l, "data: ") {
			events++
			got += tokensIn([]byte(l))
		}
	}
	if err != nil || !strings.HasSuffix(string(rest), "data: [DONE]\n\n") || got != tokens {
		t.Fatalf("tenant a's stream, read after tenant b was answered: %d events, %d tokens, ends %q (%v); want %d tokens and [DONE]: the stream was cut off (stalled) while tenant b waited for the slot",
			events, got, rest[max(0, len(rest)-80):], err, tokens)
	}
	// What the test stands on: the stream is far more than the sockets
	// hold, so the gateway could not have written it all before b ran.
	if len(firstEvent)+len(rest) < 100<<10 {
		t.Fatalf("tenant a's stream is %d bytes: too short to fill the sockets between the gateway and its client", len(firstEvent)+len(rest))
	}
}
