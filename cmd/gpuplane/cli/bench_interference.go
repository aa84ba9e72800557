package cli

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpuplane/gpuplane/cmd/gpuplane/interference"
	"github.com/gpuplane/gpuplane/node/servesim"
)

// benchTransport, when set, carries the bench's requests (a test plants
// isolation faults in it); nil: the default transport.
var benchTransport http.RoundTripper

// benchFlags are bench interference's flags: the library's options and
// what the command reads before calling it.
type benchFlags struct {
	interference.Options
	configPath, htmlPath, mixes, models, variants string
}

func newBenchCommand(g *globals) *cobra.Command {
	return newGroupCommand("bench", "Measure gpuplane on a real agent and engines", nil, newBenchInterferenceCommand(g))
}

func newBenchInterferenceCommand(g *globals) *cobra.Command {
	var o benchFlags
	c := &cobra.Command{
		Use:   "interference --config FILE [--models a,b] [--mix short,long,bursty,background] [--variants base,adapters,...] [--via fronts|gateway] [--duration D] [--html FILE]",
		Short: "Run the interference matrix on a real agent and sim engine processes",
		Long: `Start a dev agent in this process with one simulated card of the config's
size, deploy the config's models on it as sim engines (their residency,
class, memory, load and wake times, prefill and decode rates mapped to the
sim engine's flags), and run each model alone, every pair, then the whole
set, under the request mixes of ` + "`simulate interference`" + `, each for --duration of
wall time after a warm-up request per model. It records TTFT p50/p95/p99
and TPOT p95 per model, and cold loads, wakes and evictions from the
node's residency decisions, and prints the same matrix and flags as
` + "`simulate interference`" + `, plus each cell's live p95 TTFT next to the simulated
one: the same set's timeline (its warm-up, the requests sent, at the times
sent) replayed by ` + "`simulate serve`" + `'s engine model and gpuplane's policy.
The sim engine stamps when it received each request and wrote its first
token, so each live TTFT splits into the path to the engine (HTTP, the
node's front), the engine's part and the path back: the replay delivers
each request its own measured path after its send and adds its path back
(a closed loop's requests, sent as the replay answers them, draw from the
paths measured), so the two differ only by the engine's part; the report
also gives the replay without any path and the live engine's part alone.
Times run --time-scale times faster than the
config says (the engines, the mixes and the agent's residency controllers
alike) and are reported in the config's seconds. --models runs the matrix
over a subset of the config's models.

--variants repeats the matrix on variants of the config, each on an agent
of its own (one that cannot finish is reported as failed, the others
still run, and the run exits 1):` + variantsHelp + `The default is base alone, which keeps the home config's run within 15
minutes; each variant takes about as long again. Quantized models are
deployed with spec.engine.quantization fp8, adapters as tenant-private
adapters (spec.adapters[].tenants), batching-off passes --max-num-seqs 1.

--via says where the requests go: to the replicas' fronts (the node's own
endpoints, what the replay's agreement is measured on) or through the
node's gateway (its queue, in-flight caps, preemption and per-tenant cache
salt), which the replay then models too. The preemption variants always
go through the gateway, whose classes and preemption they exercise: they
add a background batch (2 outstanding, 1k tokens in and out, class
background) beside each interactive model's own traffic in every mix,
which the gateway preempts for the model's requests, or, with
preemption-off, does not; the cells measure the models' own traffic. The
config's tenants (the first two) take turns sending.

Every run checks isolation. Each answer must be its request's: its id
carries the request's request_id (vLLM's field and id format), its model
is the one asked for, and its usage counts the request's prompt and the
tokens streamed. After each set's mixes, probes through the gateway read
each engine's prompt cache: a tenant's first probe of a prompt must hit
nothing, a second tenant's probe of the same prompt must hit nothing,
and each tenant's repeat should hit its own. Any violation is counted
and shown in the report, and fails the run (exit 1) after the report.

-o json prints every cell (the first variant's at the top, every
variant's under "variants"); --html writes the report with the heatmaps.`,
		Example: `  gpuplane bench interference --config examples/serve/home.yaml --html live.html
  gpuplane bench interference --config examples/serve/home.yaml --models chat,batch --variants preemption,preemption-off`,
		Args: argsNamed(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.configPath == "" {
				return usageErrorf(cmd, "required flag --config not set")
			}
			if o.Duration <= 0 {
				return usageErrorf(cmd, "invalid --duration %s: must be > 0", o.Duration)
			}
			if o.TimeScale < 1 {
				return usageErrorf(cmd, "invalid --time-scale %g: must be ≥ 1", o.TimeScale)
			}
			mixes, err := interference.ParseMixes(o.mixes)
			if err != nil {
				return usageErrorf(cmd, "%v", err)
			}
			variants, err := servesim.ParseVariants(o.variants)
			if err != nil {
				return usageErrorf(cmd, "%v", err)
			}
			o.Transport = benchTransport
			if o.Via != interference.ViaFronts && o.Via != interference.ViaGateway {
				return usageErrorf(cmd, "invalid --via %q: want fronts or gateway", o.Via)
			}
			cfg, err := servesim.LoadConfig(o.configPath)
			if err != nil {
				return fmt.Errorf("bench interference: %w", err)
			}
			if o.models != "" {
				if cfg, err = interference.Subset(cfg, o.models); err != nil {
					return usageErrorf(cmd, "%v", err)
				}
			}
			res, err := interference.Run(ctx(cmd), cfg, mixes, variants, o.Options, g.stderr, func(url string) (*interference.Clients, error) {
				// Each variant's agent has an address of its own.
				g.addr, g.apiOnce = url, sync.Once{}
				api, err := g.api(cmd)
				if err != nil {
					return nil, err
				}
				return &interference.Clients{Models: api.Models, Accelerators: api.Accelerators, Residency: api.Residency}, nil
			})
			if err != nil {
				return fmt.Errorf("bench interference: %w", err)
			}
			if o.htmlPath != "" {
				if err := interference.WriteHTML(o.htmlPath, res); err != nil {
					return fmt.Errorf("bench interference: %w", err)
				}
			}
			if err := g.printValue(res, func(w io.Writer) error { return interference.WriteReport(w, res) }); err != nil {
				return err
			}
			if res.IsolationViolations > 0 {
				return fmt.Errorf("bench interference: %d isolation violations (see the report)", res.IsolationViolations)
			}
			if res.Failed > 0 {
				return fmt.Errorf("bench interference: %d variants failed (see the report)", res.Failed)
			}
			return nil
		},
	}
	f := c.Flags()
	f.StringVar(&o.configPath, "config", "", "card and models (a simulate serve config, YAML)")
	f.StringVar(&o.mixes, "mix", "short,long,bursty,background", "request mixes to run, comma-separated")
	f.DurationVar(&o.Duration, "duration", 3*time.Second, "wall time each cell sends requests for, after its warm-up")
	f.Float64Var(&o.TimeScale, "time-scale", 10, "how many times faster than the config the engines and mixes run")
	f.StringVar(&o.models, "models", "", "run the matrix over these of the config's models only, comma-separated (default: all)")
	f.StringVar(&o.htmlPath, "html", "", "also write an HTML report with the heatmap to this file")
	f.StringVar(&o.variants, "variants", "base", "repeat the matrix on these variants, comma-separated: "+strings.Join(servesim.VariantNames(), ", ")+", or all")
	f.StringVar(&o.Via, "via", interference.ViaFronts, "send the matrix's requests to the replicas' fronts or through the node's gateway")
	f.Uint64Var(&o.Seed, "seed", 1, "seed for the request streams")
	_ = c.MarkFlagFilename("config", "yaml", "yml")
	return c
}
