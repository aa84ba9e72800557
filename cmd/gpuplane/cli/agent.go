package cli

import (
	"fmt"
	"log/slog"
	"sort"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/gpuplane/gpuplane/cmd/gpuplane/agent"
	"github.com/gpuplane/gpuplane/fsm"
	"github.com/gpuplane/gpuplane/node/executor"
	"github.com/gpuplane/gpuplane/node/gateway"
)

// newAgentCommand is `gpuplane agent`: it runs a node until interrupted.
func newAgentCommand(g *globals) *cobra.Command {
	var cfg agent.Config
	var join, labels, logLevel string
	var hollow int
	var hollowRate float64
	bestEffort := true
	cmd := &cobra.Command{
		Use:   "agent",
		Short: "Run a gpuplane node",
		Long: `Run a gpuplane node. --dev starts a single-node server that bootstraps itself,
keeps its data in a fresh temporary directory (unless --data-dir) and simulates
l4=2 cards when no NVIDIA driver is found. Every flag can also be set with
GPUPLANE_<FLAG>, e.g. GPUPLANE_DATA_DIR.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := flagsFromEnv(cmd.Flags(), g.getenv); err != nil {
				return usageErrorf(cmd, "%v", err)
			}
			var err error
			if cfg.Labels, err = parseLabels(labels); err != nil {
				return usageErrorf(cmd, "--labels: %v", err)
			}
			if join != "" {
				cfg.Join = strings.Split(join, ",")
			}
			if cfg.Gateway.MetricTenants < 1 {
				return usageErrorf(cmd, "--gateway-metric-tenants is %d: it must be at least 1", cfg.Gateway.MetricTenants)
			}
			var level slog.Level
			if err := level.UnmarshalText([]byte(logLevel)); err != nil {
				return usageErrorf(cmd, "--log-level: %v", err)
			}
			cfg.NoBestEffort = !bestEffort
			cfg.Out = g.stdout
			cfg.Logger = slog.New(slog.NewTextHandler(g.stderr, &slog.HandlerOptions{Level: level}))
			cfg.Version = version
			ctx := cmd.Context()
			if cmd.Flags().Changed("hollow") {
				return runHollow(cmd, g, cfg, hollow, hollowRate)
			}
			a, err := agent.Start(ctx, cfg)
			if err != nil {
				return err
			}
			if cfg.Dev {
				fmt.Fprintln(g.stdout, "dev mode: single-node server, data removed on exit unless --data-dir was given")
			}
			fmt.Fprintln(g.stdout, a.SecuritySummary())
			err = a.Wait(ctx)
			fmt.Fprintln(g.stdout, "shutting down")
			return joinErr(err, a.Close())
		},
	}
	f := cmd.Flags()
	f.BoolVar(&cfg.Dev, "dev", false, "single-node server that bootstraps itself, with simulated cards when there is no NVIDIA driver")
	f.BoolVar(&cfg.Server, "server", false, "vote in Raft")
	f.IntVar(&cfg.BootstrapExpect, "bootstrap-expect", 0, "servers to wait for before forming the cluster")
	f.BoolVar(&cfg.Recover, "recover", false, "set this server's damaged Raft log aside (raft.damaged-<time> in the data dir) and rejoin, receiving the log from the other servers")
	f.DurationVar(&cfg.RequestWindow, "request-window", fsm.DefaultRequestWindow, "how long, in log time, a request id is remembered so that a retry is not applied twice (servers; recorded in the log: give every server the same value)")
	f.StringVar(&join, "join", "", "gossip addresses to join, comma-separated")
	f.StringVar(&cfg.DataDir, "data-dir", "", "Raft log, snapshots, node id and engine logs")
	f.StringVar(&cfg.NodeName, "node-name", "", "node name (default: the host name)")
	f.StringVar(&cfg.Bind, "bind", "", "address to listen on (default 127.0.0.1 with --dev, else 0.0.0.0)")
	f.StringVar(&cfg.Advertise, "advertise", "", "address other nodes reach this one at")
	f.StringVar(&labels, "labels", "", "node labels, k=v,...")
	f.IntVar(&cfg.APIPort, "api-port", 7410, "port of the API (Connect RPC, /healthz)")
	f.IntVar(&cfg.RaftPort, "raft-port", 7411, "port of Raft")
	f.IntVar(&cfg.GossipPort, "gossip-port", 7412, "port of gossip")
	f.IntVar(&cfg.GatewayPort, "gateway-port", 7420, "port of the OpenAI-compatible gateway (/v1/chat/completions, /v1/completions, /v1/embeddings, /v1/models), on --bind")
	f.IntVar(&cfg.Gateway.MetricTenants, "gateway-metric-tenants", gateway.DefaultMetricTenants, "without --acl, the most tenants (X-Gpuplane-Tenant values) the gateway's metrics name: the first ones seen; later ones are counted as tenant \"other\" (with --acl, each token's tenant is named)")
	f.StringVar(&cfg.SimGPUs, "sim-gpus", "", "simulate cards instead of NVML, e.g. l4=2,h100=1")
	f.StringVar(&cfg.Enforce, "enforce", "auto", "hard limits on engines' shares: auto, mps, hami or none")
	f.StringVar(&cfg.Residency, "residency", "auto", "the node's residency controller: auto (it loads, sleeps and evicts warm and onDemand models) or advise (it records what it would do and changes nothing)")
	f.BoolVar(&bestEffort, "best-effort", true, "when a card cannot hold every model with demand, protect the largest set it can hold (reserved models first, then by class, then value per GiB) and serve the others best-effort, with bounded turns (residency plan names them and why); false: every model competes for the card by value")
	f.DurationVar(&cfg.OrphanGrace, "orphan-grace", executor.DefaultOrphanGrace, "how long this node's engines outlive the agent when it dies (kill -9, a crash): an agent restarted sooner adopts them, later they are stopped")
	f.DurationVar(&cfg.StartStall, "start-stall-timeout", executor.DefaultStartStallTimeout, "how long a starting engine may show no progress (no change in its health check, no log output, no growth of its GPU or host memory) before it is declared stuck and stopped, before its start timeout")
	f.StringVar(&cfg.HAMiLib, "hami-lib", "", "path of HAMi-core's libvgpu.so, for --enforce hami (or auto)")
	f.StringVar(&logLevel, "log-level", "warn", "log level: debug, info, warn, error")
	f.StringVar(&cfg.TLSCert, "tls-cert", "", "this node's PEM certificate (gpuplane tls create-cert): TLS for the API, Raft and calls between nodes")
	f.StringVar(&cfg.TLSKey, "tls-key", "", "the key of --tls-cert")
	f.StringVar(&cfg.TLSCA, "tls-ca", "", "the cluster's CA certificate (gpuplane tls create-ca)")
	f.StringVar(&cfg.Encrypt, "encrypt", "", "gossip encryption key, base64 (gpuplane keygen); the same on every node")
	f.BoolVar(&cfg.ACL, "acl", false, "require tokens with roles on the API (gpuplane acl bootstrap)")
	f.IntVar(&hollow, "hollow", 0, "run this many hollow client nodes in this process (for load tests: real gossip, event streams and reports, engines that report Running and start no process); names <node-name>-NNNN, data dirs under --data-dir, ports --api-port+i and --gossip-port+i when given, else free ones")
	f.Float64Var(&hollowRate, "hollow-rate", 10, "with --hollow: nodes started per second (each new gossip member costs every member its broadcasts: a fleet joining at once can keep its members too busy to answer probes); 0: all at once")
	f.StringVar(&cfg.AgentToken, "agent-token", "", "secret nodes present to each other with --acl and no TLS; the same on every node")
	return cmd
}

// flagsFromEnv sets every flag not given on the command line from
// GPUPLANE_<FLAG> (dashes become underscores), as docs/operations.md promises.
func flagsFromEnv(fs *pflag.FlagSet, getenv func(string) string) error {
	var errs []string
	fs.VisitAll(func(fl *pflag.Flag) {
		if fl.Changed {
			return
		}
		key := "GPUPLANE_" + strings.ToUpper(strings.ReplaceAll(fl.Name, "-", "_"))
		if v := getenv(key); v != "" {
			if err := fs.Set(fl.Name, v); err != nil {
				errs = append(errs, fmt.Sprintf("%s=%q: %v", key, v, err))
			}
		}
	})
	if len(errs) > 0 {
		sort.Strings(errs)
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return nil
}

func parseLabels(s string) (map[string]string, error) {
	if s == "" {
		return nil, nil
	}
	out := map[string]string{}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("%q is not k=v", kv)
		}
		out[k] = v
	}
	return out, nil
}

func joinErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}
