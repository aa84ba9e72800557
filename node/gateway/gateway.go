package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpuplane/gpuplane/node/engine"
	"github.com/gpuplane/gpuplane/node/gateway/isolation"
	"github.com/gpuplane/gpuplane/node/gateway/queue"
	"github.com/gpuplane/gpuplane/node/traffic"
)

// Replica is one placed replica as the gateway routes to it.
type Replica struct {
	// Deployment is the deployment's name, Index the replica's ordinal.
	Deployment string
	Index      uint32
	Node       string
	// Card is the first card the replica is placed on (its queue's card).
	Card uint32
	// Endpoint is the replica's reported address (its engine's, or its
	// residency front's).
	Endpoint string
	// Kind is the engine kind (vllm, llamacpp, ollama, command, sim).
	Kind string
	// Running: the replica's engine (or front) answers.
	Running bool
	// Failed, for a replica its node reports Failed that no request
	// would load again (one not Fronted), is the reason it failed: while
	// every replica of a model has one, its requests are refused at once
	// with it rather than queued for an engine that is not coming.
	Failed string
	// Resident: its weights are loaded (a pinned replica that runs, or a
	// warm or onDemand one its node reports resident).
	Resident bool
	// Fronted: warm or onDemand, so its node's residency controller loads
	// it on demand.
	Fronted bool
	// KVTokens is the engine's KV budget in tokens, where its deployment
	// says it (0: unknown). The replica's in-flight cap is then sized from
	// it: its requests in flight hold at most KVTokens of prompt plus
	// max_tokens (at least one request; MaxInFlight stays the upper bound).
	KVTokens int
	// PriorityScheduling: the engine orders requests by a `priority`
	// field (vLLM, or sim, started with --scheduling-policy priority): the
	// gateway passes each request's class in it (interactive 0, standard
	// 1, background 2). Its own preemption still applies (it is per card).
	PriorityScheduling bool
	// MaxInFlight is how many requests the engine runs at once (vLLM's and
	// sim's --max-num-seqs, llama.cpp's slots, Ollama's
	// OLLAMA_NUM_PARALLEL; 0: unknown, and Options.MaxInFlight holds).
	// The gateway sends it no more: the rest wait in the card's queue,
	// where priority and fairness order them, not in the engine's.
	MaxInFlight int
	// Slots is a llama.cpp engine's slot count (its --parallel, else
	// llama-server's auto 4: engine.LlamaSlots; 0 counts as 1): the
	// gateway runs each request in a slot of
	// its own tenant's (id_slot), never in one holding another tenant's
	// prompt cache. Other kinds ignore it.
	Slots int
}

// Model is one deployment as the gateway serves it.
type Model struct {
	// Served is the name clients use (`model`); Deployment the
	// deployment's own name.
	Served     string
	Deployment string
	// Class is the request class of the deployment's priority.
	Class    queue.Class
	Created  int64
	Replicas []Replica
	// Adapters are the deployment's LoRA adapters, each with the tenants
	// it is private to (none: every tenant may use it).
	Adapters map[string][]string
	// Aliases are other names clients may use for the same replicas; the
	// engine is sent the served name.
	Aliases []string
	// EngineModel, when set, is the name the engine knows the base model
	// by instead of the served name (Ollama knows only its tags,
	// "llama3.2:1b"): requests for the base are sent with it.
	EngineModel string
	// AdapterIDs, for an engine that loads its adapters at start and picks
	// them per request (llama.cpp's --lora), are their ids: a request for
	// one is sent for the base model with "lora": [{"id", "scale": 1}]
	// instead of the adapter's name.
	AdapterIDs map[string]int
	// MaxModelLen is the context length of one request in tokens (prompt
	// and output), where the deployment says it (0: unknown): a prompt
	// longer than it is refused before it reaches a queue.
	MaxModelLen int
	// Task is what the engine answers: TaskAny (unknown: both), or only
	// one of TaskGenerate (completions, chat) and TaskEmbed (embeddings).
	Task Task
}

// Task is what a model's engine answers.
type Task string

// The tasks a deployment's engine arguments can say.
const (
	TaskAny      Task = ""
	TaskGenerate Task = "generate"
	TaskEmbed    Task = "embed"
)

// Cluster is the gateway's view of the cluster.
type Cluster interface {
	// Models lists every deployment and its placed replicas. The gateway
	// calls it every Options.Refresh, not per request.
	Models(ctx context.Context) ([]Model, error)
	// Gateway is the base URL (http://host:port) of node's gateway, if
	// known.
	Gateway(node string) (string, bool)
}

// Residency is what the gateway needs of the node's residency controllers
// for the warm and onDemand replicas placed here (cardmanager.Manager).
type Residency interface {
	// Serving reports whether the replica's model is resident, its
	// engine's URL, and a channel closed when either changes; ok is false
	// for a replica the controllers do not hold.
	Serving(model string, index uint32) (ready bool, engineURL string, changed <-chan struct{}, ok bool)
	// Demand tells the replica's controller that a request for it waits
	// (loading the model if it is cold); done reports that it ended.
	Demand(model string, index uint32) (done func(tokens int64, elapsed time.Duration))
}

// TenantSource finds the tenant of an ACL token: its tenant (its name
// unless set) and weight. The gateway uses it when ACLs are on.
type TenantSource interface {
	TenantFor(secret string) (tenant string, weight float64, ok bool)
}

// Options configure a Gateway; zero values take the defaults named.
type Options struct {
	// Node is this node's name.
	Node    string
	Cluster Cluster
	// Residency holds the warm and onDemand replicas of this node; nil:
	// every local replica is served as a pinned one.
	Residency Residency
	// Traffic, when set, records each request a local replica's queue
	// ends, per card (node/traffic): what `simulate serve --from-node`
	// replays.
	Traffic *traffic.Log
	// Tenants resolves ACL tokens; nil means ACLs are off and the tenant
	// comes from the X-Gpuplane-Tenant header.
	Tenants TenantSource
	// Salter derives the per-tenant cache salt sent to vLLM and sim
	// engines; nil sends none.
	Salter *isolation.Salter
	// Peers carries forwarded requests to other nodes' gateways (TLS and
	// the agent's credentials when the cluster has them).
	Peers *http.Client
	// IsPeer says whether a request comes from another node of the
	// cluster (its certificate or the agent token): only then are its
	// forwarding and tenant headers believed when ACLs are on.
	IsPeer func(*http.Request) bool
	// FrontKey is the node's front key (cardmanager.Options.FrontKey), sent
	// in isolation.FrontKeyHeader with every request to a local replica:
	// the gateway cannot tell a front's address from an engine's, and an
	// engine ignores the header.
	FrontKey string
	// EngineKeys give each local engine's API key (engine.Keys), sent as
	// a bearer token with every request to it; nil: none.
	EngineKeys *engine.Keys
	// Engines carries requests to this node's engines; nil: the gateway's
	// own lean keep-alive HTTP/1.1 client (engineTransport), without
	// timeouts (streams last), so that an idle stream costs little.
	Engines *http.Client
	// Queue is every card's scheduler configuration.
	Queue queue.Config
	// MaxInFlight caps the requests an engine whose own concurrency is
	// not known (Replica.MaxInFlight 0) holds at once (default 64); a
	// replica with a KV budget, Replica.KVTokens, may hold fewer.
	// QueueLimit bounds the requests waiting for each engine (default
	// 512).
	MaxInFlight int
	QueueLimit  int
	// MaxBodyBytes bounds a request body (default 4 MiB); past it, 413.
	MaxBodyBytes int64
	// MaxBufferedBytes bounds the request bodies held at once, from all
	// clients together: those arriving and those waiting with their
	// request (default 64 × MaxBodyBytes, 256 MiB). A body's buffer grows
	// with what arrives, not with the Content-Length it announces; one
	// that would take the gateway past the bound is refused with 503
	// (bodies_buffered) and its connection closed.
	MaxBufferedBytes int64
	// StreamStall bounds how long one write of an answer to its client
	// may wait (default 30s): a client that stops reading a stream is cut
	// off once the connection's buffers are full and this long has passed
	// without the gateway's write going out, and its engine request is
	// cancelled, freeing its slot.
	StreamStall time.Duration
	// DefaultMaxTokens is the output a request without max_tokens is
	// assumed to reserve (default 256).
	DefaultMaxTokens int
	// Weights are tenants' weights set by configuration (a tenant a token
	// gives a weight to takes the token's).
	Weights map[string]float64
	// Refresh is how often the cluster's view is read again (default
	// 500ms).
	Refresh time.Duration
	// MetricTenants bounds the tenant label of the gateway's metrics
	// without ACLs, where a tenant is what a client's header says:
	// DefaultTenant, the tenants of Weights and the first MetricTenants
	// others seen have series of their own, the rest share OtherTenant's
	// (default DefaultMetricTenants). With ACLs each token's tenant has
	// its own.
	MetricTenants int
	// Registerer receives the gateway's metrics; nil registers none.
	Registerer prometheus.Registerer
	Logger     *slog.Logger
}

// DefaultStreamStall is Options.StreamStall's default.
const DefaultStreamStall = 30 * time.Second

// Headers the gateway reads.
const (
	// TenantHeader names the tenant without ACLs (and between nodes).
	TenantHeader = isolation.TenantHeader
	// WeightHeader passes a tenant's weight between nodes.
	WeightHeader = "X-Gpuplane-Tenant-Weight"
	// ClassHeader sets a request's class (interactive, standard,
	// background) instead of its deployment's priority.
	ClassHeader = "X-Gpuplane-Priority"
	// ForwardedHeader marks a request another node's gateway forwarded:
	// it is served here or refused, never forwarded again.
	ForwardedHeader = "X-Gpuplane-Forwarded-By"
)

// Gateway serves the OpenAI-compatible API of one node.
type Gateway struct {
	opts    Options
	log     *slog.Logger
	metrics *metrics
	// engines carries requests to this node's engines unless
	// Options.Engines is set.
	engines *engineTransport
	// bodies is the budget of request bodies held (MaxBufferedBytes).
	bodies bodyBudget

	table atomic.Pointer[table]
	// refreshing is set while a refresh runs; refreshed is closed and
	// replaced after each.
	refreshing atomic.Bool
	refreshMu  sync.Mutex
	refreshed  chan struct{}
	// firstSeen is when each deployment was first in the view (Unix
	// seconds); the running refresh alone uses it.
	firstSeen map[string]int64

	mu     sync.Mutex
	cards  map[uint32]*card
	locals map[string]*local // by replica key (deployment/index)

	// forwarded counts requests in flight to each node, the queue length
	// this node sees of replicas elsewhere.
	fwdMu     sync.Mutex
	forwarded map[string]int
}

// table is one refresh's view of the cluster.
type table struct {
	models []Model
	byName map[string]*Model
	// read is when the cluster's view it holds began to be read.
	read time.Time
}

// New returns a Gateway; Run keeps its view of the cluster fresh.
func New(opts Options) (*Gateway, error) {
	if opts.Cluster == nil {
		return nil, errors.New("gateway: Options.Cluster is required")
	}
	if opts.MaxInFlight == 0 {
		opts.MaxInFlight = 64
	}
	if opts.QueueLimit == 0 {
		opts.QueueLimit = 512
	}
	if opts.MaxBodyBytes == 0 {
		opts.MaxBodyBytes = 4 << 20
	}
	if opts.StreamStall <= 0 {
		opts.StreamStall = DefaultStreamStall
	}
	if opts.MaxBufferedBytes == 0 {
		opts.MaxBufferedBytes = 64 * max(opts.MaxBodyBytes, 0)
	}
	if opts.DefaultMaxTokens == 0 {
		opts.DefaultMaxTokens = 256
	}
	if opts.Refresh == 0 {
		opts.Refresh = 500 * time.Millisecond
	}
	if opts.MetricTenants == 0 {
		opts.MetricTenants = DefaultMetricTenants
	}
	switch {
	case opts.MaxInFlight < 0:
		return nil, fmt.Errorf("gateway: MaxInFlight is %d: it must be positive", opts.MaxInFlight)
	case opts.QueueLimit < 0:
		return nil, fmt.Errorf("gateway: QueueLimit is %d: it must be positive", opts.QueueLimit)
	case opts.MaxBodyBytes < 0:
		return nil, fmt.Errorf("gateway: MaxBodyBytes is %d: it must be positive", opts.MaxBodyBytes)
	case opts.MaxBufferedBytes < opts.MaxBodyBytes:
		return nil, fmt.Errorf("gateway: MaxBufferedBytes is %d: it must be at least MaxBodyBytes (%d)", opts.MaxBufferedBytes, opts.MaxBodyBytes)
	case opts.MetricTenants < 0:
		return nil, fmt.Errorf("gateway: MetricTenants is %d: it must be positive", opts.MetricTenants)
	}
	for t, w := range opts.Weights {
		if t == "" || !(w > 0) {
			return nil, fmt.Errorf("gateway: weight of tenant %q is %g: tenants need a name and a positive weight", t, w)
		}
	}
	if _, err := queue.New(opts.Queue); err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if opts.Peers == nil {
		opts.Peers = &http.Client{}
	}
	g := &Gateway{opts: opts, log: opts.Logger, engines: newEngineTransport(), refreshed: make(chan struct{}),
		cards: map[uint32]*card{}, locals: map[string]*local{}, forwarded: map[string]int{}}
	g.bodies.max = opts.MaxBufferedBytes
	g.metrics = newMetrics(g, opts.Registerer)
	g.table.Store(&table{byName: map[string]*Model{}})
	return g, nil
}

// Run reads the cluster's view every Options.Refresh until ctx ends, and
// keeps the local cards' queues in step with the replicas placed here.
func (g *Gateway) Run(ctx context.Context) {
	t := time.NewTicker(g.opts.Refresh)
	defer t.Stop()
	defer g.closeLocals()
	defer g.engines.closeIdle()
	for {
		g.refresh(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// refresh reads the cluster's view now, or waits for the refresh already
// running: requests for a model not known yet share one read.
func (g *Gateway) refresh(ctx context.Context) {
	g.refreshMu.Lock()
	done := g.refreshed
	g.refreshMu.Unlock()
	if !g.refreshing.CompareAndSwap(false, true) {
		select {
		case <-done:
		case <-ctx.Done():
		}
		return
	}
	defer g.refreshing.Store(false)
	read := time.Now()
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	ms, err := g.opts.Cluster.Models(rctx)
	cancel()
	if err != nil {
		g.log.Debug("gateway: read the cluster's models", "err", err)
		return
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].Served < ms[j].Served })
	g.stampCreated(ms)
	t := &table{models: ms, byName: map[string]*Model{}, read: read}
	// Aliases first: a deployment's served name wins over another's alias.
	for i := range ms {
		for _, a := range ms[i].Aliases {
			t.byName[a] = &ms[i]
		}
	}
	for i := range ms {
		t.byName[ms[i].Served] = &ms[i]
	}
	g.table.Store(t)
	g.syncLocals(t)
	g.refreshMu.Lock()
	close(g.refreshed)
	g.refreshed = make(chan struct{})
	g.refreshMu.Unlock()
}

// stampCreated gives each model the Unix time this gateway first saw its
// deployment where the cluster's view has none, so that /v1/models
// answers the same `created` on every listing; only the running refresh
// calls it.
func (g *Gateway) stampCreated(ms []Model) {
	now := time.Now().Unix()
	seen := make(map[string]int64, len(ms))
	for i := range ms {
		m := &ms[i]
		if m.Created == 0 {
			if t, ok := g.firstSeen[m.Deployment]; ok {
				m.Created = t
			} else {
				m.Created = now
			}
		}
		seen[m.Deployment] = m.Created
	}
	g.firstSeen = seen
}

// resolve finds the model a request names: a served name or an alias,
// NAME:ADAPTER with either, or an adapter's bare name where one model
// alone has an adapter of that name that tenant may use.
// An adapter private to other tenants reads exactly like an unknown one.
func (g *Gateway) resolve(name, tenant string) (m *Model, adapter string, err *apiError) {
	t := g.table.Load()
	if m := t.byName[name]; m != nil {
		return m, "", nil
	}
	if i := strings.LastIndexByte(name, ':'); i > 0 {
		base, ad := name[:i], name[i+1:]
		if m := t.byName[base]; m != nil {
			if ad == "" || !m.offers(ad, tenant) {
				e := errorf(http.StatusNotFound, "invalid_request_error", "adapter_not_found",
					"model %q has no adapter %q", base, ad)
				e.param = "model"
				return nil, "", e
			}
			return m, ad, nil
		}
	}
	var found []*Model
	for i := range t.models {
		if t.models[i].offers(name, tenant) {
			found = append(found, &t.models[i])
		}
	}
	switch len(found) {
	case 1:
		return found[0], name, nil
	case 0:
		e := errorf(http.StatusNotFound, "invalid_request_error", "model_not_found",
			"the model %q does not exist: no deployment serves it (GET /v1/models lists them)", name)
		e.param = "model"
		return nil, "", e
	}
	full := make([]string, len(found))
	for i, m := range found {
		full[i] = m.Served + ":" + name
	}
	e := errorf(http.StatusBadRequest, "invalid_request_error", "ambiguous_model",
		"adapter %q is on several models: name one as MODEL:ADAPTER (%s)", name, strings.Join(full, ", "))
	e.param = "model"
	return nil, "", e
}

// offers reports whether m has adapter ad and tenant may use it.
func (m *Model) offers(ad, tenant string) bool {
	tenants, ok := m.Adapters[ad]
	return ok && (len(tenants) == 0 || slices.Contains(tenants, tenant))
}
