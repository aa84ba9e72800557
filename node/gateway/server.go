package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/gpuplane/gpuplane/internal/bearer"
	"github.com/gpuplane/gpuplane/node/gateway/isolation"
	"github.com/gpuplane/gpuplane/node/gateway/queue"
	"github.com/gpuplane/gpuplane/node/residency"
)

// apiError is an answer in OpenAI's error shape.
type apiError struct {
	status    int
	typ, code string
	// param is the request field at fault ("": none, null in the answer).
	param      string
	msg        string
	retryAfter time.Duration
}

func errorf(status int, typ, code, format string, args ...any) *apiError {
	return &apiError{status: status, typ: typ, code: code, msg: fmt.Sprintf(format, args...)}
}

// invalidf is a 400 about the request's field param.
func invalidf(param, code, format string, args ...any) *apiError {
	e := errorf(http.StatusBadRequest, "invalid_request_error", code, format, args...)
	e.param = param
	return e
}

func (e *apiError) body() []byte {
	return errorBody(e.msg, e.typ, e.param, e.code)
}

// errorBody is an error in OpenAI's shape: param null when "".
func errorBody(msg, typ, param, code string) []byte {
	var p any
	if param != "" {
		p = param
	}
	b, _ := json.Marshal(map[string]any{"error": map[string]any{
		"message": msg, "type": typ, "param": p, "code": code,
	}})
	return b
}

func (e *apiError) write(w http.ResponseWriter) {
	if e.retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int((e.retryAfter+time.Second-1)/time.Second)))
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(e.status)
	_, _ = w.Write(append(e.body(), '\n'))
}

// ServeHTTP is the gateway's API. An inference request's handler stays
// under this call while it waits for its engine: the frames are small
// (call, in local.go, says why).
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/v1/chat/completions", "/v1/completions", "/v1/embeddings":
		if r.Method == http.MethodPost {
			if x := g.serveInference(w, r); x != nil {
				x.run()
				g.done(x.req)
			}
			return
		}
	}
	g.serveOther(w, r)
}

// serveOther answers everything but an inference request.
func (g *Gateway) serveOther(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/v1/models":
		if r.Method != http.MethodGet {
			errorf(http.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed", "%s /v1/models: use GET", r.Method).write(w)
			return
		}
		g.listModels(w, r)
	case "/v1/chat/completions", "/v1/completions", "/v1/embeddings":
		errorf(http.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed", "%s %s: use POST", r.Method, r.URL.Path).write(w)
	case "/health", "/healthz":
		w.WriteHeader(http.StatusOK)
	default:
		if id, ok := strings.CutPrefix(r.URL.Path, "/v1/models/"); ok && id != "" {
			if r.Method != http.MethodGet {
				errorf(http.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed", "%s %s: use GET", r.Method, r.URL.Path).write(w)
				return
			}
			g.retrieveModel(w, r, id)
			return
		}
		errorf(http.StatusNotFound, "invalid_request_error", "unknown_url",
			"unknown path %s: the gateway serves GET /v1/models, GET /v1/models/{model} and POST /v1/chat/completions, /v1/completions, /v1/embeddings", r.URL.Path).write(w)
	}
}

func (g *Gateway) listModels(w http.ResponseWriter, r *http.Request) {
	x, aerr := g.tenant(r)
	if aerr != nil {
		aerr.write(w)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"object": "list", "data": g.modelCards(x.tenant)})
}

// retrieveModel answers GET /v1/models/{id}: the card /v1/models lists
// for id, or for any other name a request may use (NAME:ADAPTER for an
// adapter listed by its bare name).
func (g *Gateway) retrieveModel(w http.ResponseWriter, r *http.Request, id string) {
	x, aerr := g.tenant(r)
	if aerr != nil {
		aerr.write(w)
		return
	}
	cards := g.modelCards(x.tenant)
	var card modelCard
	for _, c := range cards {
		if c.ID == id {
			card = c
			break
		}
	}
	if card.ID == "" {
		m, ad, aerr := g.resolveFresh(r.Context(), id, x.tenant)
		if aerr != nil {
			aerr.write(w)
			return
		}
		card = modelCard{ID: id, Object: "model", Created: m.Created, OwnedBy: "gpuplane"}
		switch {
		case ad != "":
			card.Parent = m.Served
		case id != m.Served:
			card.Root = m.Served
		}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(card)
}

// modelCard is one model as /v1/models lists it.
type modelCard struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
	// Root: the served name an alias leads to.
	Root string `json:"root,omitempty"`
	// Parent: the base model of an adapter (as vLLM lists adapters).
	Parent string `json:"parent,omitempty"`
	// MaxModelLen: the context length, where the deployment says it (as
	// vLLM lists it).
	MaxModelLen int `json:"max_model_len,omitempty"`
}

// modelCards lists what tenant may name as a model: every deployment's
// served name and aliases, and the adapters tenant may use, each by its
// bare name where that alone names it, else as NAME:ADAPTER.
func (g *Gateway) modelCards(tenant string) []modelCard {
	t := g.table.Load()
	cards := make([]modelCard, 0, len(t.models))
	for i := range t.models {
		m := &t.models[i]
		cards = append(cards, modelCard{ID: m.Served, Object: "model", Created: m.Created, OwnedBy: "gpuplane", MaxModelLen: m.MaxModelLen})
		for _, a := range m.Aliases {
			// Listed where it leads (a served name wins over an alias).
			if t.byName[a] == m {
				cards = append(cards, modelCard{ID: a, Object: "model", Created: m.Created, OwnedBy: "gpuplane", Root: m.Served, MaxModelLen: m.MaxModelLen})
			}
		}
		ads := make([]string, 0, len(m.Adapters))
		for a := range m.Adapters {
			if m.offers(a, tenant) {
				ads = append(ads, a)
			}
		}
		sort.Strings(ads)
		for _, a := range ads {
			id := a
			if rm, _, err := g.resolve(a, tenant); err != nil || rm != m {
				id = m.Served + ":" + a
			}
			cards = append(cards, modelCard{ID: id, Object: "model", Created: m.Created, OwnedBy: "gpuplane", Parent: m.Served, MaxModelLen: m.MaxModelLen})
		}
	}
	return cards
}

// who is a request's tenant.
type who struct {
	tenant string
	weight float64 // 0: not given
	// forwarded: another node sent it; it is served here or refused.
	forwarded bool
}

// tenant finds who sends r: from a peer node, the tenant it resolved; with
// ACLs, the token's; else the header's, or "default". The headers meant
// for nodes (ForwardedHeader's weight) are believed only from a peer
// (Options.IsPeer: its certificate or the agent token), with ACLs or
// without: a client's own weight header is ignored, and so every tenant
// weighs what the node's configuration says (1 unless set). Without ACLs a
// client's ForwardedHeader is still taken as a restriction (served here or
// refused), which gives it nothing.
func (g *Gateway) tenant(r *http.Request) (who, *apiError) {
	peer := g.opts.IsPeer != nil && g.opts.IsPeer(r)
	fwd := r.Header.Get(ForwardedHeader) != ""
	if fwd && g.opts.Tenants != nil && !peer {
		return who{}, errorf(http.StatusForbidden, "invalid_request_error", "forbidden",
			"%s is set by nodes of the cluster only", ForwardedHeader)
	}
	if g.opts.Tenants != nil && !peer {
		secret, ok := bearer.Token(r.Header.Get("Authorization"))
		if !ok {
			return who{}, errorf(http.StatusUnauthorized, "invalid_request_error", "invalid_api_key",
				"this cluster runs with ACLs on: pass a token as 'Authorization: Bearer TOKEN' (the OpenAI client's API key)")
		}
		t, w, ok := g.opts.Tenants.TenantFor(secret)
		if !ok {
			return who{}, errorf(http.StatusUnauthorized, "invalid_request_error", "invalid_api_key", "unknown token: it was deleted or never existed")
		}
		return who{tenant: t, weight: w}, nil
	}
	h := r.Header.Get(TenantHeader)
	if h == "" {
		return who{tenant: isolation.DefaultTenant, forwarded: fwd}, nil
	}
	if err := checkTenant(h); err != nil {
		return who{}, err
	}
	x := who{tenant: h, forwarded: fwd}
	if fwd && peer {
		if v := r.Header.Get(WeightHeader); v != "" {
			if f, err := strconv.ParseFloat(v, 64); err == nil && f > 0 {
				x.weight = f
			}
		}
	}
	return x, nil
}

func checkTenant(t string) *apiError {
	if len(t) > 128 {
		return errorf(http.StatusBadRequest, "invalid_request_error", "invalid_tenant",
			"header %s is %d bytes: a tenant name has at most 128", TenantHeader, len(t))
	}
	for _, c := range t {
		if unicode.IsControl(c) || c == unicode.ReplacementChar {
			return errorf(http.StatusBadRequest, "invalid_request_error", "invalid_tenant",
				"header %s holds the control character %q: a tenant name is printable text", TenantHeader, c)
		}
	}
	return nil
}

// request is what the gateway reads of a body.
type request struct {
	path    string
	body    []byte
	model   string
	adapter string
	stream  bool
	// maxTokens is the output the request reserves; promptTokens an
	// estimate of its input.
	maxTokens    int
	promptTokens int
	// outTokens is the output the request asks for in max_tokens (-1:
	// not said); words a lower bound on its longest prompt's tokens.
	outTokens int
	words     int
	// n is the choices asked for (0: not said, one).
	n int
	// keepAlive is the request's keep_alive (Ollama's: how long its model
	// stays loaded after it; negative keeps it), nil when not given.
	keepAlive *time.Duration
	class     queue.Class
	who       who
	arrived   time.Time
	// held is what its body holds of the gateway's budget of buffered
	// bodies, given back when the request ends (done).
	held int64
}

// parse reads and checks r's body: a size within the limit, a JSON object
// with a model and the fields its endpoint needs, values within OpenAI's
// ranges (validate.go).
func (g *Gateway) parse(w http.ResponseWriter, r *http.Request) (*request, *apiError) {
	body, held, err := readBody(http.MaxBytesReader(w, r.Body, g.opts.MaxBodyBytes), r.ContentLength, g.opts.MaxBodyBytes, &g.bodies)
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.Is(err, errBodyBudget) {
			// The rest of its body is not read: the connection closes.
			_ = http.NewResponseController(w).SetReadDeadline(time.Now())
			w.Header().Set("Connection", "close")
			e := errorf(http.StatusServiceUnavailable, "server_error", "bodies_buffered",
				"the gateway holds its limit of %d bytes of request bodies from all clients; retry shortly", g.bodies.max)
			e.retryAfter = time.Second
			return nil, e
		}
		if errors.As(err, &tooBig) {
			return nil, errorf(http.StatusRequestEntityTooLarge, "invalid_request_error", "request_too_large",
				"the request body is over the gateway's limit of %d bytes", g.opts.MaxBodyBytes)
		}
		return nil, errorf(http.StatusBadRequest, "invalid_request_error", "invalid_body", "reading the request body: %v", err)
	}
	req, aerr := g.parseBody(r, body)
	if aerr != nil {
		g.bodies.give(held)
		return nil, aerr
	}
	req.held = held
	return req, nil
}

// parseBody reads a request from its body.
func (g *Gateway) parseBody(r *http.Request, body []byte) (*request, *apiError) {
	f, aerr := decodeBody(body)
	if aerr != nil {
		return nil, aerr
	}
	if aerr := f.check(r.URL.Path); aerr != nil {
		return nil, aerr
	}
	if aerr := f.checkControls(); aerr != nil {
		return nil, aerr
	}
	req := &request{path: r.URL.Path, body: body, model: *f.Model, maxTokens: g.opts.DefaultMaxTokens, outTokens: -1, arrived: time.Now()}
	if f.Stream != nil {
		req.stream = *f.Stream
	}
	if f.N != nil && req.path != "/v1/embeddings" {
		req.n = *f.N
	}
	if len(f.KeepAlive) > 0 && string(f.KeepAlive) != "null" {
		d, err := residency.ParseKeepAlive(f.KeepAlive)
		if err != nil {
			return nil, errorf(http.StatusBadRequest, "invalid_request_error", "invalid_value", "keep_alive %s: %v", f.KeepAlive, err)
		}
		req.keepAlive = &d
		// The gateway's field, not the engine's: a strict engine refuses
		// fields it does not know.
		if req.body, err = withoutField(req.body, "keep_alive"); err != nil {
			return nil, errorf(http.StatusBadRequest, "invalid_request_error", "invalid_json", "the request body: %v", err)
		}
	}
	for _, v := range []*int{f.MaxTokens, f.MaxCompletionTokens} {
		if v != nil {
			req.maxTokens, req.outTokens = *v, *v
		}
	}
	switch req.path {
	case "/v1/embeddings":
		req.maxTokens, req.outTokens = 0, -1
		req.stream = false
		req.words = promptWords(f.Input)
	case "/v1/completions":
		req.words = promptWords(f.Prompt)
	default:
		req.words = messageWords(f.msgs)
	}
	// A token is about four bytes of text: close enough to charge the
	// prompt at dispatch; the counters take what the engine reports.
	req.promptTokens = (len(f.Prompt) + len(f.Messages) + len(f.Input)) / 4
	return req, nil
}

// withoutField is body (a JSON object) without its field key.
func withoutField(body []byte, key string) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, err
	}
	delete(m, key)
	return json.Marshal(m)
}

// serveInference answers a completion, chat or embeddings request: here if
// a replica is on this node and best (the call it returns, queued, is run
// from ServeHTTP), else on the node that holds one.
func (g *Gateway) serveInference(w http.ResponseWriter, r *http.Request) *call {
	req, m, target := g.admit(w, r)
	switch {
	case req == nil:
	case target.local != nil:
		if x := g.enqueue(w, r, req, m, target.local); x != nil {
			return x
		}
		g.done(req)
	default:
		g.forward(w, r, req, m, target.node, target.url)
		g.done(req)
	}
	return nil
}

// done gives back what a request's body held of the budget of buffered
// bodies.
func (g *Gateway) done(req *request) {
	g.bodies.give(req.held)
	req.held = 0
}

// admit checks a request and chooses where it runs; a nil request: it was
// refused (and answered).
func (g *Gateway) admit(w http.ResponseWriter, r *http.Request) (*request, *Model, target) {
	x, aerr := g.tenant(r)
	if aerr != nil {
		aerr.write(w)
		return nil, nil, target{}
	}
	req, aerr := g.parse(w, r)
	if aerr != nil {
		aerr.write(w)
		return nil, nil, target{}
	}
	req.who = x
	m, t, ok := g.route(w, r, req)
	if !ok {
		g.done(req)
		return nil, nil, target{}
	}
	return req, m, t
}

// route resolves a parsed request's model and chooses where it runs;
// false: it was refused (and answered).
func (g *Gateway) route(w http.ResponseWriter, r *http.Request, req *request) (*Model, target, bool) {
	x := req.who
	m, adapter, aerr := g.resolveFresh(r.Context(), req.model, x.tenant)
	if aerr != nil {
		aerr.write(w)
		return nil, target{}, false
	}
	if aerr := req.checkFor(m); aerr != nil {
		aerr.write(w)
		return nil, target{}, false
	}
	req.adapter = adapter
	req.class = m.Class
	if h := r.Header.Get(ClassHeader); h != "" {
		c, ok := queue.ParseClass(h)
		if !ok {
			errorf(http.StatusBadRequest, "invalid_request_error", "invalid_priority",
				"header %s is %q: it must be interactive, standard or background", ClassHeader, h).write(w)
			return nil, target{}, false
		}
		if c > req.class && g.opts.Tenants != nil && !x.forwarded {
			// With ACLs a client may lower its request's class, never raise
			// it above its deployment's priority: that would take service
			// from other tenants' interactive work. A peer's header was
			// checked on the node the client called.
			errorf(http.StatusForbidden, "permission_error", "priority_not_allowed",
				"header %s asks for %s, above model %q's priority %s: with ACLs on, a request may only lower its class",
				ClassHeader, c, m.Served, req.class).write(w)
			return nil, target{}, false
		}
		req.class = c
	}
	t, aerr := g.choose(m, x.forwarded)
	if aerr != nil {
		g.metrics.rejected(m.Served, aerr.status)
		aerr.write(w)
		return nil, target{}, false
	}
	return m, t, true
}

// resolveFresh resolves name, reading the cluster again if it is not
// known (a model deployed a moment ago) and the view was read before the
// request came: a refresh already running when it came may have read the
// cluster before the deploy, so it waits for that one and reads again.
func (g *Gateway) resolveFresh(ctx context.Context, name, tenant string) (*Model, string, *apiError) {
	came := time.Now()
	m, ad, aerr := g.resolve(name, tenant)
	for range 2 {
		if aerr == nil || !g.table.Load().read.Before(came) || ctx.Err() != nil {
			break
		}
		g.refresh(ctx)
		m, ad, aerr = g.resolve(name, tenant)
	}
	return m, ad, aerr
}

// target is where a request goes: a local replica, or another node.
type target struct {
	local *local
	node  string
	url   string
}

// choose picks the replica for a request to m: a resident replica first,
// then the shortest queue (here: the scheduler's; elsewhere: the requests
// this node has in flight there); a replica here wins a tie. A forwarded
// request is served by a replica here or refused.
func (g *Gateway) choose(m *Model, forwarded bool) (target, *apiError) {
	if rp, all := allFailed(m); all {
		e := errorf(http.StatusServiceUnavailable, "server_error", "model_failed",
			"model %q cannot serve: its replica %d on node %s failed: %s", m.Served, rp.Index, rp.Node, rp.Failed)
		e.retryAfter = 5 * time.Second
		return target{}, e
	}
	var best target
	bestScore := -1
	for _, rp := range m.Replicas {
		var t target
		var load int
		if rp.Node == g.opts.Node {
			l := g.localFor(rp)
			if l == nil {
				continue
			}
			t.local = l
			var ready bool
			load, ready = l.load()
			// This node knows its own replicas' residency first hand.
			rp.Running, rp.Resident = rp.Running || ready, ready
		} else {
			if forwarded {
				continue
			}
			u, ok := g.opts.Cluster.Gateway(rp.Node)
			if !ok {
				continue
			}
			t.node, t.url = rp.Node, u
			g.fwdMu.Lock()
			load = g.forwarded[rp.Node]
			g.fwdMu.Unlock()
		}
		// Lower is better: resident first, then running, then load; a
		// local replica wins a tie.
		score := load * 2
		if t.local == nil {
			score++
		}
		if !rp.Running {
			score += 1 << 40
		}
		if !rp.Resident {
			score += 1 << 41
		}
		if bestScore < 0 || score < bestScore {
			best, bestScore = t, score
		}
	}
	if bestScore < 0 {
		where := "no node"
		if forwarded {
			where = "this node (the request was forwarded here)"
		}
		e := errorf(http.StatusServiceUnavailable, "server_error", "no_replica",
			"model %q has no replica that %s can reach; retry later", m.Served, where)
		e.retryAfter = 5 * time.Second
		return target{}, e
	}
	return best, nil
}

// allFailed says whether every replica of m failed (Replica.Failed), and
// returns the first.
func allFailed(m *Model) (Replica, bool) {
	if len(m.Replicas) == 0 {
		return Replica{}, false
	}
	for _, rp := range m.Replicas {
		if rp.Failed == "" || rp.Running {
			return Replica{}, false
		}
	}
	return m.Replicas[0], true
}

// forward sends the request to node's gateway and copies its answer back
// as it comes (streams flushed per read).
func (g *Gateway) forward(w http.ResponseWriter, r *http.Request, req *request, m *Model, node, base string) {
	g.fwdMu.Lock()
	g.forwarded[node]++
	g.fwdMu.Unlock()
	defer func() {
		g.fwdMu.Lock()
		g.forwarded[node]--
		g.fwdMu.Unlock()
	}()
	out, err := http.NewRequestWithContext(r.Context(), http.MethodPost, strings.TrimSuffix(base, "/")+req.path, bytes.NewReader(req.body))
	if err != nil {
		errorf(http.StatusBadGateway, "server_error", "forward_failed", "forward to node %s: %v", node, err).write(w)
		return
	}
	out.Header.Set("Content-Type", "application/json")
	if a := r.Header.Get("Accept"); a != "" {
		out.Header.Set("Accept", a)
	}
	// The class this node allowed, not the client's header.
	out.Header.Set(ClassHeader, req.class.String())
	out.Header.Set(TenantHeader, req.who.tenant)
	if req.who.weight > 0 {
		out.Header.Set(WeightHeader, strconv.FormatFloat(req.who.weight, 'g', -1, 64))
	}
	out.Header.Set(ForwardedHeader, g.opts.Node)
	g.metrics.forwardedTo(node)
	resp, err := g.opts.Peers.Do(out)
	if err != nil {
		if r.Context().Err() != nil {
			return
		}
		e := errorf(http.StatusBadGateway, "server_error", "forward_failed", "model %q: forward to node %s: %v", m.Served, node, err)
		e.retryAfter = time.Second
		e.write(w)
		return
	}
	defer resp.Body.Close()
	for _, h := range []string{"Content-Type", "Retry-After", "Cache-Control"} {
		if v := resp.Header.Get(h); v != "" {
			w.Header().Set(h, v)
		}
	}
	w.WriteHeader(resp.StatusCode)
	copyFlushing(w, resp.Body, g.opts.StreamStall)
}

// copyFlushing copies src to w, flushing after every read, so that a
// stream's events go out as they arrive; a client that stops reading is
// cut off after stall (stallWriter), and src closed by the caller.
func copyFlushing(w http.ResponseWriter, src io.Reader, stall time.Duration) {
	sw := newStallWriter(w, stall)
	buf := make([]byte, 16<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if _, werr := sw.Write(buf[:n]); werr != nil {
				return
			}
			if sw.flush() != nil {
				return
			}
		}
		if err != nil {
			sw.clear()
			return
		}
	}
}

// saltFor is the cache salt of a tenant on a model (empty without a
// Salter).
func (g *Gateway) saltFor(tenant, model string) string {
	if g.opts.Salter == nil {
		return ""
	}
	return g.opts.Salter.CacheSalt(tenant, model)
}

// withFields returns body (a JSON object) with fields set, overriding any
// the client sent: they are appended, and JSON decoders keep the last of
// duplicate keys.
func withFields(body []byte, fields map[string]any) []byte {
	if len(fields) == 0 {
		return body
	}
	end := bytes.LastIndexByte(body, '}')
	if end < 0 {
		return body
	}
	out := make([]byte, 0, len(body)+64)
	out = append(out, body[:end]...)
	for k, v := range fields {
		kb, _ := json.Marshal(k)
		vb, _ := json.Marshal(v)
		out = append(out, ',')
		out = append(out, kb...)
		out = append(out, ':')
		out = append(out, vb...)
	}
	return append(out, body[end:]...)
}
