package agent

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/gpuplane/gpuplane/cluster"
	"github.com/gpuplane/gpuplane/fsm"
	"github.com/gpuplane/gpuplane/internal/engines"
	"github.com/gpuplane/gpuplane/internal/wireenum"
	"github.com/gpuplane/gpuplane/node/cardmanager"
	"github.com/gpuplane/gpuplane/node/engine"
	"github.com/gpuplane/gpuplane/node/gateway"
	"github.com/gpuplane/gpuplane/node/gateway/isolation"
	"github.com/gpuplane/gpuplane/node/gateway/queue"
	"github.com/gpuplane/gpuplane/node/traffic"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// GatewayConfig tunes the gateway beyond its port; the zero value takes the
// gateway's defaults. Only MetricTenants has a flag
// (--gateway-metric-tenants): in-process tests and benchmarks set the rest.
type GatewayConfig struct {
	// MetricTenants bounds the tenants the gateway's metrics name without
	// ACLs (gateway.Options.MetricTenants).
	MetricTenants int
	// MaxInFlight caps each engine's requests in flight; QueueLimit bounds
	// each engine's queue.
	MaxInFlight int
	QueueLimit  int
	// Weights are tenants' weights by configuration (without ACL tokens
	// that carry one).
	Weights map[string]float64
	// Queue is the cards' scheduler configuration.
	Queue queue.Config
	// Refresh is how often the gateway reads the cluster's view again
	// (0: the gateway's default, once a second on a client).
	Refresh time.Duration
	// Tenants resolves ACL tokens when ACLs are on (default: the
	// cluster's token table, cluster.TenantFor).
	Tenants gateway.TenantSource
	// Limits bound what slow clients hold on the gateway's port (zero:
	// gateway.ServerLimits' defaults).
	Limits gateway.ServerLimits
}

// listenGateway opens the gateway's port before the cluster starts, so
// that gossip announces the port it got (port 0 picks one).
func (a *Agent) listenGateway() error {
	ln, err := net.Listen("tcp", net.JoinHostPort(a.cfg.Bind, strconv.Itoa(a.cfg.GatewayPort)))
	if err != nil {
		return fmt.Errorf("--gateway-port: %w", err)
	}
	a.gatewayLn = ln
	a.cfg.GatewayPort = ln.Addr().(*net.TCPAddr).Port
	return nil
}

// gatewayAddr is the host:port other nodes reach this node's gateway at.
func (a *Agent) gatewayAddr() string {
	if a.cfg.Hollow {
		return "" // a hollow node serves no gateway
	}
	return net.JoinHostPort(a.cfg.Advertise, strconv.Itoa(a.cfg.GatewayPort))
}

// GatewayURL is the base URL of this node's OpenAI-compatible gateway.
func (a *Agent) GatewayURL() string {
	return a.sec.scheme() + "://" + a.gatewayAddr()
}

// startGateway serves the gateway on the port listenGateway opened.
// The residency manager does all a gateway's Residency may do.
var (
	_ gateway.Residency     = (*cardmanager.Manager)(nil)
	_ gateway.KeepAliver    = (*cardmanager.Manager)(nil)
	_ gateway.WaitExplainer = (*cardmanager.Manager)(nil)
	_ gateway.CardPromiser  = (*cardmanager.Manager)(nil)
)

func (a *Agent) startGateway(res *cardmanager.Manager) error {
	secret, err := gatewaySecret(a.cfg.DataDir)
	if err != nil {
		return err
	}
	salter, err := isolation.NewSalter(secret)
	if err != nil {
		return err
	}
	gc := a.cfg.Gateway
	opts := gateway.Options{
		Node: a.cfg.NodeName, Cluster: &gatewayView{a: a}, Salter: salter, Peers: a.sec.peerHTTP,
		IsPeer: a.isPeer, FrontKey: a.frontKey, EngineKeys: a.engineKeys, Queue: gc.Queue, MaxInFlight: gc.MaxInFlight, QueueLimit: gc.QueueLimit,
		Weights: gc.Weights, MetricTenants: gc.MetricTenants, Registerer: a.gatewayReg, Logger: a.cfg.Logger,
		Traffic: a.traffic,
	}
	if res != nil {
		opts.Residency = res
	}
	if !a.cfg.Server {
		// A client reads the state through a server: less often.
		opts.Refresh = time.Second
	}
	if gc.Refresh > 0 {
		opts.Refresh = gc.Refresh
	}
	if a.cfg.ACL {
		opts.Tenants = gc.Tenants
		if opts.Tenants == nil {
			opts.Tenants = a.cluster
		}
	}
	gw, err := gateway.New(opts)
	if err != nil {
		return err
	}
	// HTTP/1.1 for clients; HTTP/2 for nodes forwarding (the peer client
	// speaks it, over TLS or in clear).
	protocols := new(http.Protocols)
	protocols.SetHTTP1(true)
	protocols.SetHTTP2(true)
	protocols.SetUnencryptedHTTP2(true)
	// Slow clients are timed out as on the API port; other nodes'
	// forwarded requests are not bound per address (they share one).
	limits := gc.Limits
	limits.Exempt = a.isPeer
	srv := gateway.NewServer(gw, limits)
	srv.TLSConfig, srv.Protocols = a.sec.apiTLS(), protocols
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		gw.Run(ctx)
	}()
	ln := a.gatewayLn
	go func() {
		var err error
		if srv.TLSConfig != nil {
			err = srv.ServeTLS(ln, "", "")
		} else {
			err = srv.Serve(ln)
		}
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.cfg.Logger.Warn("gateway stopped", "err", err)
		}
	}()
	a.stopGateway = func() {
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		if srv.Shutdown(sctx) != nil {
			_ = srv.Close()
		}
		cancel()
		stop()
		<-done
	}
	return nil
}

// isPeer reports whether r comes from another node: a certificate signed
// by the cluster CA, or the agent token.
func (a *Agent) isPeer(r *http.Request) bool {
	if r.TLS != nil && len(r.TLS.VerifiedChains) > 0 {
		return true
	}
	scheme, secret, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return false
	}
	x, y := sha256.Sum256([]byte(strings.TrimSpace(secret))), sha256.Sum256([]byte(a.sec.agentToken))
	return subtle.ConstantTimeCompare(x[:], y[:]) == 1
}

// gatewaySecret is the node's secret for cache salts, made once and kept in
// the data dir. Salts need agree only on one node: a request is salted by
// the node that runs it on its engine.
func gatewaySecret(dir string) ([]byte, error) {
	path := filepath.Join(dir, "gateway-secret")
	if b, err := os.ReadFile(path); err == nil && len(b) >= isolation.MinSecretLen {
		return b, nil
	}
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return nil, err
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return nil, fmt.Errorf("gateway: keep its secret: %w", err)
	}
	return b, nil
}

// gatewayView is the gateway's view of the cluster: the state's
// deployments and replicas, and gossip's gateway addresses.
type gatewayView struct{ a *Agent }

func (v *gatewayView) Models(ctx context.Context) ([]gateway.Model, error) {
	var out []gateway.Model
	read := func(f *fsm.FSM) error {
		out = modelsOf(f)
		return nil
	}
	c := v.a.cluster
	if c.IsServer() {
		c.View(func(f *fsm.FSM) { _ = read(f) })
		return out, nil
	}
	return out, c.Read(ctx, true, read)
}

func (v *gatewayView) Gateway(node string) (string, bool) {
	g := v.a.cluster.Gossip()
	if g == nil {
		return "", false
	}
	m, ok := g.Member(node)
	if !ok || m.Meta.Gateway == "" || m.Status != cluster.GossipAlive {
		return "", false
	}
	return v.a.sec.scheme() + "://" + m.Meta.Gateway, true
}

// modelsOf lists the deployments and replicas of a state.
func modelsOf(f *fsm.FSM) []gateway.Model {
	var out []gateway.Model
	for _, d := range f.Models() {
		spec := d.GetSpec()
		m := gateway.Model{Deployment: d.GetName(), Served: spec.GetServedModelName(), Class: wireenum.Class(spec.GetPriority()),
			Aliases: spec.GetAliases(), EngineModel: engine.EngineModel(spec), AdapterIDs: engine.LlamaAdapterIDs(spec), MaxModelLen: maxModelLenOf(spec.GetEngine()), Task: taskOf(spec.GetEngine()),
			Created: d.GetCreatedUnix()}
		if ads := spec.GetAdapters(); len(ads) > 0 {
			m.Adapters = make(map[string][]string, len(ads))
			for _, a := range ads {
				m.Adapters[a.GetName()] = a.GetTenants()
			}
		}
		if m.Served == "" {
			m.Served = d.GetName()
		}
		res := spec.GetResidency()
		fronted := res == pb.Residency_RESIDENCY_WARM || res == pb.Residency_RESIDENCY_ON_DEMAND
		for _, r := range f.Replicas(d.GetName(), "") {
			if r.GetNode() == "" || len(r.GetCards()) == 0 {
				continue
			}
			running := r.GetState() == pb.ReplicaState_REPLICA_STATE_RUNNING
			rp := gateway.Replica{Deployment: d.GetName(), Index: r.GetIndex(), Node: r.GetNode(), Card: r.GetCards()[0],
				Endpoint: r.GetEndpoint(), Kind: engine.ControlKind(spec.GetEngine()), Running: running,
				Fronted: fronted && len(r.GetCards()) == 1, KVTokens: kvTokensOf(spec.GetEngine()),
				PriorityScheduling: priorityScheduling(spec.GetEngine()), Slots: slotsOf(spec.GetEngine()),
				MaxInFlight: maxInFlightOf(spec.GetEngine())}
			rp.Resident = running
			if r.GetState() == pb.ReplicaState_REPLICA_STATE_FAILED && !rp.Fronted {
				rp.Failed = r.GetReason()
			}
			if rp.Fronted {
				rp.Resident = r.GetResidency() == pb.ReplicaResidency_REPLICA_RESIDENCY_RESIDENT
			}
			m.Replicas = append(m.Replicas, rp)
		}
		out = append(out, m)
	}
	return out
}

// kvTokensOf is an engine's KV budget in tokens where its arguments say it:
// a sim engine's --kv-pool-mib over its --kv-kib-per-token. Other engines
// size their pool from the model, which gpuplane does not read: 0
// (unknown), and the gateway's flat in-flight cap alone holds.
func kvTokensOf(e *pb.EngineSpec) int {
	if e.GetKind() != engines.Sim {
		return 0
	}
	pool, perToken := argUint(e.GetArgs(), "--kv-pool-mib"), argUint(e.GetArgs(), "--kv-kib-per-token")
	if pool == 0 || perToken == 0 {
		return 0
	}
	return int(min(pool*1024/perToken, 1<<30))
}

// priorityScheduling: the engine orders requests by their `priority` field
// (vLLM, or sim, started with --scheduling-policy priority); without the
// flag vLLM refuses a non-zero priority, so the gateway sends none.
func priorityScheduling(e *pb.EngineSpec) bool {
	if r, err := engines.Lookup(e.GetKind()); err != nil || !r.VLLMArgs {
		return false
	}
	return argValue(e.GetArgs(), "--scheduling-policy") == "priority"
}

// maxInFlightOf is how many requests an engine runs at once: the
// deployment's spec.engine.maxInFlight where set, else where the
// arguments or environment of the engine whose API it speaks say it (the
// table's ConcurrencyFlag and ConcurrencyEnv: vLLM's and sim's
// --max-num-seqs, llama.cpp's slots, Ollama's OLLAMA_NUM_PARALLEL, 1
// unless set). A sim with a dialect is read as the engine it speaks, as
// slotsOf reads it. 0: unknown (vLLM sizes its default from the card; a
// command engine's is its own), and the gateway's default cap holds.
func maxInFlightOf(e *pb.EngineSpec) int {
	if n := e.GetMaxInFlight(); n > 0 {
		return int(n)
	}
	if n := slotsOf(e); n > 0 {
		// llama.cpp, or a sim speaking it: its slots.
		return n
	}
	r, _ := engines.Speaks(e)
	return r.MaxInFlight(e)
}

// slotsOf is the slot count of an engine that runs each request in a slot
// (the table's Slots: llama.cpp, engine.LlamaSlots: its --parallel, else
// llama-server's auto 4), also for a sim speaking llama.cpp; 0 for other
// kinds.
func slotsOf(e *pb.EngineSpec) int {
	if r, _ := engines.Speaks(e); !r.Slots {
		return 0
	}
	return engine.LlamaSlots(e)
}

// maxModelLenOf is the context length of one request to an engine: its
// spec's maxModelLen unless its arguments set another (they come after it
// on the command line, so they win); a llama.cpp context (-c) is shared by
// its slots. 0: unknown.
func maxModelLenOf(e *pb.EngineSpec) int {
	n := uint64(e.GetMaxModelLen())
	r, _ := engines.Lookup(e.GetKind())
	switch {
	case r.VLLMArgs:
		if v := argUint(e.GetArgs(), "--max-model-len"); v > 0 {
			n = v
		}
	case r.Slots:
		// The driver sizes -c from maxModelLen so that each slot holds it;
		// a -c of the deployment's own (flag or LLAMA_ARG_CTX_SIZE) is
		// split between explicit slots (auto slots share one unified
		// cache, where one request may use all of it).
		if v := engine.LlamaContext(e); v > 0 {
			n = uint64(v)
		}
	}
	return int(min(n, 1<<31))
}

// taskOf is what an engine answers where its arguments say it: vLLM (and
// sim) with --runner pooling (or the older --task embed) embed only, with
// --runner generate generate only; llama.cpp embeds only with
// --embedding(s), else generates only. Others (and vLLM deciding by the
// model's architecture): any, and the engine refuses what it cannot do.
func taskOf(e *pb.EngineSpec) gateway.Task {
	args := e.GetArgs()
	r, _ := engines.Lookup(e.GetKind())
	switch {
	case r.VLLMArgs:
		switch argValue(args, "--runner") {
		case "pooling":
			return gateway.TaskEmbed
		case "generate":
			return gateway.TaskGenerate
		}
		switch argValue(args, "--task") {
		case "embed", "embedding":
			return gateway.TaskEmbed
		case "generate":
			return gateway.TaskGenerate
		}
	case r.Slots:
		if slices.Contains(args, "--embedding") || slices.Contains(args, "--embeddings") {
			return gateway.TaskEmbed
		}
		return gateway.TaskGenerate
	}
	return gateway.TaskAny
}

// argUint is the value of flag in args (--flag N or --flag=N), 0 if absent
// or not a number.
func argUint(args []string, flag string) uint64 {
	n, _ := strconv.ParseUint(argValue(args, flag), 10, 64)
	return n
}

// argValue is the value of flag in args (--flag V or --flag=V), "" if
// absent.
func argValue(args []string, flag string) string { return engines.ArgValue(args, flag) }

// trafficSource serves the gateway's request record in the wire's shapes.
// Tenant names stay on the node: each answer names them t1, t2, ... in
// the order first seen.
type trafficSource struct{ l *traffic.Log }

func (t trafficSource) Requests(card *uint32, since time.Time) []*pb.RequestRecord {
	cards := t.l.Cards()
	if card != nil {
		cards = []uint32{*card}
	}
	var out []*pb.RequestRecord
	pseudonym := map[string]string{}
	for _, c := range cards {
		for _, r := range t.l.Since(c, since) {
			p, ok := pseudonym[r.Tenant]
			if !ok {
				p = fmt.Sprintf("t%d", len(pseudonym)+1)
				pseudonym[r.Tenant] = p
			}
			out = append(out, &pb.RequestRecord{
				Card: c, Arrived: timestamppb.New(r.Arrived), Deployment: r.Deployment, Replica: r.Replica,
				Adapter: r.Adapter, Tenant: p, Class: r.Class, PromptTokens: int64(r.PromptTokens),
				OutputTokens: int64(r.OutputTokens), TtftSeconds: r.TTFT.Seconds(), Outcome: r.Outcome.String(),
			})
		}
	}
	return out
}
