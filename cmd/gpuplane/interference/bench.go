// Package interference is `gpuplane bench interference`, the live
// interference benchmark: the interference matrix of docs/simulate.md on
// a real dev agent (in process) and real sim engine processes on one
// simulated card, the live counterpart of `simulate interference`. Both
// use the same mixes, sets and summary (servesim.Sets, Mix.Stream,
// servesim.Summarize), so the reports read the same; this one adds, per
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
// (servesim.ReplaySet): the requests sent, at the times sent, on the same
// models, each with its own path to and from the engine measured on this
// machine (the sim engine's timing headers) for what the simulator does
// not model (HTTP, the node's front), which the time scale multiplies like
// everything else.
package interference

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"

	"github.com/gpuplane/gpuplane/cmd/gpuplane/agent"
	"github.com/gpuplane/gpuplane/fsm/descriptor"
	"github.com/gpuplane/gpuplane/internal/catalog"
	"github.com/gpuplane/gpuplane/internal/engines"
	"github.com/gpuplane/gpuplane/node/gateway/queue"
	"github.com/gpuplane/gpuplane/node/servesim"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
	"github.com/gpuplane/gpuplane/proto/gpuplane/v1/gpuplanev1connect"
)

// Clients are the API clients of one variant's agent the bench uses.
type Clients struct {
	Models       gpuplanev1connect.ModelServiceClient
	Accelerators gpuplanev1connect.AcceleratorServiceClient
	Residency    gpuplanev1connect.ResidencyServiceClient
}

// Options are a run's settings besides the config, mixes and variants.
type Options struct {
	// Duration is the wall time each cell sends requests for, after its
	// warm-up; TimeScale how many times faster than the config the
	// engines and mixes run; Seed seeds the request streams.
	Duration  time.Duration
	TimeScale float64
	Seed      uint64
	// Via is where the requests go: ViaFronts or ViaGateway.
	Via string
	// Transport, when set, carries the bench's requests to the node (a
	// test plants faults in it).
	Transport http.RoundTripper
}

// Validate checks o as Run needs it; the error names the field and the
// rule (the CLI checks its flags the same way first).
func (o Options) Validate() error {
	switch {
	case o.Duration <= 0:
		return fmt.Errorf("bench interference: Duration is %v: it must be > 0", o.Duration)
	case o.TimeScale < 1:
		return fmt.Errorf("bench interference: TimeScale is %g: it must be ≥ 1", o.TimeScale)
	case o.Via != ViaFronts && o.Via != ViaGateway:
		return fmt.Errorf("bench interference: Via is %q: it must be %q or %q", o.Via, ViaFronts, ViaGateway)
	}
	return nil
}

// Transport, when set, carries the bench's requests (a test plants
// isolation faults in it); nil: the default transport.
var Transport http.RoundTripper

// Where the bench sends a matrix's requests.
const (
	ViaFronts  = "fronts"
	ViaGateway = "gateway"
)

// Result is every variant's report; the first variant's is also at
// its top, as a run without --variants prints it.
type Result struct {
	*VariantResult
	Device    string  `json:"device"`
	TimeScale float64 `json:"timeScale"`
	// Variants are every variant's matrix, in the order run.
	Variants []*VariantResult `json:"variants"`
	// IsolationViolations sums the variants' isolation violations.
	IsolationViolations int `json:"isolationViolations"`
	// Failed counts the variants that could not run to the end (each
	// says why in its error).
	Failed int `json:"failedVariants,omitempty"`
}

// VariantResult is simulate interference's report of one variant's live
// cells, with the comparison with the simulated matrix and the isolation
// checks (MatrixResult.Isolation).
type VariantResult struct {
	*servesim.MatrixResult
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
	Compare []Comparison `json:"compare"`
	// Requests and Answered count every request sent and every one
	// answered 200 with its first token.
	Requests int `json:"requests"`
	Answered int `json:"answered"`
	// Within counts the comparisons whose live p95 is within 15% of the
	// replayed one, of Compared with both.
	Within   int `json:"withinTolerance"`
	Compared int `json:"compared"`
}

type Comparison struct {
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

// Subset keeps the config's models named in list, in config order.
func Subset(cfg *servesim.Config, list string) (*servesim.Config, error) {
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

func ParseMixes(list string) ([]servesim.Mix, error) {
	var out []servesim.Mix
	for name := range strings.SplitSeq(list, ",") {
		name = strings.TrimSpace(name)
		i := slices.IndexFunc(servesim.Mixes, func(m servesim.Mix) bool { return m.Name == name })
		if i < 0 {
			var known []string
			for _, m := range servesim.Mixes {
				known = append(known, m.Name)
			}
			return nil, fmt.Errorf("invalid --mix %q: want a comma-separated list of %s", name, strings.Join(known, ", "))
		}
		if !slices.ContainsFunc(out, func(m servesim.Mix) bool { return m.Name == name }) {
			out = append(out, servesim.Mixes[i])
		}
	}
	return out, nil
}

// benchDevice is the catalog kind whose memory is closest to the card's,
// within 10%.
func benchDevice(cfg *servesim.Config) (catalog.Device, error) {
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
func benchSpec(cfg *servesim.Config, m *servesim.ModelConfig, accel string, scale float64) *descriptor.ModelDeploymentSpec {
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
		Engine:    descriptor.Engine{Kind: engines.Sim, Memory: &mem, Args: args, Quantization: m.Quantization},
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

// Run runs the matrix once per variant, each on an agent of its own;
// connectTo returns the API clients of the agent at a URL.
func Run(ctx context.Context, cfg *servesim.Config, mixes []servesim.Mix, variants []servesim.Variant, o Options, progress io.Writer, connectTo func(url string) (*Clients, error)) (*Result, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if len(variants) == 0 {
		return nil, fmt.Errorf("bench interference: no variant to run")
	}
	dev, err := benchDevice(cfg)
	if err != nil {
		return nil, err
	}
	res := &Result{Device: dev.Slug, TimeScale: o.TimeScale}
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
			r = &VariantResult{MatrixResult: &servesim.MatrixResult{Card: cfg.Card.Name, Variant: v.Name}, Error: err.Error()}
			res.Failed++
		}
		res.Variants = append(res.Variants, r)
		res.IsolationViolations += r.Isolation.Violations()
	}
	res.VariantResult = res.Variants[0]
	return res, nil
}

// runVariant starts an agent, runs every set and mix of cfg (a variant's)
// on it and reports.
func runVariant(ctx context.Context, cfg *servesim.Config, v servesim.Variant, dev catalog.Device, mixes []servesim.Mix, o Options, progress io.Writer, connectTo func(url string) (*Clients, error)) (*VariantResult, error) {
	dir, err := os.MkdirTemp("", "gpuplane-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	weights := map[string]float64{}
	for _, t := range cfg.Tenants {
		weights[t.Name] = t.Weight
	}
	var a *agent.Agent
	// A port found free may be taken by another process before the
	// agent binds it: then the agent starts again on other ports.
	for attempt := 1; ; attempt++ {
		raft, err := benchFreePort()
		if err != nil {
			return nil, err
		}
		gossip, err := benchFreePort()
		if err != nil {
			return nil, err
		}
		startCtx, cancel := context.WithTimeout(ctx, time.Minute)
		a, err = agent.Start(startCtx, agent.Config{Dev: true, NodeName: "bench", DataDir: dir, RaftPort: raft, GossipPort: gossip,
			SimGPUs: dev.Slug + "=1", Enforce: "none", ResidencyTimeScale: o.TimeScale,
			Gateway: agent.GatewayConfig{Weights: weights, Queue: queue.Config{NoPreemption: cfg.NoPreemption}}})
		cancel()
		if err == nil {
			break
		}
		if attempt == 3 || !errors.Is(err, syscall.EADDRINUSE) {
			return nil, fmt.Errorf("start the agent: %w", err)
		}
		if err := os.RemoveAll(dir); err != nil {
			return nil, err
		}
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, err
		}
	}
	defer a.Close()
	via := o.Via
	if cfg.BackgroundBeside {
		// Classes and preemption are the gateway's.
		via = ViaGateway
	}
	// A request waits at a front for at most the node's wait for a load
	// (2 minutes); this only bounds a request that is never answered.
	b := &bench{cfg: cfg, o: o, http: &http.Client{Timeout: 10 * time.Minute, Transport: o.Transport}, progress: progress,
		via: via, gateway: a.GatewayURL(), iso: &servesim.Isolation{}}
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
	res := &VariantResult{MatrixResult: &servesim.MatrixResult{Card: cfg.Card.Name, Variant: v.Name, Seconds: o.Duration.Seconds() * o.TimeScale,
		Thrashing: servesim.MatrixThrash, Isolation: b.iso}, Via: via}
	for _, m := range cfg.Models {
		res.Models = append(res.Models, m.Name)
	}
	sets := servesim.Sets(len(cfg.Models))
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
	servesim.Summarize(cfg, res.MatrixResult)
	res.Requests, res.Answered = b.requests, b.answered
	res.BackgroundRequests, res.BackgroundAnswered = b.asideRequests, b.asideAnswered
	res.Within, res.Compared = res.agreement()
	return res, nil
}

type bench struct {
	cfg  *servesim.Config
	o    Options
	api  *Clients
	http *http.Client
	// progress is where failed requests are reported, with their errors.
	progress io.Writer

	// setStart is when the running set's warm-up began.
	setStart time.Time
	// via is where requests go (ViaFronts, ViaGateway); gateway is the
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
	iso *servesim.Isolation
}

// runSet deploys the set's models, warms each with one request, measures
// each model's per-request overhead, runs each mix, deletes the models
// again and replays the set's timeline in the simulator.
func (b *bench) runSet(ctx context.Context, accel string, setIdx int, set []int, mixes []servesim.Mix) ([]servesim.Cell, []Comparison, error) {
	var names []string
	// The set's timeline starts as its models are deployed: pinned and
	// warm ones load when placed, in the replay as live.
	b.setStart = time.Now()
	for _, i := range set {
		m := &b.cfg.Models[i]
		names = append(names, m.Name)
		spec := benchSpec(b.cfg, m, accel, b.o.TimeScale)
		if _, err := b.api.Models.ApplyModel(ctx, connect.NewRequest(&pb.ApplyModelRequest{Name: m.Name, Spec: spec.Proto()})); err != nil {
			return nil, nil, fmt.Errorf("deploy %s: %w", m.Name, err)
		}
	}
	defer b.remove(names)
	endpoints, err := b.endpoints(ctx, names)
	if err != nil {
		return nil, nil, err
	}
	scale := b.o.TimeScale
	// The warm-up: one request per model, so that each cell measures a
	// card that has loaded its models once (simulate interference's
	// warm-up does the same in virtual time).
	var wg sync.WaitGroup
	warm := make([]error, len(set))
	var warmReqs []servesim.LiveRequest
	for k, i := range set {
		name := b.cfg.Models[i].Name
		warmReqs = append(warmReqs, servesim.LiveRequest{Time: time.Since(b.setStart).Seconds() * scale, Model: name, PromptTokens: 16, OutputTokens: 4})
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
	var cells []servesim.Cell
	var phases []servesim.LivePhase
	// engineP95[cell][model] is the p95 of the engine's own part of the
	// TTFT (config seconds).
	var engineP95, lateP95 [][]float64
	for _, mix := range mixes {
		seq, err := b.lastDecision(ctx)
		if err != nil {
			return nil, nil, err
		}
		cell := servesim.Cell{Models: names, Mix: mix.Name}
		per := make([][]sample, len(set))
		began := time.Now()
		phase := servesim.LivePhase{Mix: mix.Name, Start: began.Sub(b.setStart).Seconds() * scale}
		phase.End = phase.Start + b.o.Duration.Seconds()*scale
		// aside[k] are the requests of the background batch beside model
		// k's own traffic (Config.Beside), if it gets one.
		aside := make([][]sample, len(set))
		for k, i := range set {
			m := &b.cfg.Models[i]
			st := mix.Stream(m)
			if st.Concurrency > 0 {
				phase.Closed = append(phase.Closed, servesim.LiveClosed{Model: m.Name, Concurrency: st.Concurrency,
					PromptTokens: st.PromptTokens, OutputTokens: st.OutputTokens})
			}
			wg.Go(func() {
				per[k] = b.drive(ctx, endpoints[k], m, st, b.o.Seed<<16|uint64(i))
			})
			if bg, ok := b.cfg.Beside(m); ok {
				wg.Go(func() {
					aside[k] = b.drive(ctx, endpoints[k], m, bg, b.o.Seed<<16|uint64(i)|1<<15)
				})
			}
		}
		wg.Wait()
		for k, i := range set {
			m := &b.cfg.Models[i]
			if bg, ok := b.cfg.Beside(m); ok {
				sent := slices.Clone(aside[k])
				slices.SortStableFunc(sent, func(x, y sample) int { return cmpFloat(x.at, y.at) })
				cl := servesim.LiveClosed{Model: m.Name, Concurrency: bg.Concurrency, PromptTokens: bg.PromptTokens, OutputTokens: bg.OutputTokens, Aside: true}
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
		cell.ColdLoadsPerHour = servesim.Round(float64(loads)/hours, 1)
		cell.WakesPerHour = servesim.Round(float64(wakes)/hours, 1)
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
			eng = append(eng, servesim.Round(servesim.Percentile(own, 95), 3))
			late = append(late, servesim.Round(servesim.Percentile(lateness, 95), 3))
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
		slices.SortStableFunc(phase.Open, func(x, y servesim.LiveRequest) int { return cmpFloat(x.Time, y.Time) })
		cells = append(cells, cell)
		phases = append(phases, phase)
	}
	if err := b.probeCaches(ctx, setIdx, names); err != nil {
		return nil, nil, err
	}
	ro := servesim.ReplayOptions{Overhead: path, Seed: b.o.Seed, Gateway: b.via == ViaGateway}
	withOv, err := servesim.ReplaySet(b.cfg, names, warmReqs, phases, ro)
	if err != nil {
		return nil, nil, err
	}
	ro.Bare = true
	bare, err := servesim.ReplaySet(b.cfg, names, warmReqs, phases, ro)
	if err != nil {
		return nil, nil, err
	}
	var cmps []Comparison
	for k, c := range cells {
		for j, ms := range c.PerModel {
			cmp := Comparison{Models: c.Models, Mix: c.Mix, Model: ms.Model, LiveP95: ms.TTFTP95, Answered: ms.Completed,
				SimP95: withOv[k][j].TTFTP95, SimBareP95: bare[k][j].TTFTP95, LiveEngineP95: engineP95[k][j], LiveLateP95: lateP95[k][j],
				OverheadP50: servesim.Round(servesim.Percentile(overhead[ms.Model], 50), 4),
				OverheadP95: servesim.Round(servesim.Percentile(overhead[ms.Model], 95), 4)}
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
