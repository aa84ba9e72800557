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
	"strconv"
	"strings"
	"time"

	"github.com/gpuplane/gpuplane/cluster"
	"github.com/gpuplane/gpuplane/fsm"
	"github.com/gpuplane/gpuplane/node/cardmanager"
	"github.com/gpuplane/gpuplane/node/gateway"
	"github.com/gpuplane/gpuplane/node/gateway/isolation"
	"github.com/gpuplane/gpuplane/node/gateway/queue"
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
	_ gateway.Residency        = (*cardmanager.Manager)(nil)
	_ gateway.KeepAliver       = (*cardmanager.Manager)(nil)
	_ gateway.WaitExplainer    = (*cardmanager.Manager)(nil)
	_ gateway.CardPromiser     = (*cardmanager.Manager)(nil)
	_ gateway.BestEffortTeller = (*cardmanager.Manager)(nil)
	_ gateway.YieldTeller      = (*cardmanager.Manager)(nil)
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

// modelsOf lists the deployments of a state and their placed replicas as
// the gateway serves them (gateway.ModelOf).
func modelsOf(f *fsm.FSM) []gateway.Model {
	var out []gateway.Model
	for _, d := range f.Models() {
		out = append(out, gateway.ModelOf(d, f.Replicas(d.GetName(), "")))
	}
	return out
}
