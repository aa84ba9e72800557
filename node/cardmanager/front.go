package cardmanager

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gpuplane/gpuplane/node/engine"
	"github.com/gpuplane/gpuplane/node/executor"
	"github.com/gpuplane/gpuplane/node/gateway/isolation"
	"github.com/gpuplane/gpuplane/node/residency"
)

// retryAfter is what a request that waited too long is told (seconds).
const retryAfter = 5

// front serves one managed replica's endpoint: it reports each request to
// the replica's controller, waits for the model to be resident and proxies
// the request to the engine. Its port stays the replica's for as long as
// the replica is placed here, whatever the engine's port.
type front struct {
	m   *Manager
	k   rkey
	url string
	srv *http.Server

	mu     sync.Mutex
	ready  bool
	target *url.URL
	// changed is closed (and replaced) whenever ready, target or rejected
	// change.
	changed chan struct{}
	// rejected counts rejections; reason is the last one's.
	rejected int
	reason   string
	// left is set once the replica left: every answer then closes its
	// connection, and new requests are refused.
	left bool
	// adapters are the adapters on the card, served now; failed counts
	// each adapter's failed loads, with the last error.
	adapters map[string]bool
	failed   map[string]adapterFailure
	// early counts the requests waiting now for the replica's placement
	// to be applied.
	early int

	proxy *httputil.ReverseProxy
}

type targetKey struct{}

// front returns k's front, serving it first if needed.
func (m *Manager) front(k rkey) (*front, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if f := m.fronts[k]; f != nil {
		return f, nil
	}
	ln, err := m.listen(k)
	if err != nil {
		return nil, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	f := &front{m: m, k: k, url: "http://" + net.JoinHostPort(m.opts.AdvertiseHost, strconv.Itoa(port)),
		changed: make(chan struct{})}
	f.proxy = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(pr.In.Context().Value(targetKey{}).(*url.URL))
			pr.Out.Host = pr.In.Host
			// The engine has no use for the node's front key; it takes
			// its own API key.
			pr.Out.Header.Del(isolation.FrontKeyHeader)
			engine.Authorize(pr.Out.Header, m.opts.EngineKeys.For(k.model, k.index))
		},
		// Streamed (SSE) answers go out as the engine writes them.
		FlushInterval: -1,
		// An answer whose headers go out after the replica left closes
		// its connection, so that the client does not send its next
		// request on a connection the front is about to close (one
		// already under way cannot say so any more).
		ModifyResponse: func(resp *http.Response) error {
			f.mu.Lock()
			left := f.left
			f.mu.Unlock()
			if left {
				resp.Header.Set("Connection", "close")
			}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			writeError(w, http.StatusBadGateway, "bad_gateway", fmt.Sprintf("model %s: engine: %v", k.model, err))
		},
	}
	f.srv = &http.Server{Handler: f, ReadHeaderTimeout: 30 * time.Second}
	go func() {
		if err := f.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			m.log.Warn("residency: front stopped", "replica", k.id(), "err", err)
		}
	}()
	m.fronts[k] = f
	return f, nil
}

// closeFronts stops every front (the manager ends).
func (m *Manager) closeFronts() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, f := range m.fronts {
		f.close(0)
		delete(m.fronts, k)
	}
}

// close stops the front because its replica left the node (or the node
// stops): requests waiting for the model are refused with a 503, requests
// being answered get their answer or the proxy's error. For grace (the
// replica left; none when the node stops) the port stays open and answers
// any new request with a 503 that closes its connection, so that a client
// sending on a kept-alive connection as the replica leaves gets an answer
// rather than the connection closed under its request; then the port
// closes.
func (f *front) close(grace time.Duration) {
	f.mu.Lock()
	f.left = true
	f.mu.Unlock()
	f.reject("the replica left this node")
	go func() {
		time.Sleep(grace)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := f.srv.Shutdown(ctx); err != nil {
			_ = f.srv.Close()
		}
	}()
}

// hasLeft reports whether the replica left; if so, the answer being
// written closes its connection.
func (f *front) hasLeft(w http.ResponseWriter) bool {
	f.mu.Lock()
	left := f.left
	f.mu.Unlock()
	if left {
		w.Header().Set("Connection", "close")
	}
	return left
}

// set says whether the model may be dispatched to, and where.
func (f *front) set(ready bool, engineURL string) {
	var target *url.URL
	if ready {
		u, err := url.Parse(engineURL)
		if err != nil {
			ready = false
		}
		target = u
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ready == ready && (target == nil) == (f.target == nil) && (target == nil || *target == *f.target) {
		return
	}
	f.ready, f.target = ready, target
	close(f.changed)
	f.changed = make(chan struct{})
}

// setAdapters says which adapters the engine serves now.
func (f *front) setAdapters(names []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(names) == len(f.adapters) {
		same := true
		for _, n := range names {
			same = same && f.adapters[n]
		}
		if same {
			return
		}
	}
	f.adapters = make(map[string]bool, len(names))
	for _, n := range names {
		f.adapters[n] = true
	}
	close(f.changed)
	f.changed = make(chan struct{})
}

type adapterFailure struct {
	n   int
	err string
}

// adapterFailed fails the requests waiting for adapter a now.
func (f *front) adapterFailed(a, err string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failed == nil {
		f.failed = map[string]adapterFailure{}
	}
	f.failed[a] = adapterFailure{n: f.failed[a].n + 1, err: err}
	close(f.changed)
	f.changed = make(chan struct{})
}

func (f *front) failure(a string) adapterFailure {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.failed[a]
}

// serves reports whether the engine serves adapter a now ("" is the base).
func (f *front) serves(a string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return a == "" || f.adapters[a]
}

// wake has the waiting requests look again at what they wait for.
func (f *front) wake() {
	f.mu.Lock()
	defer f.mu.Unlock()
	close(f.changed)
	f.changed = make(chan struct{})
}

// reject fails the requests waiting now.
func (f *front) reject(reason string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rejected++
	f.reason = reason
	close(f.changed)
	f.changed = make(chan struct{})
}

// refuse answers a request that waited for the model with the reason the
// model cannot be loaded now (reject's), closing its connection if the
// replica left.
func (f *front) refuse(w http.ResponseWriter, reason string) {
	f.hasLeft(w)
	w.Header().Set("Retry-After", strconv.Itoa(retryAfter))
	writeError(w, http.StatusServiceUnavailable, "model_not_loaded", fmt.Sprintf("model %s cannot be loaded now: %s", f.k.model, reason))
}

// notLoadedInTime answers a request whose wait for the model ran out.
func (f *front) notLoadedInTime(w http.ResponseWriter) {
	w.Header().Set("Retry-After", strconv.Itoa(retryAfter))
	writeError(w, http.StatusServiceUnavailable, "model_not_loaded",
		fmt.Sprintf("model %s was not loaded within %s; retry later", f.k.model, f.m.opts.Wait))
}

func (f *front) state() (bool, *url.URL, int, string, <-chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ready, f.target, f.rejected, f.reason, f.changed
}

// ServeHTTP answers the front's own health check and the model list at
// once; any other request is a request for the model.
func (f *front) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if f.hasLeft(w) {
		w.Header().Set("Retry-After", strconv.Itoa(retryAfter))
		writeError(w, http.StatusServiceUnavailable, "model_not_loaded", fmt.Sprintf("model %s: the replica left this node", f.k.model))
		return
	}
	if r.Method == http.MethodGet && r.URL.Path == "/health" {
		w.WriteHeader(http.StatusOK)
		return
	}
	if !f.fromGateway(r) {
		writeError(w, http.StatusForbidden, "permission_error", fmt.Sprintf(
			"model %s: a replica's endpoint serves this node's gateway only: send requests to the gateway (gpuplane agent --gateway-port) with your token", f.k.model))
		return
	}
	deadline := time.NewTimer(f.m.opts.Wait)
	defer deadline.Stop()
	if !f.awaitApplied(w, r, deadline.C) {
		return
	}
	// A request for an adapter (or for a model this node does not serve
	// to this tenant) is resolved before anything is loaded for it.
	ar, status, msg := f.resolve(r)
	if status != 0 {
		typ := "invalid_request_error"
		if status == http.StatusNotFound {
			typ = "model_not_found"
		}
		writeError(w, status, typ, msg)
		return
	}
	body, keep, status, msg := keepAliveOf(r, ar.body)
	if status != 0 {
		writeError(w, status, "invalid_request_error", msg)
		return
	}
	in := r.Body
	r = withBody(r, body)
	id := f.k.id()
	// What the request waits for is read before the controller hears of
	// it: the rejection or failed load its own arrival causes (decided in
	// the same step as the arrival, possibly before this goroutine runs
	// again) must count, or it would wait out the deadline.
	_, _, rejected0, _, _ := f.state()
	failed0 := f.failure(ar.adapter)
	told := make(chan struct{})
	f.m.post(func() {
		defer close(told)
		f.m.request(f.k, residency.RequestArrived{Model: id})
		if keep != nil {
			f.m.request(f.k, residency.KeepAlive{Model: id, For: *keep})
		}
		if ar.adapter != "" {
			f.m.request(f.k, residency.AdapterRequested{Model: id, Adapter: ar.adapter})
		}
	})
	if ar.adapter != "" {
		// The controller must count the request before it is dispatched:
		// otherwise it could take the adapter for idle and unload it
		// under the request (I3).
		select {
		case <-told:
		case <-r.Context().Done():
		}
	}
	start := time.Now()
	// answered: the request reached the engine (a best-effort model's
	// turns follow the share of its requests answered).
	answered := false
	defer func() {
		elapsed := time.Since(start)
		f.m.post(func() {
			if ar.adapter != "" {
				f.m.request(f.k, residency.AdapterFinished{Model: id, Adapter: ar.adapter})
			}
			f.m.request(f.k, residency.RequestFinished{Model: id, Elapsed: elapsed, Answered: answered})
		})
	}()
	for {
		ready, target, rejected, reason, changed := f.state()
		if ready && f.serves(ar.adapter) {
			// The request's body may still be on its way to the engine
			// when the engine's answer starts (the transport checks for
			// bytes past Content-Length after it sent the last ones, and
			// an engine may answer before it read everything). Without
			// full duplex the server drains and closes the body as the
			// answer's headers go out, which fails the transport's copy
			// and closes the engine's connection under the answer. HTTP/2
			// is always full duplex (ErrNotSupported there).
			_ = http.NewResponseController(w).EnableFullDuplex()
			answered = true
			f.proxy.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), targetKey{}, target)))
			// A body the transport left unread (the engine could not be
			// reached, or answered without reading it) is drained here,
			// while the handler runs: drained after it returns, in full
			// duplex, its end would start the server's background read of
			// the connection, and reading the next request beside that read
			// panics ("invalid concurrent Body.Read call", golang/go#68560).
			_ = in.Close()
			return
		}
		if ar.adapter != "" && !f.stillOffered(ar) {
			writeError(w, http.StatusNotFound, "model_not_found", fmt.Sprintf("The model `%s` does not exist.", ar.model))
			return
		}
		if fl := f.failure(ar.adapter); ar.adapter != "" && fl.n != failed0.n {
			w.Header().Set("Retry-After", strconv.Itoa(retryAfter))
			writeError(w, http.StatusServiceUnavailable, "adapter_not_loaded", fmt.Sprintf("adapter %s of model %s could not be loaded: %s", ar.adapter, f.k.model, fl.err))
			return
		}
		if rejected != rejected0 {
			f.refuse(w, reason)
			return
		}
		select {
		case <-changed:
		case <-r.Context().Done():
			return
		case <-deadline.C:
			f.notLoadedInTime(w)
			return
		}
	}
}

// keepAliveOf takes a request's keep_alive (Ollama's: how long its model
// stays loaded after it) out of its body, as the gateway does: the field
// is the controller's hint, not the engine's (a strict engine refuses it).
// body is what resolve read (nil: the body is still unread). It returns
// the body to send on, and the duration when the request gave one; a bad
// value is a 400 naming the field.
func keepAliveOf(r *http.Request, body []byte) ([]byte, *time.Duration, int, string) {
	if r.Method != http.MethodPost || r.Body == nil && body == nil {
		return body, nil, 0, ""
	}
	if body == nil {
		data, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
		if err != nil {
			return nil, nil, http.StatusBadRequest, fmt.Sprintf("reading the request body: %v", err)
		}
		if len(data) > maxBody {
			return nil, nil, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body larger than %d bytes", maxBody)
		}
		body = data
	}
	if !bytes.Contains(body, []byte(`"keep_alive"`)) {
		return body, nil, 0, ""
	}
	var fields map[string]json.RawMessage
	if json.Unmarshal(body, &fields) != nil {
		return body, nil, 0, "" // the engine answers malformed bodies
	}
	raw, ok := fields["keep_alive"]
	if !ok {
		return body, nil, 0, ""
	}
	delete(fields, "keep_alive")
	out, err := json.Marshal(fields)
	if err != nil {
		return nil, nil, http.StatusBadRequest, err.Error()
	}
	if string(raw) == "null" {
		return out, nil, 0, ""
	}
	d, err := residency.ParseKeepAlive(raw)
	if err != nil {
		return nil, nil, http.StatusBadRequest, fmt.Sprintf("keep_alive %s: %v", raw, err)
	}
	return out, &d, 0, ""
}

// fromGateway reports whether r may be served: it bears the node's front
// key, or the node runs without one (no ACLs).
func (f *front) fromGateway(r *http.Request) bool {
	key := f.m.opts.FrontKey
	if key == "" {
		return true
	}
	got := r.Header.Get(isolation.FrontKeyHeader)
	return subtle.ConstantTimeCompare([]byte(got), []byte(key)) == 1
}

// awaitApplied waits, within the request's deadline, until the manager
// has applied the placement of the front's replica: before that the front
// does not know its adapters and would take a request for one for a
// request for a model it does not serve. False when it answered instead.
func (f *front) awaitApplied(w http.ResponseWriter, r *http.Request, deadline <-chan time.Time) bool {
	_, _, rejected0, _, _ := f.state()
	counted := false
	defer func() {
		if counted {
			f.mu.Lock()
			f.early--
			f.mu.Unlock()
		}
	}()
	for {
		f.m.mu.Lock()
		applied, appliedCh := f.m.applied[f.k], f.m.appliedCh
		f.m.mu.Unlock()
		if applied {
			return true
		}
		_, _, rejected, reason, changed := f.state()
		if rejected != rejected0 {
			f.refuse(w, reason)
			return false
		}
		if !counted {
			counted = true
			f.mu.Lock()
			f.early++
			f.mu.Unlock()
		}
		select {
		case <-appliedCh:
		case <-changed:
		case <-r.Context().Done():
			return false
		case <-deadline:
			f.notLoadedInTime(w)
			return false
		}
	}
}

// request hands a front's request event to the replica's controller.
func (m *Manager) request(k rkey, ev residency.Event) {
	if r := m.reps[k]; r != nil {
		m.handle(m.ctrls[r.card], ev, "")
		return
	}
	// Not placed yet: the request waits for it, and counts once it is.
	switch ev.(type) {
	case residency.RequestArrived:
		m.early[k]++
	case residency.RequestFinished:
		if m.early[k] > 1 {
			m.early[k]--
		} else {
			delete(m.early, k)
		}
	}
}

// writeError answers with an OpenAI-shaped error.
func writeError(w http.ResponseWriter, status int, typ, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{
		"message": msg, "type": typ, "param": nil, "code": status,
	}})
}

// portFile keeps a front's port in its replica's directory, so that the
// replica keeps its endpoint across agent restarts.
const portFile = "front.port"

// listen opens k's front on the port it had before (a restarted agent),
// else on a free one, and records it.
func (m *Manager) listen(k rkey) (net.Listener, error) {
	if m.opts.DataDir == "" {
		return net.Listen("tcp", net.JoinHostPort(m.opts.BindHost, "0"))
	}
	dir := executor.ReplicaDir(m.opts.DataDir, k.model, k.index)
	path := filepath.Join(dir, portFile)
	if data, err := os.ReadFile(path); err == nil {
		if port, err := strconv.Atoi(strings.TrimSpace(string(data))); err == nil && port > 0 {
			if ln, err := net.Listen("tcp", net.JoinHostPort(m.opts.BindHost, strconv.Itoa(port))); err == nil {
				return ln, nil
			}
		}
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(m.opts.BindHost, "0"))
	if err != nil {
		return nil, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	if err := os.MkdirAll(dir, 0o755); err == nil {
		err = os.WriteFile(path, []byte(strconv.Itoa(port)+"\n"), 0o644)
		if err != nil {
			m.log.Warn("residency: record the front's port", "replica", k.id(), "err", err)
		}
	}
	return ln, nil
}

// Serving is how the gateway reaches a warm or onDemand replica this
// Manager fronts: whether its model is resident (its front dispatches),
// its engine's URL, and a channel closed when either changes. ok is false
// for a replica without a front here.
func (m *Manager) Serving(model string, index uint32) (ready bool, engineURL string, changed <-chan struct{}, ok bool) {
	m.mu.Lock()
	f := m.fronts[rkey{model, index}]
	m.mu.Unlock()
	if f == nil {
		return false, "", nil, false
	}
	ready, target, _, _, ch := f.state()
	if target != nil {
		engineURL = target.String()
	}
	return ready, engineURL, ch, true
}

// Demand reports a request for the replica that waits at the gateway, as
// a request at its front is reported: the controller loads a cold model
// for it and does not unload the model while it is active. done reports
// that the request ended, with its output tokens and time.
func (m *Manager) Demand(model string, index uint32) (done func(tokens int64, elapsed time.Duration)) {
	k := rkey{model, index}
	id := k.id()
	m.post(func() { m.request(k, residency.RequestArrived{Model: id}) })
	var once sync.Once
	return func(tokens int64, elapsed time.Duration) {
		once.Do(func() {
			m.post(func() {
				m.request(k, residency.RequestFinished{Model: id, Tokens: tokens, Elapsed: elapsed, Answered: tokens > 0})
			})
		})
	}
}
