// Package agent wires one gpuplane node together: inventory, cluster (Raft on
// servers, gossip on every node), and the API server. It is the composition root the `gpuplane agent` command
// runs and the in-process tests start; it holds no logic of its own beyond
// the order things start and stop in.
package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"github.com/cenkalti/backoff/v5"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	"github.com/gpuplane/gpuplane/cluster"
	"github.com/gpuplane/gpuplane/cluster/scheduler"
	"github.com/gpuplane/gpuplane/fsm"
	"github.com/gpuplane/gpuplane/node/cardmanager"
	"github.com/gpuplane/gpuplane/node/engine"
	"github.com/gpuplane/gpuplane/node/inventory"
	"github.com/gpuplane/gpuplane/node/residency"
	"github.com/gpuplane/gpuplane/node/residency/residencypb"
	"github.com/gpuplane/gpuplane/node/traffic"
	"github.com/gpuplane/gpuplane/node/watchdog"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
	"github.com/gpuplane/gpuplane/rpc"
)

// Config is everything `gpuplane agent` accepts.
type Config struct {
	Dev             bool
	Server          bool
	BootstrapExpect int
	Join            []string
	DataDir         string
	NodeName        string
	// Bind is the address every listener binds; Advertise is the address
	// other nodes reach this one at (defaults to Bind, or 127.0.0.1 when Bind
	// is a wildcard).
	Bind       string
	Advertise  string
	Labels     map[string]string
	APIPort    int
	RaftPort   int
	GossipPort int
	// GatewayPort serves the OpenAI-compatible gateway (docs/gateway.md) on
	// Bind; 0 picks a free port. Gateway tunes it.
	GatewayPort int
	Gateway     GatewayConfig
	SimGPUs     string
	// SchedulerPolicy names the placement policy (default: the scheduler's).
	SchedulerPolicy string
	// Enforce is how engines are held to their shares beyond their own
	// flags: auto, mps, hami or none; HAMiLib is HAMi-core's libvgpu.so.
	Enforce string
	HAMiLib string
	// Residency is the node's residency controller mode: auto (default) or
	// advise (docs/operations.md).
	Residency string
	// NoBestEffort turns off the residency controllers' protected set
	// (residency.Config.BestEffort; `gpuplane agent --best-effort=false`):
	// by default, a card that cannot hold every model with demand
	// protects the largest set it can hold and serves the others
	// best-effort (docs/residency.md, "Best effort").
	NoBestEffort bool
	// OrphanGrace is how long engines outlive the agent when it dies
	// without stopping them (default executor.DefaultOrphanGrace).
	OrphanGrace time.Duration
	// StartStall is how long a starting engine may show no progress
	// before it is declared stuck (default
	// executor.DefaultStartStallTimeout).
	StartStall time.Duration
	Version    string

	// SecurityConfig: TLS, gossip encryption and ACLs (security.go).
	SecurityConfig

	// Out receives the few lines the agent prints for its user.
	Out    io.Writer
	Logger *slog.Logger

	// Recover sets a server's damaged Raft data aside and rejoins with an
	// empty log (cluster.Config.Recover).
	Recover bool

	// RequestWindow is how long, in log time, request ids are remembered
	// (cluster.Config.RequestWindow); 0: a day.
	RequestWindow time.Duration

	// Hollow makes a client node whose engines are hollow (executor.Hollow:
	// replicas placed on it report Running at once, no process), without
	// the gateway or the residency manager, so that one process can run
	// many client nodes against real servers (`gpuplane agent --hollow N`,
	// bench/fleet). Its gossip, event stream, reports and API are real.
	Hollow bool

	// ResidencyTimeScale, for dev agents only, runs the residency
	// controllers' clock and ticks this many times faster than the wall
	// clock (cardmanager.Options.TimeScale): `gpuplane bench interference`
	// sets it to its --time-scale, so that the controllers' windows scale
	// with its engines' figures. 0 or 1: the wall clock. The decision
	// times a scaled agent records run ahead of the wall clock.
	ResidencyTimeScale float64
}

// Agent is a running node.
type Agent struct {
	cfg     Config
	cluster *cluster.Cluster
	api     *rpc.Server
	served  chan error
	tempDir string
	// stopLoops ends the background loops (the leader's placer, the
	// registration of a non-dev node).
	stopLoops context.CancelFunc
	loopCtx   context.Context
	loops     sync.WaitGroup

	selfMu sync.Mutex
	self   *pb.Node
	// registered is closed once the node's registration is in the log.
	registered chan struct{}
	// sec is the loaded SecurityConfig.
	sec security
	// stopExecutor stops the engines of this node (see executor.go).
	stopExecutor func()
	// residencyJournal is what the node's residency manager publishes for
	// the API: decisions, plans and profiles.
	residencyJournal *residency.Journal
	// traffic is the gateway's per-card request record (node/traffic),
	// read through ResidencyService.ListRequests.
	traffic *traffic.Log
	// resident is the node's residency manager (nil before the executor
	// starts).
	resident *cardmanager.Manager
	// engines lists the node's running engines, for /metrics' reading of
	// the engines' own gauges (nil before the executor starts).
	engines atomic.Pointer[func() []watchdog.Engine]
	// metricsReg is /metrics' registry; gatewayReg holds the gateway's
	// series, served on /metrics too, and read apart by the dashboard's
	// summary (which then gathers only those).
	metricsReg, gatewayReg *prometheus.Registry
	// gatewayLn is the gateway's port, opened before the cluster starts;
	// stopGateway stops the gateway.
	gatewayLn   net.Listener
	stopGateway func()
	// frontKey is what the gateway shows the node's replica fronts, with
	// ACLs on (cardmanager.Options.FrontKey); empty without.
	frontKey string
	// engineKeys give the node's engines their API keys (engine.Keys),
	// from a secret in the data directory.
	engineKeys *engine.Keys
}

// Start brings a node up: it reads the inventory, opens the Raft log (on a
// server), serves the API, starts gossip (joining --join in the background)
// and registers the node through the log. A --dev node returns once it is
// registered; any other node registers in the background, since its cluster
// may not have formed yet (Registered says when it is done).
func Start(ctx context.Context, cfg Config) (*Agent, error) {
	if cfg.Out == nil {
		cfg.Out = io.Discard
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	a := &Agent{cfg: cfg, served: make(chan error, 1), registered: make(chan struct{}), traffic: traffic.NewLog(0)}
	if err := a.resolveConfig(); err != nil {
		return nil, err
	}
	a.residencyJournal = residency.NewJournal(a.cfg.NodeName, 0)
	var err error
	if a.sec, err = loadSecurity(a.cfg.SecurityConfig, a.cfg.NodeName); err != nil {
		return nil, err
	}
	if err := a.createInventory(); err != nil {
		return nil, err
	}
	if !a.cfg.Hollow {
		if err := a.listenGateway(); err != nil {
			return nil, err
		}
	}
	if err := a.startCluster(); err != nil {
		a.cleanup()
		return nil, err
	}
	if err := a.startAPI(); err != nil {
		a.cleanup()
		return nil, err
	}
	if err := a.startGossip(); err != nil {
		a.Close()
		return nil, err
	}
	if err := a.startExecutor(); err != nil {
		a.Close()
		return nil, err
	}
	if !a.cfg.Hollow {
		if err := a.startGateway(a.resident); err != nil {
			a.Close()
			return nil, err
		}
	}
	if cfg.Dev {
		if err := a.register(ctx); err != nil {
			a.Close()
			return nil, err
		}
		close(a.registered)
	} else {
		a.loops.Go(a.registerLoop)
	}
	raft := "none: client node"
	if a.cfg.Server {
		raft = a.raftAddr(a.cfg.Advertise)
	}
	fmt.Fprintf(a.cfg.Out, "gpuplane agent (version %s): %s node %q serving the API at %s and the OpenAI-compatible gateway at %s/v1 (raft %s, gossip %s, data dir %s)\n",
		cfg.Version, a.role(), a.cfg.NodeName, a.APIURL(), a.GatewayURL(), raft, a.cluster.Gossip().Addr(), a.cfg.DataDir)
	return a, nil
}

func (a *Agent) resolveConfig() error {
	c := &a.cfg
	if c.Dev {
		c.Server = true
		if c.DataDir == "" {
			dir, err := os.MkdirTemp("", "gpuplane-dev-")
			if err != nil {
				return fmt.Errorf("create dev data dir: %w", err)
			}
			c.DataDir, a.tempDir = dir, dir
		}
	}
	if c.DataDir == "" {
		return errors.New("--data-dir is required (or use --dev)")
	}
	if err := os.MkdirAll(c.DataDir, 0o700); err != nil {
		return fmt.Errorf("create data dir: %w", err)
	}
	if c.NodeName == "" {
		h, err := os.Hostname()
		if err != nil || h == "" {
			h = "gpuplane"
		}
		c.NodeName = h
	}
	if c.Bind == "" {
		c.Bind = "127.0.0.1"
		if !c.Dev {
			c.Bind = "0.0.0.0"
		}
	}
	if c.Advertise == "" {
		c.Advertise = c.Bind
		if ip := net.ParseIP(c.Bind); ip != nil && ip.IsUnspecified() {
			c.Advertise = "127.0.0.1"
		}
	}
	if c.BootstrapExpect > 0 && !c.Server {
		return errors.New("--bootstrap-expect is for servers: add --server")
	}
	if c.Hollow && (c.Server || c.Dev) {
		return errors.New("--hollow runs client nodes: drop --server and --dev")
	}
	if c.Recover && (!c.Server || c.Dev) {
		return errors.New("--recover is for a server of a cluster whose other servers hold the log (not --dev, not a client): add --server, or drop --recover")
	}
	return nil
}

func (a *Agent) role() string {
	if a.cfg.Server {
		return cluster.RoleServer
	}
	return cluster.RoleClient
}

// HollowGPUs is the simulated inventory of a hollow node given no
// --sim-gpus: a full 8-card machine, as the fleet benchmark (bench/fleet) measures.
const HollowGPUs = "h100=8"

func (a *Agent) createInventory() error {
	if a.cfg.Hollow && a.cfg.SimGPUs == "" {
		a.cfg.SimGPUs = HollowGPUs
	}
	res, err := inventory.Detect(inventory.Options{NodeName: a.cfg.NodeName, SimSpec: a.cfg.SimGPUs, Dev: a.cfg.Dev, Server: a.cfg.Server})
	if err != nil {
		return err
	}
	fmt.Fprintln(a.cfg.Out, res.Message)
	role := pb.NodeRole_NODE_ROLE_CLIENT
	if a.cfg.Server {
		role = pb.NodeRole_NODE_ROLE_SERVER
	}
	a.self = &pb.Node{
		Name:      a.cfg.NodeName,
		Address:   net.JoinHostPort(a.cfg.Advertise, strconv.Itoa(a.cfg.APIPort)),
		Role:      role,
		Status:    pb.NodeStatus_NODE_STATUS_ALIVE,
		Labels:    a.cfg.Labels,
		Cards:     res.Cards,
		Simulated: res.Simulated,
		// The host's capacity bounds replicas' resources requests.
		CpuMilli:  uint32(runtime.NumCPU() * 1000),
		MemoryMib: hostMemoryMiB(),
		Version:   a.cfg.Version,
	}
	return nil
}

func (a *Agent) raftAddr(host string) string {
	return net.JoinHostPort(host, strconv.Itoa(a.cfg.RaftPort))
}

func (a *Agent) startCluster() error {
	if !a.cfg.Hollow {
		// Before Raft starts, so that its first measurements count. Not in
		// a hollow process: its nodes' memberlists would all count into
		// the one process-wide series, meaningless per node, at the cost
		// of a sample per packet and gossip round of each.
		libraryMetrics()
	}
	fw := &rpc.Forwarder{HTTP: a.sec.peerHTTP}
	c, err := cluster.New(cluster.Config{
		NodeName:        a.cfg.NodeName,
		DataDir:         a.cfg.DataDir,
		RaftBind:        a.raftAddr(a.cfg.Bind),
		RaftAdvertise:   a.raftAddr(a.cfg.Advertise),
		Server:          a.cfg.Server,
		Bootstrap:       a.cfg.Dev,
		BootstrapExpect: a.cfg.BootstrapExpect,
		Recover:         a.cfg.Recover,
		RequestWindow:   a.cfg.RequestWindow,
		Join:            a.cfg.Join,
		GossipBind:      net.JoinHostPort(a.cfg.Bind, strconv.Itoa(a.cfg.GossipPort)),
		GossipAdvertise: net.JoinHostPort(a.cfg.Advertise, strconv.Itoa(a.cfg.GossipPort)),
		Gateway:         a.gatewayAddr(),
		Digest:          inventory.Digest,
		Logger:          a.cfg.Logger,
		TLS:             a.sec.tls,
		GossipKey:       a.sec.gossipKey,
	})
	if err != nil {
		return fmt.Errorf("start cluster: %w", err)
	}
	fw.Resolve = c.APIAddress
	c.SetForwarder(fw)
	loopCtx, stop := context.WithCancel(context.Background())
	a.stopLoops = stop
	a.loopCtx = loopCtx
	if a.cfg.Server {
		placer := cluster.NewPlacer(c, scheduler.Policy(a.cfg.SchedulerPolicy), a.cfg.Logger)
		a.loops.Go(func() { placer.Run(loopCtx) })
	}
	a.cluster = c
	return nil
}

func (a *Agent) startAPI() error {
	metrics := a.metricsHandler() // makes a.metricsReg and a.gatewayReg
	srv, err := rpc.Listen(net.JoinHostPort(a.cfg.Bind, strconv.Itoa(a.cfg.APIPort)), rpc.Config{
		Backend:    a.cluster,
		Logger:     a.cfg.Logger,
		ACL:        a.cfg.ACL,
		AgentToken: a.sec.agentToken,
		TLS:        a.sec.apiTLS(),
		PeerHTTP:   a.sec.peerHTTP,
		NodeName:   a.cfg.NodeName,
		ReadLogs:   a.readLogs,
		Residency:  a.rpcJournal(),
		Traffic:    a.traffic,
		Metrics:    metrics,
		Gatherer:   a.gatewayReg,
		Outer:      []connect.Interceptor{newAPIMetrics(a.metricsReg)},
	})
	if err != nil {
		return fmt.Errorf("serve API: %w", err)
	}
	a.api = srv
	if a.cfg.APIPort == 0 {
		// Port 0 picks a free port; advertise the one we got.
		a.cfg.APIPort = srv.Addr().(*net.TCPAddr).Port
		a.selfMu.Lock()
		a.self.Address = net.JoinHostPort(a.cfg.Advertise, strconv.Itoa(a.cfg.APIPort))
		a.selfMu.Unlock()
	}
	go func() { a.served <- srv.Serve() }()
	return nil
}

// startGossip starts memberlist, announcing this node, and records the
// gossip address it got (port 0 picks one).
func (a *Agent) startGossip() error {
	if err := a.cluster.StartGossip(a.localNode); err != nil {
		return fmt.Errorf("start gossip: %w", err)
	}
	a.selfMu.Lock()
	a.self.GossipAddress = a.cluster.Gossip().Addr()
	a.selfMu.Unlock()
	return nil
}

// localNode is this node as it registers itself (a copy).
func (a *Agent) localNode() *pb.Node {
	a.selfMu.Lock()
	defer a.selfMu.Unlock()
	return proto.Clone(a.self).(*pb.Node)
}

// registerLoop registers the node, retrying until it succeeds or the agent
// stops: on first start the cluster may still be forming.
func (a *Agent) registerLoop() {
	// Each attempt already waits up to 30 s for a leader, so a constant
	// second between attempts is enough; only the agent's stop ends them.
	_, err := backoff.Retry(a.loopCtx, func() (struct{}, error) { return struct{}{}, a.register(a.loopCtx) },
		backoff.WithBackOff(backoff.NewConstantBackOff(time.Second)), backoff.WithMaxElapsedTime(0),
		backoff.WithNotify(func(err error, _ time.Duration) { a.cfg.Logger.Info("register node: retrying", "err", err) }))
	if err == nil {
		close(a.registered)
	}
}

// Registered is closed once the node's registration is in the log.
func (a *Agent) Registered() <-chan struct{} { return a.registered }

// register records this node and its inventory in the log, unless the log
// already says exactly that (a restart with the same cards adds no entry).
func (a *Agent) register(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := a.cluster.WaitForLeader(ctx); err != nil {
		return fmt.Errorf("wait for a leader: %w", err)
	}
	// On a server, check against state that holds every committed entry:
	// right after a restart the log is still being re-applied, and a check
	// against a partial state would append a registration that changes
	// nothing. A client holds no state to catch up (its Read would fetch
	// the whole state from a server, which a fleet registering at once
	// turns into O(nodes²) bytes); its proposal is checked by the leader.
	if a.cfg.Server {
		if err := a.cluster.Read(ctx, false, func(*fsm.FSM) error { return nil }); err != nil {
			return fmt.Errorf("catch up with the log: %w", err)
		}
	}
	env := &pb.Envelope{Actor: "node/" + a.cfg.NodeName, Command: &pb.Envelope_RegisterNode{RegisterNode: &pb.RegisterNode{Node: a.localNode()}}}
	for {
		res, err := a.cluster.Propose(ctx, env)
		if err == nil && res.GetCode() != pb.Code_CODE_OK {
			return fmt.Errorf("register node %q: %s", a.cfg.NodeName, res.GetMessage())
		}
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("register node %q: %w", a.cfg.NodeName, err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// APIURL is the base URL of this node's API.
func (a *Agent) APIURL() string {
	return a.sec.scheme() + "://" + net.JoinHostPort(a.cfg.Advertise, strconv.Itoa(a.cfg.APIPort))
}

// Cluster exposes the node's cluster handle (for tests and benchmarks).
func (a *Agent) Cluster() *cluster.Cluster { return a.cluster }

// DataDir is where the node keeps its state.
func (a *Agent) DataDir() string { return a.cfg.DataDir }

// Wait blocks until ctx ends, the node has left the cluster (`cluster
// leave`), or the API server fails.
func (a *Agent) Wait(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return nil
	case <-a.cluster.Left():
		return nil
	case err := <-a.served:
		return err
	}
}

// Name is the node's name.
func (a *Agent) Name() string { return a.cfg.NodeName }

// ResidencyJournal is what this node's residency manager publishes and the
// API serves (ResidencyService).
func (a *Agent) ResidencyJournal() *residency.Journal { return a.residencyJournal }

// rpcJournal is the journal as ResidencyService reads it (nil when the node
// keeps none, so the service answers with nothing for this node).
func (a *Agent) rpcJournal() rpc.ResidencyJournal {
	if a.residencyJournal == nil {
		return nil
	}
	return residencypb.Journal{J: a.residencyJournal}
}

// GossipAddr is the gossip address other nodes join.
func (a *Agent) GossipAddr() string { return a.cluster.Gossip().Addr() }

// Close stops the API, then Raft. A --dev data dir created by Start is kept
// only when it was given explicitly.
func (a *Agent) Close() error {
	var errs []error
	if a.api != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		errs = append(errs, a.api.Shutdown(ctx))
		cancel()
	}
	a.cleanup()
	return errors.Join(errs...)
}

func (a *Agent) cleanup() {
	if a.stopGateway != nil {
		a.stopGateway()
		a.stopGateway = nil
	} else if a.gatewayLn != nil {
		_ = a.gatewayLn.Close()
	}
	a.gatewayLn = nil
	// Engines stop first, while the log can still record that they stopped.
	if a.stopExecutor != nil {
		a.stopExecutor()
		a.stopExecutor = nil
	}
	if a.stopLoops != nil {
		a.stopLoops()
		a.loops.Wait()
		a.stopLoops = nil
	}
	if a.cluster != nil {
		if err := a.cluster.Shutdown(); err != nil {
			a.cfg.Logger.Warn("shut down cluster", "err", err)
		}
		a.cluster = nil
	}
	if a.tempDir != "" {
		os.RemoveAll(a.tempDir)
		a.tempDir = ""
	}
}

// hostMemoryMiB is the machine's memory from /proc/meminfo (0, meaning not
// limited, where it cannot be read).
func hostMemoryMiB() uint64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
			kib, _ := strconv.ParseUint(f[1], 10, 64)
			return kib / 1024
		}
	}
	return 0
}
