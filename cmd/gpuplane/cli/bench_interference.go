package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	"github.com/gpuplane/gpuplane/cmd/gpuplane/agent"
	"github.com/gpuplane/gpuplane/cmd/gpuplane/descriptor"
	"github.com/gpuplane/gpuplane/internal/catalog"
	"github.com/gpuplane/gpuplane/node/engine/sim"
	"github.com/gpuplane/gpuplane/node/gateway"
	"github.com/gpuplane/gpuplane/node/gateway/isolation"
	"github.com/gpuplane/gpuplane/node/gateway/queue"
	"github.com/gpuplane/gpuplane/node/simserve"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// `gpuplane bench interference`: the interference matrix of docs/simulate.md on
// a real dev agent (in process) and real sim engine processes on one
// simulated card, the live counterpart of `simulate interference`. Both
// use the same mixes, sets and summary (simserve.Sets, Mix.Stream,
// simserve.Summarize), so the reports read the same; this one adds, per
// cell and model, the simulated p95 TTFT of the same cell.
//
// Time runs --time-scale times faster than the config's figures: the sim
// engines load, wake, prefill and decode that much faster, the mixes send
// that much faster, and the agent's residency controllers run on a clock
// that much faster (agent.Config.ResidencyTimeScale: minimum residency,
// idle sleep, drain deadlines, rates and learned load times are in the
// config's seconds); every time measured is multiplied back, so the
// numbers are in the config's seconds.
//
// The comparison with the simulator replays each set's live timeline
// (simserve.ReplaySet): the requests sent, at the times sent, on the same
// models, each with its own path to and from the engine measured on this
// machine (the sim engine's timing headers) for what the simulator does
// not model (HTTP, the node's front), which the time scale multiplies like
// everything else.

func newBenchCommand(g *globals) *cobra.Command {
	return newGroupCommand("bench", "Measure gpuplane on a real agent and engines", nil, newBenchInterferenceCommand(g))
}

type benchOptions struct {
	configPath, htmlPath, mixes, models, variants, via string
	duration                                           time.Duration
	timeScale                                          float64
	seed                                               uint64
	// transport, when set, carries the bench's requests to the node (a
	// test plants faults in it).
	transport http.RoundTripper
}

// benchTransport, when set, carries the bench's requests (a test plants
// isolation faults in it); nil: the default transport.
var benchTransport http.RoundTripper

// Where the bench sends a matrix's requests.
const (
	viaFronts  = "fronts"
	viaGateway = "gateway"
)

func newBenchInterferenceCommand(g *globals) *cobra.Command {
	var o benchOptions
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
			if o.duration <= 0 {
				return usageErrorf(cmd, "invalid --duration %s: must be > 0", o.duration)
			}
			if o.timeScale < 1 {
				return usageErrorf(cmd, "invalid --time-scale %g: must be ≥ 1", o.timeScale)
			}
			mixes, err := benchMixes(o.mixes)
			if err != nil {
				return usageErrorf(cmd, "%v", err)
			}
			variants, err := simserve.ParseVariants(o.variants)
			if err != nil {
				return usageErrorf(cmd, "%v", err)
			}
			o.transport = benchTransport
			if o.via != viaFronts && o.via != viaGateway {
				return usageErrorf(cmd, "invalid --via %q: want fronts or gateway", o.via)
			}
			cfg, err := simserve.LoadConfig(o.configPath)
			if err != nil {
				return fmt.Errorf("bench interference: %w", err)
			}
			if o.models != "" {
				if cfg, err = benchSubset(cfg, o.models); err != nil {
					return usageErrorf(cmd, "%v", err)
				}
			}
			res, err := runBench(ctx(cmd), cfg, mixes, variants, o, g.stderr, func(url string) (*apiClients, error) {
				// Each variant's agent has an address of its own.
				g.addr, g.apiOnce = url, sync.Once{}
				return g.api(cmd)
			})
			if err != nil {
				return fmt.Errorf("bench interference: %w", err)
			}
			if o.htmlPath != "" {
				if err := writeBenchHTML(o.htmlPath, res); err != nil {
					return fmt.Errorf("bench interference: %w", err)
				}
			}
			if err := g.printValue(res, func(w io.Writer) error { return writeBench(w, res) }); err != nil {
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
	f.DurationVar(&o.duration, "duration", 3*time.Second, "wall time each cell sends requests for, after its warm-up")
	f.Float64Var(&o.timeScale, "time-scale", 10, "how many times faster than the config the engines and mixes run")
	f.StringVar(&o.models, "models", "", "run the matrix over these of the config's models only, comma-separated (default: all)")
	f.StringVar(&o.htmlPath, "html", "", "also write an HTML report with the heatmap to this file")
	f.StringVar(&o.variants, "variants", "base", "repeat the matrix on these variants, comma-separated: "+strings.Join(simserve.VariantNames(), ", ")+", or all")
	f.StringVar(&o.via, "via", viaFronts, "send the matrix's requests to the replicas' fronts or through the node's gateway")
	f.Uint64Var(&o.seed, "seed", 1, "seed for the request streams")
	_ = c.MarkFlagFilename("config", "yaml", "yml")
	return c
}

// benchResult is every variant's report; the first variant's is also at
// its top, as a run without --variants prints it.
type benchResult struct {
	*benchVariant
	Device    string  `json:"device"`
	TimeScale float64 `json:"timeScale"`
	// Variants are every variant's matrix, in the order run.
	Variants []*benchVariant `json:"variants"`
	// IsolationViolations sums the variants' isolation violations.
	IsolationViolations int `json:"isolationViolations"`
	// Failed counts the variants that could not run to the end (each
	// says why in its error).
	Failed int `json:"failedVariants,omitempty"`
}

// benchVariant is simulate interference's report of one variant's live
// cells, with the comparison with the simulated matrix and the isolation
// checks (MatrixResult.Isolation).
type benchVariant struct {
	*simserve.MatrixResult
	// Via is where the requests went: fronts or gateway.
	Via string `json:"via"`
	// Error says why the variant did not run to the end (with
	// --variants naming several; one alone fails the run).
	Error string `json:"error,omitempty"`
	// BackgroundRequests and BackgroundAnswered count the requests of the
	// background batches beside the interactive models (the preemption
	// variants), not in the cells' measures; a preempted one ends early.
	BackgroundRequests int `json:"backgroundRequests,omitempty"`
	BackgroundAnswered int `json:"backgroundAnswered,omitempty"`
	// Compare is each model's live p95 TTFT in each cell next to the
	// simulated one's; Ratio is live over simulated (0 where either
	// answered nothing).
	Compare []benchCompare `json:"compare"`
	// Requests and Answered count every request sent and every one
	// answered 200 with its first token.
	Requests int `json:"requests"`
	Answered int `json:"answered"`
	// Within counts the comparisons whose live p95 is within 15% of the
	// replayed one, of Compared with both.
	Within   int `json:"withinTolerance"`
	Compared int `json:"compared"`
}

type benchCompare struct {
	Models  []string `json:"models"`
	Mix     string   `json:"mix"`
	Model   string   `json:"model"`
	LiveP95 float64  `json:"liveTtftP95"`
	// SimP95 is the replay's p95 with each request's measured path to
	// and from the engine, SimBareP95 without any; OverheadP50 and
	// OverheadP95 are what the model's one-token requests of the set took
	// beyond the engine's model (path and engine scheduling), in the
	// config's seconds.
	SimP95     float64 `json:"simTtftP95"`
	SimBareP95 float64 `json:"simTtftP95NoOverhead"`
	// LiveEngineP95 is the p95 of the engine's own part of each live
	// TTFT (from its receipt of the request to when its model had the
	// first token ready), to set beside SimBareP95.
	LiveEngineP95 float64 `json:"liveEngineTtftP95"`
	// LiveLateP95 is the p95 of how late the engine's process wrote the
	// first token after its model had it ready (part of the path back).
	LiveLateP95 float64 `json:"liveEngineLateP95"`
	OverheadP50 float64 `json:"overheadP50"`
	OverheadP95 float64 `json:"overheadP95"`
	Ratio       float64 `json:"ratio"`
	Answered    int     `json:"answered"`
}

// benchSubset keeps the config's models named in list, in config order.
func benchSubset(cfg *simserve.Config, list string) (*simserve.Config, error) {
	c := *cfg
	c.Models = nil
	var known []string
	for _, m := range cfg.Models {
		known = append(known, m.Name)
	}
	want := map[string]bool{}
	for name := range strings.SplitSeq(list, ",") {
		name = strings.TrimSpace(name)
		if !slices.Contains(known, name) {
			return nil, fmt.Errorf("invalid --models %q: not a model of the config (%s)", name, strings.Join(known, ", "))
		}
		want[name] = true
	}
	for _, m := range cfg.Models {
		if want[m.Name] {
			c.Models = append(c.Models, m)
		}
	}
	return &c, nil
}

func benchMixes(list string) ([]simserve.Mix, error) {
	var out []simserve.Mix
	for name := range strings.SplitSeq(list, ",") {
		name = strings.TrimSpace(name)
		i := slices.IndexFunc(simserve.Mixes, func(m simserve.Mix) bool { return m.Name == name })
		if i < 0 {
			var known []string
			for _, m := range simserve.Mixes {
				known = append(known, m.Name)
			}
			return nil, fmt.Errorf("invalid --mix %q: want a comma-separated list of %s", name, strings.Join(known, ", "))
		}
		if !slices.ContainsFunc(out, func(m simserve.Mix) bool { return m.Name == name }) {
			out = append(out, simserve.Mixes[i])
		}
	}
	return out, nil
}

// benchDevice is the catalog kind whose memory is closest to the card's,
// within 10%.
func benchDevice(cfg *simserve.Config) (catalog.Device, error) {
	want := cfg.Card.MemoryGiB * 1024
	var best catalog.Device
	for _, slug := range catalog.Slugs() {
		d, _ := catalog.BySlug(slug)
		if best.Slug == "" || math.Abs(float64(d.MemoryMiB)-want) < math.Abs(float64(best.MemoryMiB)-want) {
			best = d
		}
	}
	if math.Abs(float64(best.MemoryMiB)-want) > want/10 {
		return best, fmt.Errorf("card.memoryGiB %g: no simulated device kind within 10%% (closest: %s, %d MiB)", cfg.Card.MemoryGiB, best.Slug, best.MemoryMiB)
	}
	return best, nil
}

// benchSpec is model m's deployment: the sim engine with the config's
// figures, time-scaled, and what the config's variant changes: an engine
// batch (--max-num-seqs), adapters, the weights' quantization.
func benchSpec(cfg *simserve.Config, m *simserve.ModelConfig, accel string, scale float64) *descriptor.ModelDeploymentSpec {
	mib := int64(math.Ceil(m.MemoryGiB * 1024))
	mem, _ := descriptor.ParseQuantity(strconv.FormatInt(mib, 10) + "Mi")
	f := func(x float64) string { return strconv.FormatFloat(x, 'g', 6, 64) }
	args := []string{
		"--load-seconds", f(m.LoadSeconds / scale),
		"--wake-seconds", f(m.WakeSeconds / scale),
		"--tokens-per-second", f(m.TokensPerSecond * scale),
		"--prefill-tokens-per-second", f(m.PrefillTokensPerSecond * scale),
		"--batch-slowdown", f(*m.BatchSlowdown),
		"--compute-percent", strconv.Itoa(int(m.ComputePercent)),
		"--sleep-residual-mib", strconv.FormatInt(int64(m.ResidualGiB*1024), 10),
	}
	if cfg.EngineBatch {
		args = append(args, "--max-num-seqs", strconv.Itoa(m.MaxInFlight))
	}
	if len(m.Adapters) > 0 {
		args = append(args, "--max-loras", strconv.Itoa(m.MaxAdapters),
			// A fixed load time (0 would draw GenTD26's, unscaled).
			"--lora-load-time", max(time.Microsecond, time.Duration(m.AdapterLoadSeconds/scale*float64(time.Second))).String())
	}
	if m.KVTokens > 0 {
		// A quarter of the footprint is the KV pool, holding KVTokens.
		pool := mib / 4
		args = append(args, "--kv-pool-mib", strconv.FormatInt(pool, 10),
			"--kv-kib-per-token", strconv.FormatInt(max(1, pool*1024/int64(m.KVTokens)), 10))
	}
	spec := &descriptor.ModelDeploymentSpec{
		Model:     "/models/" + m.Name,
		Placement: descriptor.Placement{Accelerator: accel},
		Engine:    descriptor.Engine{Kind: "sim", Memory: &mem, Args: args, Quantization: m.Quantization},
		Residency: m.Residency,
		Priority:  m.Class,
	}
	if len(m.Adapters) > 0 {
		maxAd := int64(m.MaxAdapters)
		spec.Engine.MaxAdapters = &maxAd
	}
	for _, ad := range m.Adapters {
		// Under TenantAdapters an adapter is named as its tenant and
		// private to it.
		a := descriptor.Adapter{Name: ad, Source: "/adapters/" + m.Name + "/" + ad, Rank: new(int64(16))}
		if cfg.TenantAdapters {
			a.Tenants = []string{ad}
		}
		spec.Adapters = append(spec.Adapters, a)
	}
	if m.SLOTTFTSeconds > 0 {
		ms := max(1, int64(m.SLOTTFTSeconds*1000/scale))
		spec.SLO = &descriptor.SLO{TTFTMs: &ms}
	}
	spec.SetDefaults(m.Name)
	return spec
}

func benchFreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// runBench runs the matrix once per variant, each on an agent of its own;
// connectTo returns the API clients of the agent at a URL.
func runBench(ctx context.Context, cfg *simserve.Config, mixes []simserve.Mix, variants []simserve.Variant, o benchOptions, progress io.Writer, connectTo func(url string) (*apiClients, error)) (*benchResult, error) {
	dev, err := benchDevice(cfg)
	if err != nil {
		return nil, err
	}
	res := &benchResult{Device: dev.Slug, TimeScale: o.timeScale}
	for _, v := range variants {
		if len(variants) > 1 {
			fmt.Fprintf(progress, "variant %s\n", v.Name)
		}
		r, err := runVariant(ctx, v.Apply(cfg), v, dev, mixes, o, progress, connectTo)
		if err != nil && len(variants) == 1 {
			return nil, fmt.Errorf("variant %s: %w", v.Name, err)
		}
		if err != nil {
			// The other variants still run: the report says which failed.
			fmt.Fprintf(progress, "variant %s failed: %v\n", v.Name, err)
			r = &benchVariant{MatrixResult: &simserve.MatrixResult{Card: cfg.Card.Name, Variant: v.Name}, Error: err.Error()}
			res.Failed++
		}
		res.Variants = append(res.Variants, r)
		res.IsolationViolations += r.Isolation.Violations()
	}
	res.benchVariant = res.Variants[0]
	return res, nil
}

// runVariant starts an agent, runs every set and mix of cfg (a variant's)
// on it and reports.
func runVariant(ctx context.Context, cfg *simserve.Config, v simserve.Variant, dev catalog.Device, mixes []simserve.Mix, o benchOptions, progress io.Writer, connectTo func(url string) (*apiClients, error)) (*benchVariant, error) {
	dir, err := os.MkdirTemp("", "gpuplane-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	raft, err := benchFreePort()
	if err != nil {
		return nil, err
	}
	gossip, err := benchFreePort()
	if err != nil {
		return nil, err
	}
	weights := map[string]float64{}
	for _, t := range cfg.Tenants {
		weights[t.Name] = t.Weight
	}
	startCtx, cancel := context.WithTimeout(ctx, time.Minute)
	a, err := agent.Start(startCtx, agent.Config{Dev: true, NodeName: "bench", DataDir: dir, RaftPort: raft, GossipPort: gossip,
		SimGPUs: dev.Slug + "=1", Enforce: "none", ResidencyTimeScale: o.timeScale,
		Gateway: agent.GatewayConfig{Weights: weights, Queue: queue.Config{NoPreemption: cfg.NoPreemption}}})
	cancel()
	if err != nil {
		return nil, fmt.Errorf("start the agent: %w", err)
	}
	defer a.Close()
	via := o.via
	if cfg.BackgroundBeside {
		// Classes and preemption are the gateway's.
		via = viaGateway
	}
	// A request waits at a front for at most the node's wait for a load
	// (2 minutes); this only bounds a request that is never answered.
	b := &bench{cfg: cfg, o: o, http: &http.Client{Timeout: 10 * time.Minute, Transport: o.transport}, progress: progress,
		via: via, gateway: a.GatewayURL(), iso: &simserve.Isolation{}}
	for _, t := range cfg.Tenants[:min(2, len(cfg.Tenants))] {
		b.tenants = append(b.tenants, t.Name)
	}
	if b.api, err = connectTo(a.APIURL()); err != nil {
		return nil, err
	}

	const accel = "bench"
	maxModels := int64(max(2, len(cfg.Models)))
	if _, err := b.api.Accelerators.CreateAccelerator(ctx, connect.NewRequest(&pb.CreateAcceleratorRequest{Name: accel,
		Spec: (&descriptor.AcceleratorSpec{Device: dev.Slug, Tenancy: "shared", MaxModels: &maxModels}).Proto()})); err != nil {
		return nil, fmt.Errorf("create the accelerator: %w", err)
	}
	res := &benchVariant{MatrixResult: &simserve.MatrixResult{Card: cfg.Card.Name, Variant: v.Name, Seconds: o.duration.Seconds() * o.timeScale,
		Thrashing: simserve.MatrixThrash, Isolation: b.iso}, Via: via}
	for _, m := range cfg.Models {
		res.Models = append(res.Models, m.Name)
	}
	sets := simserve.Sets(len(cfg.Models))
	for k, set := range sets {
		began := time.Now()
		cells, cmps, err := b.runSet(ctx, accel, k, set, mixes)
		if err != nil {
			return nil, err
		}
		res.Cells = append(res.Cells, cells...)
		res.Compare = append(res.Compare, cmps...)
		fmt.Fprintf(progress, "set %d/%d (%s): %d mixes in %s\n", k+1, len(sets), strings.Join(cells[0].Models, "+"), len(cells), time.Since(began).Round(100*time.Millisecond))
	}
	simserve.Summarize(cfg, res.MatrixResult)
	res.Requests, res.Answered = b.requests, b.answered
	res.BackgroundRequests, res.BackgroundAnswered = b.asideRequests, b.asideAnswered
	res.Within, res.Compared = res.agreement()
	return res, nil
}

type bench struct {
	cfg  *simserve.Config
	o    benchOptions
	api  *apiClients
	http *http.Client
	// progress is where failed requests are reported, with their errors.
	progress io.Writer

	// setStart is when the running set's warm-up began.
	setStart time.Time
	// via is where requests go (viaFronts, viaGateway); gateway is the
	// node's gateway; tenants take turns sending, by request number.
	via     string
	gateway string
	tenants []string

	mu sync.Mutex
	// sent numbers every request, warm-ups included; requests and
	// answered count the measured ones.
	sent, requests, answered int
	// asideRequests and asideAnswered count the background batches'
	// beside the models' own traffic (Config.Beside).
	asideRequests, asideAnswered int
	// iso records the isolation checks.
	iso *simserve.Isolation
}

// runSet deploys the set's models, warms each with one request, measures
// each model's per-request overhead, runs each mix, deletes the models
// again and replays the set's timeline in the simulator.
func (b *bench) runSet(ctx context.Context, accel string, setIdx int, set []int, mixes []simserve.Mix) ([]simserve.Cell, []benchCompare, error) {
	var names []string
	// The set's timeline starts as its models are deployed: pinned and
	// warm ones load when placed, in the replay as live.
	b.setStart = time.Now()
	for _, i := range set {
		m := &b.cfg.Models[i]
		names = append(names, m.Name)
		spec := benchSpec(b.cfg, m, accel, b.o.timeScale)
		if _, err := b.api.Models.ApplyModel(ctx, connect.NewRequest(&pb.ApplyModelRequest{Name: m.Name, Spec: spec.Proto()})); err != nil {
			return nil, nil, fmt.Errorf("deploy %s: %w", m.Name, err)
		}
	}
	defer b.remove(names)
	endpoints, err := b.endpoints(ctx, names)
	if err != nil {
		return nil, nil, err
	}
	scale := b.o.timeScale
	// The warm-up: one request per model, so that each cell measures a
	// card that has loaded its models once (simulate interference's
	// warm-up does the same in virtual time).
	var wg sync.WaitGroup
	warm := make([]error, len(set))
	var warmReqs []simserve.LiveRequest
	for k, i := range set {
		name := b.cfg.Models[i].Name
		warmReqs = append(warmReqs, simserve.LiveRequest{Time: time.Since(b.setStart).Seconds() * scale, Model: name, PromptTokens: 16, OutputTokens: 4})
		wg.Go(func() {
			warm[k] = b.warm(ctx, endpoints[k], name)
		})
	}
	wg.Wait()
	if err := errors.Join(warm...); err != nil {
		return nil, nil, err
	}
	// The overhead: one-token requests, one after the other, to each
	// model; what they take beyond the engine's model for one prompt
	// token and one output token is this machine's cost of a request
	// (reported), and their paths to and from the engine join the draws
	// of the replay's closed loops.
	overhead := map[string][]float64{}
	path := pathOverheads{}
	for k, i := range set {
		m := &b.cfg.Models[i]
		engine := 1 / m.TokensPerSecond
		if m.PrefillTokensPerSecond > 0 {
			engine += 1 / m.PrefillTokensPerSecond
		}
		for range benchCalibration {
			s := b.send(ctx, endpoints[k], m.Name, 1, 1, false)
			warmReqs = append(warmReqs, s.live(m.Name, scale))
			if s.err == nil {
				overhead[m.Name] = append(overhead[m.Name], max(0, s.ttft*scale-engine))
				path.add(m.Name, s, scale)
			}
		}
	}
	var cells []simserve.Cell
	var phases []simserve.LivePhase
	// engineP95[cell][model] is the p95 of the engine's own part of the
	// TTFT (config seconds).
	var engineP95, lateP95 [][]float64
	for _, mix := range mixes {
		seq, err := b.lastDecision(ctx)
		if err != nil {
			return nil, nil, err
		}
		cell := simserve.Cell{Models: names, Mix: mix.Name}
		per := make([][]sample, len(set))
		began := time.Now()
		phase := simserve.LivePhase{Mix: mix.Name, Start: began.Sub(b.setStart).Seconds() * scale}
		phase.End = phase.Start + b.o.duration.Seconds()*scale
		// aside[k] are the requests of the background batch beside model
		// k's own traffic (Config.Beside), if it gets one.
		aside := make([][]sample, len(set))
		for k, i := range set {
			m := &b.cfg.Models[i]
			st := mix.Stream(m)
			if st.Concurrency > 0 {
				phase.Closed = append(phase.Closed, simserve.LiveClosed{Model: m.Name, Concurrency: st.Concurrency,
					PromptTokens: st.PromptTokens, OutputTokens: st.OutputTokens})
			}
			wg.Go(func() {
				per[k] = b.drive(ctx, endpoints[k], m, st, b.o.seed<<16|uint64(i))
			})
			if bg, ok := b.cfg.Beside(m); ok {
				wg.Go(func() {
					aside[k] = b.drive(ctx, endpoints[k], m, bg, b.o.seed<<16|uint64(i)|1<<15)
				})
			}
		}
		wg.Wait()
		for k, i := range set {
			m := &b.cfg.Models[i]
			if bg, ok := b.cfg.Beside(m); ok {
				sent := slices.Clone(aside[k])
				slices.SortStableFunc(sent, func(x, y sample) int { return cmpFloat(x.at, y.at) })
				cl := simserve.LiveClosed{Model: m.Name, Concurrency: bg.Concurrency, PromptTokens: bg.PromptTokens, OutputTokens: bg.OutputTokens, Aside: true}
				for _, s := range sent {
					cl.Sent = append(cl.Sent, s.live(m.Name, scale))
				}
				phase.Closed = append(phase.Closed, cl)
			}
		}
		loads, wakes, evictions, err := b.decisionsSince(ctx, seq)
		if err != nil {
			return nil, nil, err
		}
		hours := time.Since(began).Hours() * scale
		cell.ColdLoadsPerHour = simserve.Round(float64(loads)/hours, 1)
		cell.WakesPerHour = simserve.Round(float64(wakes)/hours, 1)
		cell.Evictions = evictions
		var eng, late []float64
		for k, i := range set {
			m := &b.cfg.Models[i]
			cell.PerModel = append(cell.PerModel, b.stats(m, per[k]))
			for _, s := range per[k] {
				if s.err != nil {
					fmt.Fprintf(b.progress, "cell %s/%s: a request for %s failed: %v\n", strings.Join(names, "+"), mix.Name, m.Name, s.err)
				}
			}
			var own, lateness []float64
			for _, s := range per[k] {
				if s.err == nil && s.timed {
					own = append(own, s.engineTTFT()*scale)
					lateness = append(lateness, s.late*scale)
				}
			}
			slices.Sort(own)
			slices.Sort(lateness)
			eng = append(eng, simserve.Round(simserve.Percentile(own, 95), 3))
			late = append(late, simserve.Round(simserve.Percentile(lateness, 95), 3))
			if mix.Stream(m).Concurrency > 0 {
				sent := slices.Clone(per[k])
				slices.SortStableFunc(sent, func(x, y sample) int { return cmpFloat(x.at, y.at) })
				for c := range phase.Closed {
					if phase.Closed[c].Model == m.Name && !phase.Closed[c].Aside {
						for _, s := range sent {
							phase.Closed[c].Sent = append(phase.Closed[c].Sent, s.live(m.Name, scale))
						}
					}
				}
				continue
			}
			for _, s := range per[k] {
				phase.Open = append(phase.Open, s.live(m.Name, scale))
			}
		}
		engineP95 = append(engineP95, eng)
		lateP95 = append(lateP95, late)
		slices.SortStableFunc(phase.Open, func(x, y simserve.LiveRequest) int { return cmpFloat(x.Time, y.Time) })
		cells = append(cells, cell)
		phases = append(phases, phase)
	}
	if err := b.probeCaches(ctx, setIdx, names); err != nil {
		return nil, nil, err
	}
	ro := simserve.ReplayOptions{Overhead: path, Seed: b.o.seed, Gateway: b.via == viaGateway}
	withOv, err := simserve.ReplaySet(b.cfg, names, warmReqs, phases, ro)
	if err != nil {
		return nil, nil, err
	}
	ro.Bare = true
	bare, err := simserve.ReplaySet(b.cfg, names, warmReqs, phases, ro)
	if err != nil {
		return nil, nil, err
	}
	var cmps []benchCompare
	for k, c := range cells {
		for j, ms := range c.PerModel {
			cmp := benchCompare{Models: c.Models, Mix: c.Mix, Model: ms.Model, LiveP95: ms.TTFTP95, Answered: ms.Completed,
				SimP95: withOv[k][j].TTFTP95, SimBareP95: bare[k][j].TTFTP95, LiveEngineP95: engineP95[k][j], LiveLateP95: lateP95[k][j],
				OverheadP50: simserve.Round(simserve.Percentile(overhead[ms.Model], 50), 4),
				OverheadP95: simserve.Round(simserve.Percentile(overhead[ms.Model], 95), 4)}
			if cmp.SimP95 > 0 && ms.Completed > 0 && withOv[k][j].Completed > 0 {
				// Three significant digits: a ratio far below 1 must not round
				// to 0, which reads as "not compared".
				cmp.Ratio, _ = strconv.ParseFloat(strconv.FormatFloat(cmp.LiveP95/cmp.SimP95, 'g', 3, 64), 64)
			}
			cmps = append(cmps, cmp)
		}
	}
	return cells, cmps, nil
}

// pathOverheads are each model's measured paths to and from the engine
// (config seconds): the draws of the replay's closed-loop requests (a
// phase's own), and of its untimed requests (the calibration's).
type pathOverheads map[string][]float64

func (p pathOverheads) add(model string, s sample, scale float64) {
	if s.timed {
		p[model] = append(p[model], (s.toEngine+s.fromEngine)*scale)
	}
}

// benchCalibration is how many one-token requests measure each model's
// per-request overhead in a set.
const benchCalibration = 20

func cmpFloat(x, y float64) int {
	switch {
	case x < y:
		return -1
	case x > y:
		return 1
	}
	return 0
}

// warm sends one request to the model until it is answered: a pinned
// model's engine answers 503 while it loads, where a front would hold the
// request. The warm-up's requests are not counted.
func (b *bench) warm(ctx context.Context, endpoint, model string) error {
	deadline := time.Now().Add(3 * time.Minute)
	for {
		s := b.send(ctx, endpoint, model, 16, 4, false)
		if s.err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("warm-up request to %s: %w", model, s.err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// endpoints waits until each model's replica is placed with an endpoint.
func (b *bench) endpoints(ctx context.Context, names []string) ([]string, error) {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		resp, err := b.api.Models.ListReplicas(ctx, connect.NewRequest(&pb.ListReplicasRequest{}))
		if err != nil {
			return nil, err
		}
		eps := make([]string, len(names))
		n := 0
		for _, r := range resp.Msg.GetReplicas() {
			if i := slices.Index(names, r.GetModel()); i >= 0 && r.GetEndpoint() != "" && eps[i] == "" {
				eps[i] = r.GetEndpoint()
				n++
			}
		}
		if n == len(names) {
			return eps, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("replicas of %s not placed with endpoints after 2m: %v", strings.Join(names, ", "), resp.Msg.GetReplicas())
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// remove deletes the models and waits until their replicas are gone, so
// that the next set starts on an empty card.
func (b *bench) remove(names []string) {
	ctx := context.Background()
	for _, n := range names {
		_, _ = b.api.Models.DeleteModel(ctx, connect.NewRequest(&pb.DeleteModelRequest{Name: n}))
	}
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		resp, err := b.api.Models.ListReplicas(ctx, connect.NewRequest(&pb.ListReplicasRequest{}))
		if err == nil && len(resp.Msg.GetReplicas()) == 0 {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (b *bench) allDecisions(ctx context.Context) ([]*pb.ResidencyDecision, error) {
	stream, err := b.api.Residency.ListDecisions(ctx, connect.NewRequest(&pb.ListDecisionsRequest{}))
	if err != nil {
		return nil, err
	}
	defer stream.Close()
	var all []*pb.ResidencyDecision
	for stream.Receive() {
		all = append(all, stream.Msg().GetDecisions()...)
	}
	return all, stream.Err()
}

func (b *bench) lastDecision(ctx context.Context) (uint64, error) {
	all, err := b.allDecisions(ctx)
	var seq uint64
	for _, d := range all {
		seq = max(seq, d.GetSeq())
	}
	return seq, err
}

// decisionsSince counts the node's loads, wakes and evictions after seq.
func (b *bench) decisionsSince(ctx context.Context, seq uint64) (loads, wakes, evictions int, err error) {
	all, err := b.allDecisions(ctx)
	for _, d := range all {
		if d.GetSeq() <= seq || d.GetAdvised() {
			continue
		}
		switch d.GetAction() {
		case "load":
			loads++
		case "wake":
			wakes++
		case "evict":
			evictions++
		}
	}
	return loads, wakes, evictions, err
}

// minArrivals is the fewest requests an open-loop mix is expected to send
// per model in a cell.
const minArrivals = 3

// sample is one request: when it was sent (since the set's start), its
// lengths and its outcome, in wall seconds.
//
// A streamed answer from the sim engine carries when the engine received
// the request, when its model had the first token ready and when its
// process wrote it (sim.HeaderReceived, HeaderFirstTokenDue,
// HeaderFirstToken): toEngine and fromEngine split the TTFT into the path
// to the engine, the engine's own part (the model's, under the live
// card's sharing, batch, KV pool and residency) and the path back.
type sample struct {
	at                   float64
	in, out              int
	ttft, tpot           float64
	timed                bool
	toEngine, fromEngine float64
	// late is how long after its model had the first token ready the
	// engine's process wrote it (part of fromEngine).
	late float64
	// tenant sent it; cached is the prompt tokens its answer says the
	// engine's cache held (-1: it did not say).
	tenant string
	cached int
	err    error
}

// live is the request as the replay takes it, in the config's seconds.
func (s sample) live(model string, scale float64) simserve.LiveRequest {
	return simserve.LiveRequest{Time: s.at * scale, Model: model, PromptTokens: s.in, OutputTokens: s.out,
		Timed: s.timed, In: s.toEngine * scale, Out: s.fromEngine * scale, Tenant: s.tenant}
}

// engineTTFT is the engine's own part of the TTFT (wall seconds).
func (s sample) engineTTFT() float64 { return s.ttft - s.toEngine - s.fromEngine }

// drive sends the stream's requests to endpoint for the duration: open
// loop (Poisson arrivals, bursty when the stream has on/off periods) or
// closed loop (Concurrency always outstanding), then waits for every
// request it sent.
func (b *bench) drive(ctx context.Context, endpoint string, m *simserve.ModelConfig, st simserve.SyntheticStream, seed uint64) []sample {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	scale := b.o.timeScale
	start := time.Now()
	end := start.Add(b.o.duration)
	var mu sync.Mutex
	var out []sample
	var wg sync.WaitGroup
	lengths := func() (int, int) {
		in := int(float64(st.PromptTokens) * (0.5 + rng.Float64()))
		return max(1, in), max(1, int(float64(st.OutputTokens)*(0.5+rng.Float64())))
	}
	aside := st.Aside()
	one := func(in, outTokens int) {
		s := b.send(ctx, endpoint, m.Name, in, outTokens, aside)
		mu.Lock()
		out = append(out, s)
		mu.Unlock()
		b.mu.Lock()
		if aside {
			b.asideRequests++
			if s.err == nil {
				b.asideAnswered++
			}
		} else {
			b.requests++
			if s.err == nil {
				b.answered++
			}
		}
		b.mu.Unlock()
	}
	if st.Concurrency > 0 {
		var lmu sync.Mutex
		for range st.Concurrency {
			wg.Go(func() {
				for time.Now().Before(end) && ctx.Err() == nil {
					lmu.Lock()
					in, o := lengths()
					lmu.Unlock()
					one(in, o)
				}
			})
		}
		wg.Wait()
		return out
	}
	// Open loop: arrivals in the stream's virtual time, sent at its
	// scaled wall time.
	// A sparse mix (long: one request in 20 s) runs long enough to expect
	// minArrivals requests, or its p95 would rest on none.
	horizon := max(b.o.duration.Seconds()*scale, minArrivals/st.RatePerSecond)
	for t := rng.ExpFloat64() / st.RatePerSecond; t < horizon; t += rng.ExpFloat64() / st.RatePerSecond {
		if period := st.OnSeconds + st.OffSeconds; st.OnSeconds > 0 && math.Mod(t, period) >= st.OnSeconds {
			continue
		}
		in, o := lengths()
		select {
		case <-ctx.Done():
		case <-time.After(time.Until(start.Add(time.Duration(t / scale * float64(time.Second))))):
		}
		wg.Go(func() { one(in, o) })
	}
	wg.Wait()
	return out
}

// send streams one completion of in prompt words and out tokens for
// model, and times its first token and the tokens after it. The config's
// tenants take turns by request number; under TenantAdapters each asks
// for its own adapter of the model. It goes to endpoint (the replica's
// front) or through the node's gateway, as the run says.
//
// An aside request (background work beside a model's own traffic) is
// sent as class background (the gateway's ClassHeader).
func (b *bench) send(ctx context.Context, endpoint, model string, in, out int, aside bool) sample {
	b.mu.Lock()
	b.sent++
	id := b.sent
	b.mu.Unlock()
	tenant := b.tenants[id%len(b.tenants)]
	asked := model
	if b.cfg.TenantAdapters {
		asked = model + ":" + tenant
	}
	url := endpoint
	if b.via == viaGateway {
		url = b.gateway
	}
	// A prompt of its own, so that no request finds another's prefix in
	// the engine's cache (simulate serve has no prefix cache).
	words := make([]string, in)
	for i := range words {
		words[i] = "w" + strconv.Itoa((id*7919+i)%100000)
	}
	class := ""
	if aside {
		class = "background"
	}
	return b.sendAs(ctx, url, asked, tenant, class, id, words, out)
}

// sendAs streams one completion of prompt and out tokens for model (as
// the client names it) as tenant to url, with request number id, and
// checks that the answer is the request's (checkIdentity).
func (b *bench) sendAs(ctx context.Context, url, model, tenant, class string, id int, prompt []string, out int) sample {
	rid := "bench-" + strconv.Itoa(id)
	body, _ := json.Marshal(map[string]any{"model": model, "prompt": strings.Join(prompt, " "), "max_tokens": out, "stream": true,
		"stream_options": map[string]any{"include_usage": true}, "request_id": rid})
	t0 := time.Now()
	s := sample{at: t0.Sub(b.setStart).Seconds(), in: len(prompt), out: out, tenant: tenant, cached: -1}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", bytes.NewReader(body))
	if err != nil {
		s.err = err
		return s
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(isolation.TenantHeader, tenant)
	if class != "" {
		req.Header.Set(gateway.ClassHeader, class)
	}
	resp, err := b.http.Do(req)
	if err != nil {
		s.err = err
		return s
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		s.err = fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(msg))
		return s
	}
	var first, last time.Time
	tokens := 0
	var ans answerSeen
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || line == "[DONE]" {
			continue
		}
		var chunk struct {
			ID      string `json:"id"`
			Model   string `json:"model"`
			Choices []struct {
				Text string `json:"text"`
			} `json:"choices"`
			Usage *struct {
				PromptTokens        int `json:"prompt_tokens"`
				CompletionTokens    int `json:"completion_tokens"`
				PromptTokensDetails struct {
					CachedTokens int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
			Error *struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		if json.Unmarshal([]byte(line), &chunk) != nil {
			continue
		}
		if chunk.Error != nil {
			// A stream the gateway cut off (preempted) ends in an error
			// event: not an answer.
			s.err = fmt.Errorf("the stream ended in an error: %s", chunk.Error.Message)
			return s
		}
		ans.ids = append(ans.ids, chunk.ID)
		ans.models = append(ans.models, chunk.Model)
		if chunk.Usage != nil {
			ans.usage = true
			ans.prompt, ans.completion = chunk.Usage.PromptTokens, chunk.Usage.CompletionTokens
			s.cached = chunk.Usage.PromptTokensDetails.CachedTokens
		}
		if len(chunk.Choices) == 0 || chunk.Choices[0].Text == "" {
			continue
		}
		last = time.Now()
		if first.IsZero() {
			first = last
		}
		tokens++
	}
	if err := sc.Err(); err != nil {
		s.err = err
		return s
	}
	if first.IsZero() {
		s.err = errors.New("the stream ended without a token")
		return s
	}
	ans.tokens = tokens
	if problem := checkIdentity(rid, model, len(prompt), ans); problem != "" {
		b.mu.Lock()
		b.iso.Violation("identity", fmt.Sprintf("request %s (%s, tenant %s): %s", rid, model, tenant, problem))
		b.mu.Unlock()
	}
	b.mu.Lock()
	b.iso.Answers++
	b.mu.Unlock()
	s.ttft = first.Sub(t0).Seconds()
	recv, err1 := strconv.ParseInt(resp.Header.Get(sim.HeaderReceived), 10, 64)
	due, err2 := strconv.ParseInt(resp.Header.Get(sim.HeaderFirstTokenDue), 10, 64)
	wrote, err3 := strconv.ParseInt(resp.Header.Get(sim.HeaderFirstToken), 10, 64)
	if err1 == nil && err2 == nil && err3 == nil {
		// All three clocks are this machine's wall clock. The path back
		// starts when the engine's model had the token ready: how late
		// its process wrote it is this machine's, as the path is.
		s.timed = true
		s.toEngine = min(max(0, float64(recv-t0.UnixNano())/1e9), s.ttft)
		s.fromEngine = min(max(0, float64(first.UnixNano()-due)/1e9), s.ttft-s.toEngine)
		s.late = max(0, float64(wrote-due)/1e9)
	}
	if tokens > 1 {
		s.tpot = last.Sub(first).Seconds() / float64(tokens-1)
	}
	return s
}

// answerSeen is what a streamed answer said of itself: each event's id
// and model, its usage (when it sent one) and the tokens streamed.
type answerSeen struct {
	ids, models        []string
	usage              bool
	prompt, completion int
	tokens             int
}

// checkIdentity says how an answer is not the one to request rid for
// model (as the client named it) with prompt tokens, or "": every event
// carries the id the engine forms from rid (vLLM's "cmpl-" + request_id)
// and the model asked for (or the adapter the node resolved "model:
// adapter" to), and its usage counts the request's prompt and the tokens
// streamed.
func checkIdentity(rid, model string, prompt int, ans answerSeen) string {
	want := "cmpl-" + rid
	_, adapter, _ := strings.Cut(model, ":")
	for k, id := range ans.ids {
		if id != want {
			return fmt.Sprintf("event %d carries id %q, not %q", k, id, want)
		}
		if m := ans.models[k]; m != model && (adapter == "" || m != adapter) {
			return fmt.Sprintf("event %d is from model %q, not %q", k, m, model)
		}
	}
	switch {
	case !ans.usage:
		return "no usage in the answer"
	case ans.prompt != prompt:
		return fmt.Sprintf("usage counts %d prompt tokens, the request sent %d", ans.prompt, prompt)
	case ans.completion != ans.tokens:
		return fmt.Sprintf("usage counts %d completion tokens, %d were streamed", ans.completion, ans.tokens)
	}
	return ""
}

// probeCaches reads each engine's prompt cache through the node's gateway
// (where each tenant's cache salt is set): for each model of the set, the
// first tenant sends a prompt no one sent before twice, then the second
// tenant sends it twice. A first send of either must hit nothing (a hit
// is another tenant's, or another set's, prompt); the repeats should hit
// their own tenant's, which shows the cache was there to leak.
func (b *bench) probeCaches(ctx context.Context, setIdx int, names []string) error {
	tenants := slices.Clone(b.tenants)
	if len(tenants) < 2 {
		tenants = append(tenants, "isolation-probe")
	}
	for k, name := range names {
		prompt := make([]string, 4*probeBlock)
		for i := range prompt {
			prompt[i] = fmt.Sprintf("p%dm%di%d", setIdx, k, i)
		}
		for _, tenant := range tenants[:2] {
			for rep := range 2 {
				b.mu.Lock()
				b.sent++
				id := b.sent
				b.mu.Unlock()
				s := b.sendAs(ctx, b.gateway, name, tenant, "", id, prompt, 1)
				if s.err != nil {
					return fmt.Errorf("cache probe of %s as %s: %w", name, tenant, s.err)
				}
				b.mu.Lock()
				b.iso.CacheProbes++
				switch {
				case s.cached < 0:
					b.iso.Violation("cache", fmt.Sprintf("probe of %s as %s: the answer has no cached_tokens", name, tenant))
				case rep == 0 && s.cached > 0:
					b.iso.Violation("cache", fmt.Sprintf("%s: tenant %s's first send of a prompt hit %d cached tokens it never sent (the other tenant sent it)", name, tenant, s.cached))
				case rep == 1 && s.cached > 0:
					b.iso.OwnHits++
				}
				b.mu.Unlock()
			}
		}
	}
	return nil
}

// probeBlock is the sim engine's prefix-cache block, in tokens: a probe's
// prompt is whole blocks.
const probeBlock = 16

// stats are a model's measures in the cell, in the config's seconds.
func (b *bench) stats(m *simserve.ModelConfig, samples []sample) simserve.ModelStats {
	ms := simserve.ModelStats{Model: m.Name, Class: m.Class, Requests: len(samples)}
	var ttft, tpot []float64
	met := 0
	for _, s := range samples {
		if s.err != nil {
			ms.Failed++
			continue
		}
		ms.Completed++
		t := s.ttft * b.o.timeScale
		ttft = append(ttft, t)
		if s.tpot > 0 {
			tpot = append(tpot, s.tpot*b.o.timeScale)
		}
		if m.SLOTTFTSeconds == 0 || t <= m.SLOTTFTSeconds {
			met++
		}
	}
	if ms.Completed > 0 {
		ms.SLO = simserve.Round(float64(met)/float64(ms.Completed), 3)
	}
	ms.TTFTP50 = simserve.Round(simserve.Percentile(ttft, 50), 3)
	ms.TTFTP95 = simserve.Round(simserve.Percentile(ttft, 95), 3)
	ms.TTFTP99 = simserve.Round(simserve.Percentile(ttft, 99), 3)
	ms.TPOTP95 = simserve.Round(simserve.Percentile(tpot, 95), 4)
	return ms
}

// benchAgree is the largest relative gap between the live and the
// replayed p95 TTFT that counts as agreement: within 15%.
const benchAgree = 0.15

// agreement counts the comparisons with both p95s and those within
// benchAgree of each other.
func (res *benchVariant) agreement() (within, compared int) {
	for _, c := range res.Compare {
		if c.Ratio <= 0 {
			continue
		}
		compared++
		if math.Abs(c.LiveP95-c.SimP95) <= benchAgree*c.SimP95 {
			within++
		}
	}
	return within, compared
}

// writeBench prints each variant's matrix, flags and isolation checks as
// simulate interference does, then each cell's live p95 TTFT against the
// replayed one.
func writeBench(w io.Writer, res *benchResult) error {
	for k, v := range res.Variants {
		if k > 0 {
			fmt.Fprintln(w)
		}
		if v.Error != "" {
			fmt.Fprintf(w, "variant %s FAILED: %s\n", v.Variant, v.Error)
			continue
		}
		fmt.Fprintf(w, "live on one simulated %s (%s), time ×%g, %g config-seconds per cell, requests to the %s; %d of %d requests answered\n",
			res.Device, res.Card, res.TimeScale, v.Seconds, v.Via, v.Answered, v.Requests)
		if v.BackgroundRequests > 0 {
			fmt.Fprintf(w, "background batches beside the interactive models: %d of %d requests answered in full\n", v.BackgroundAnswered, v.BackgroundRequests)
		}
		fmt.Fprintln(w)
		if err := writeBenchVariant(w, v); err != nil {
			return err
		}
	}
	if res.IsolationViolations > 0 {
		_, err := fmt.Fprintf(w, "\nFAILED: %d isolation violations\n", res.IsolationViolations)
		return err
	}
	return nil
}

func writeBenchVariant(w io.Writer, res *benchVariant) error {
	if err := simserve.WriteMatrix(w, res.MatrixResult); err != nil {
		return err
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CELL\tMIX\tMODEL\tANSWERED\tLIVE P95 TTFT\tSIM P95 TTFT\tLIVE P95 IN ENGINE\tSIM P95 NO OVERHEAD\tENGINE LATE P95\tOVERHEAD P50/P95\tLIVE/SIM")
	for _, c := range res.Compare {
		ratio := "n/a"
		if c.Ratio > 0 {
			ratio = fmt.Sprintf("%g", c.Ratio)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%gs\t%gs\t%gs\t%gs\t%gs\t%gs/%gs\t%s\n", strings.Join(c.Models, "+"), c.Mix, c.Model, c.Answered, c.LiveP95, c.SimP95, c.LiveEngineP95, c.SimBareP95, c.LiveLateP95, c.OverheadP50, c.OverheadP95, ratio)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	within, compared := res.agreement()
	_, err := fmt.Fprintf(w, "\n%d of %d model-cells within %.0f%% of the replay\n", within, compared, 100*benchAgree)
	return err
}

// writeBenchHTML writes simulate interference's report with each
// variant's heatmap, flags and isolation checks, with each variant's
// live/replayed comparison added before its end.
func writeBenchHTML(path string, res *benchResult) error {
	var page bytes.Buffer
	var all []*simserve.MatrixResult
	for _, v := range res.Variants {
		all = append(all, v.MatrixResult)
	}
	if err := simserve.WriteMatricesHTML(&page, all); err != nil {
		return err
	}
	var table bytes.Buffer
	for _, v := range res.Variants {
		if v.Error != "" {
			fmt.Fprintf(&table, "<h2>Variant %s failed</h2>\n<p class=\"bad\">%s</p>\n", html.EscapeString(v.Variant), html.EscapeString(v.Error))
			continue
		}
		within, compared := v.agreement()
		fmt.Fprintf(&table, "<h2>Live p95 TTFT against the simulated replay (%s, requests to the %s)</h2>\n<p>%d of %d model-cells within %.0f%%.</p>\n",
			html.EscapeString(v.Variant), v.Via, within, compared, 100*benchAgree)
		table.WriteString("<table><tr><th>cell</th><th>mix</th><th>model</th><th>answered</th><th>live p95</th><th>sim p95</th><th>live p95 in the engine</th><th>sim p95 without overhead</th><th>overhead p50</th><th>live/sim</th></tr>\n")
		for _, c := range v.Compare {
			fmt.Fprintf(&table, "<tr><td>%s</td><td>%s</td><td>%s</td><td>%d</td><td>%gs</td><td>%gs</td><td>%gs</td><td>%gs</td><td>%gs</td><td>%g</td></tr>\n",
				html.EscapeString(strings.Join(c.Models, "+")), html.EscapeString(c.Mix), html.EscapeString(c.Model), c.Answered, c.LiveP95, c.SimP95, c.LiveEngineP95, c.SimBareP95, c.OverheadP50, c.Ratio)
		}
		table.WriteString("</table>\n")
	}
	if res.IsolationViolations > 0 {
		fmt.Fprintf(&table, "<p class=\"bad\">FAILED: %d isolation violations.</p>\n", res.IsolationViolations)
	}
	table.WriteString("</body>")
	out := strings.Replace(page.String(), "</body>", table.String(), 1)
	return os.WriteFile(path, []byte(out), 0o644)
}
