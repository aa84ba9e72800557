package cli

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpuplane/gpuplane/node/servesim"
)

// `gpuplane simulate serve`: the residency controller and the gateway's
// queues in virtual time over request traces on a simulated card, beside
// the baselines people use today (docs/simulate.md).

const serveConfigHelp = `Config (YAML; unknown fields are errors; see examples/serve/home.yaml):

  card:       {name, memoryGiB, headroomPercent (default 5)}
  models:     list of
    name, class (interactive|standard|background; default interactive),
    residency (pinned|warm|onDemand, default onDemand: gpuplane's; static
    pins what fits),
    memoryGiB (resident: overhead+weights+KV pool), peakGiB (while loading,
    default memoryGiB), residualGiB (asleep, default 5%), canSleep (true),
    loadSeconds, wakeSeconds (default load/10), sleepSeconds, stopSeconds (1),
    tokensPerSecond (one stream alone on the card), prefillTokensPerSecond
    (0: prefill is free), batchSlowdown (α, 0.03), computePercent (100),
    maxInFlight (16), kvTokens (KV pool in tokens, 0: unbounded),
    keepAliveSeconds (ollama's keep_alive, 300),
    sloTTFTSeconds, sloTPOTSeconds (targets; 0: none),
    adapters (LoRA names, asked for as "model:adapter"), maxAdapters (4
    loaded at once), adapterLoadSeconds (0.2)
  tenants:    list of {name, weight (1)}
  traces:     list of {file (base-name pattern), path (read when no --trace
              is given, relative to the config; skipped when absent), model,
              tenants (drawn per request from the seed), timeScale (×times,
              default 1), offsetSeconds, maxOutputTokens, adapters and
              adapterPercent (share of requests asking for one of these
              adapters, default 100); for GenTD26: models {checkpoint:
              model}, otherModel, tokensPerImageStep}
  synthetic:  list of {model, tenants, ratePerSecond (Poisson, open loop) or
              concurrency (closed loop: a batch job), promptTokens,
              outputTokens (uniform ±50%), onSeconds/offSeconds (bursts)}
  durationSeconds: when arrivals stop (default: the last trace arrival, or 1h)
  warmupSeconds: requests before it run but are not measured (0)
  ollama:     {maxLoaded (3), numParallel (1), maxQueue (512)}
  llamaswap:  {concurrencyLimit (10)}

Traces: the Azure LLM inference trace CSV (TIMESTAMP,ContextTokens,
GeneratedTokens; a traces entry names its model), the GenTD26 request CSV
(lora_request_trace_*.csv; prompt = prompt_length + negative_prompt_length,
output = images × steps × tokensPerImageStep, groupId hashed onto the
entry's tenants, a row with num_lora > 0 asks for its group's adapter of
the model) and gpuplane's JSONL, one request a line: {"time": s, "model":
m or "m:adapter", "tenant": t (optional), "prompt_tokens": n,
"output_tokens": n}, times in seconds, non-decreasing, unknown fields
rejected.

Policies (node/servesim/baselines.go names each one's source):
gpuplane (node/residency + node/gateway/queue, the agent's code); ollama
(its current scheduler: a loaded runner's requests take the fast path,
loads are asynchronous, ≤3 loaded, keep_alive 5m, the idle runner with the
shortest keep_alive unloads first, NUM_PARALLEL 1, queue 512 then 503,
reloads from the page cache); ollama-np4 (the same, NUM_PARALLEL 4);
llamaswap (the recommended groups: small models persistent, big ones in
swap groups, 10 in flight per model then 429); static (the models that
fit at once in config order, pinned; the rest rejected); static-best (the
set of models to pin that holds the most models at SLO, by an exact search
bounded by --static-best-cap sets); ideal (each model alone on a card of
its own: an upper bound for every model under every policy).`

func newSimulateServeCommand(g *globals) *cobra.Command {
	var (
		configPath, policy string
		traces             []string
		seed               uint64
		timeScale          float64
		sweepRates         []float64
		htmlPath           string
		priors             string
		staticBestCap      int
		family             int
		familyDir          string
		bestEffort         bool
		from               fromNode
	)
	c := &cobra.Command{
		Use:   "serve --config FILE [--trace FILE]... [--policy P|all] [--seed N]",
		Short: "Replay request traces on a simulated card under gpuplane and the baselines",
		Long: `Replay request traces in virtual time on one simulated card, with the same
residency controller and gateway queue code the agents run and the sim
engine's model of loads, wakes, decode rate, continuous batching, KV growth
and compute sharing. Hours of trace take seconds; the same config, traces
and seed always give the same output.

Every offered request is scored: a rejected or failed request misses its
SLO, and one that never had a first token counts as ∞ in the TTFT
percentiles (null in JSON). It prints, per policy: models at SLO (≥ 90% of
their offered requests within SLO; a background model must also complete
half of what it completes under ideal), starved models (served < 50% of their
offered requests where static-best or ideal serves ≥ 90%; those two run as
references when not asked for), goodput (requests within SLO per second),
offered, completed, rejected and failed requests, SLO attainment per class,
interactive TTFT p95, TPOT p95, cold loads and wakes per hour, evictions,
background tokens/s, the tenant fairness gap and ledger violations; then
each policy's per-model table (offered, done, rejected, failed, SLO %,
TTFT p50/p95/p99). --policy all runs them side by side, -o json prints
the result objects.

--sweep-rate scales every trace's and open-loop stream's rate and prints
interactive SLO attainment per policy per rate and each policy's
maxRateAt90: the largest rate swept with ≥ 90% (0 when none); --html
draws the curves.

` + serveConfigHelp,
		Example: `  gpuplane simulate serve --config examples/serve/home.yaml --policy all
  gpuplane simulate serve --config home.yaml --trace AzureLLMInferenceTrace_conv.csv --trace extra.jsonl -o json`,
		Args: argsNamed(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if from.node != "" || from.record != "" || from.saveRecord != "" || from.whatIf() || cmd.Flags().Changed("card") || cmd.Flags().Changed("since") {
				from.noBestEffort = !bestEffort
				return g.runFromNode(cmd, from, configPath, policy, seed)
			}
			if family < 0 {
				return usageErrorf(cmd, "invalid --family %d: must be ≥ 1", family)
			}
			if family > 0 && configPath != "" {
				return usageErrorf(cmd, "--family draws its own configs: give it or --config, not both")
			}
			if familyDir != "" && family == 0 {
				return usageErrorf(cmd, "--family-dir writes a family's configs: give --family N too")
			}
			if configPath == "" && family == 0 {
				return usageErrorf(cmd, "required flag --config not set")
			}
			policies := servesim.Policies
			if !strings.EqualFold(policy, policyAll) {
				p, err := servesim.ParsePolicy(policy)
				if err != nil {
					return usageErrorf(cmd, "invalid --policy %q: want %s or %s", policy, strings.Join(servesim.Policies, ", "), policyAll)
				}
				policies = []string{p}
			}
			if timeScale < 0 {
				return usageErrorf(cmd, "invalid --time-scale %g: must be > 0", timeScale)
			}
			switch priors {
			case "none", "exact":
			default:
				return usageErrorf(cmd, "invalid --priors %q: want none (learned, as the agent does) or exact", priors)
			}
			if staticBestCap < 1 {
				return usageErrorf(cmd, "invalid --static-best-cap %d: must be ≥ 1", staticBestCap)
			}
			if family > 0 {
				if len(traces) > 0 || len(sweepRates) > 0 || htmlPath != "" || !strings.EqualFold(policy, policyAll) && cmd.Flags().Changed("policy") {
					return usageErrorf(cmd, "--family runs every policy on its own configs and traces: --trace, --sweep-rate, --html and --policy do not apply")
				}
				return runFamily(g, family, seed, familyDir, priors == "exact", staticBestCap, !bestEffort)
			}
			cfg, err := servesim.LoadConfig(configPath)
			if err != nil {
				return fmt.Errorf("simulate serve: %w", err)
			}
			cfg.ExactPriors = priors == "exact"
			cfg.StaticBestCap = staticBestCap
			cfg.NoBestEffort = !bestEffort
			if timeScale > 0 {
				for i := range cfg.Traces {
					cfg.Traces[i].TimeScale = timeScale
				}
			}
			if len(traces) == 0 {
				found, missing := cfg.DefaultTraces()
				for _, m := range missing {
					fmt.Fprintf(g.stderr, "simulate serve: trace %s not found: skipped\n", m)
				}
				traces = found
			}
			if len(sweepRates) > 0 {
				for _, r := range sweepRates {
					if !(r > 0) {
						return usageErrorf(cmd, "invalid --sweep-rate %g: every rate must be > 0", r)
					}
				}
				start := time.Now()
				sw, err := servesim.Sweep(cfg, traces, seed, policies, sweepRates)
				if err != nil {
					return fmt.Errorf("simulate serve: %w", err)
				}
				fmt.Fprintf(g.stderr, "simulate serve: swept %d rates × %d policies in %.2f s\n", len(sweepRates), len(policies), time.Since(start).Seconds())
				if htmlPath != "" {
					if err := writeSweepHTML(htmlPath, cfg, sw); err != nil {
						return fmt.Errorf("simulate serve: --html: %w", err)
					}
				}
				return g.printValue(sw, func(w io.Writer) error { return servesim.WriteSweepTable(w, sw) })
			}
			if htmlPath != "" {
				return usageErrorf(cmd, "--html draws a sweep: give --sweep-rate too")
			}
			w, err := servesim.NewWorkload(cfg, traces, seed)
			if err != nil {
				return fmt.Errorf("simulate serve: %w", err)
			}
			start := time.Now()
			results, err := servesim.RunAll(cfg, w, policies, seed, func(r servesim.Result) {
				fmt.Fprintf(g.stderr, "simulate serve: %s: %d requests offered, %.0f s of trace\n", r.Policy, r.Requests, r.DurationSeconds)
			})
			if err != nil {
				return fmt.Errorf("simulate serve: %w", err)
			}
			what := fmt.Sprintf("%d policies", len(policies))
			if len(policies) == 1 {
				what = "1 policy"
			}
			if !slices.Contains(policies, servesim.PolicyStaticBest) || !slices.Contains(policies, servesim.PolicyIdeal) {
				// The references ran (they judge starved models) but are not shown.
				what += " (static-best and ideal also ran, as references, not shown)"
			}
			fmt.Fprintf(g.stderr, "simulate serve: %s in %.2f s\n", what, time.Since(start).Seconds())
			for _, r := range results {
				if x := r.StaticBestSearch; x != nil {
					fmt.Fprintf(g.stderr, "simulate serve: static-best's search: %d of %d sets in %.2f s (cap %d sets, proven %v)\n", x.Simulated, x.Candidates, x.Seconds, x.Cap, x.Proven)
				}
			}
			write := func(w io.Writer) error { return servesim.WriteTable(w, results) }
			if len(results) == 1 {
				return g.printValue(results[0], write)
			}
			return g.printValue(results, write)
		},
	}
	f := c.Flags()
	f.StringVar(&configPath, "config", "", "card, models, tenants and trace mapping (YAML)")
	f.StringArrayVar(&traces, "trace", nil, "trace file: Azure LLM or GenTD26 CSV (.csv) or gpuplane JSONL (.jsonl); repeatable (default: the config's traces paths)")
	f.StringVar(&policy, "policy", "gpuplane", "policy: "+strings.Join(servesim.Policies, ", ")+" or "+policyAll)
	f.Uint64Var(&seed, "seed", 1, "seed for tenants and synthetic streams")
	f.Float64Var(&timeScale, "time-scale", 0, "override every traces entry's timeScale (1 = the trace's own rate)")
	f.Float64SliceVar(&sweepRates, "sweep-rate", nil, "run at each of these multiples of every trace's and open-loop stream's rate and print interactive SLO attainment per policy per rate and each policy's maxRateAt90 (e.g. 0.5,1,2,4)")
	f.StringVar(&htmlPath, "html", "", "with --sweep-rate, write the SLO-attainment-against-rate curves to this file (HTML with inline SVG)")
	f.StringVar(&priors, "priors", "none", "what gpuplane's controller knows at the start: none (each model's share only; load and wake times, footprints and residuals learned as the agent learns them) or exact (the config's figures)")
	f.IntVar(&staticBestCap, "static-best-cap", servesim.DefaultStaticBestCap, "the most sets static-best's exact search simulates; past it the best found is kept and reported as not proven")
	f.BoolVar(&bestEffort, "best-effort", true, "gpuplane's controller protects the largest set of models the card can hold and serves the others best-effort (docs/residency.md), as the agent does by default; false: without it (gpuplane agent --best-effort=false)")
	f.IntVar(&family, "family", 0, "draw this many configs from --seed (examples/serve/README.md gives the distributions), run every policy on each and print one row per config and the goals' summary")
	f.StringVar(&familyDir, "family-dir", "", "with --family, also write each drawn config here (NAME.yaml), to run again with --config")
	f.StringVar(&from.node, "from-node", "", "replay the requests this node's gateway served from one card (its request record), with that card's deployments and the profiles the node learned, instead of --config and --trace")
	f.StringVar(&from.saveRecord, "save-record", "", "with --from-node, also write what was read from the node (the card's requests, deployments and learned profiles) to this file (JSON), to replay later with --record")
	f.StringVar(&from.record, "record", "", "replay a record written by --save-record instead of asking a node (--card-memory, --add, --remove and --set apply)")
	f.IntVar(&from.card, "card", -1, "with --from-node: the card (default: the only one with requests)")
	f.DurationVar(&from.since, "since", 0, "with --from-node: only the requests of this last while, e.g. 24h (default: all the node kept)")
	f.StringVar(&from.cardMemory, "card-memory", "", "with --from-node, what if the card had this much memory (e.g. 48GiB)")
	f.StringArrayVar(&from.add, "add", nil, "with --from-node, what if this deployment descriptor (FILE) were on the card too; repeatable")
	f.StringArrayVar(&from.remove, "remove", nil, "with --from-node, what if MODEL were not on the card; repeatable")
	f.StringArrayVar(&from.set, "set", nil, "with --from-node, what if MODEL.FIELD=VALUE (class, residency or memoryGiB), e.g. vision.class=standard; repeatable")
	_ = c.MarkFlagFilename("config", "yaml", "yml")
	_ = c.MarkFlagFilename("trace", "csv", "jsonl")
	_ = c.RegisterFlagCompletionFunc("policy", cobra.FixedCompletions(append(append([]string(nil), servesim.Policies...), policyAll), cobra.ShellCompDirectiveNoFileComp))
	return c
}

// runFamily draws a family of configs, runs every policy on each and
// prints the rows and the summary.
func runFamily(g *globals, n int, seed uint64, dir string, exact bool, staticBestCap int, noBestEffort bool) error {
	fam, err := servesim.GenerateFamily(seed, n, servesim.FindAzureDir())
	if err != nil {
		return fmt.Errorf("simulate serve: %w", err)
	}
	if dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("simulate serve: --family-dir: %w", err)
		}
		for _, fc := range fam {
			if err := os.WriteFile(filepath.Join(dir, fc.Name+".yaml"), fc.YAML, 0o644); err != nil {
				return fmt.Errorf("simulate serve: --family-dir: %w", err)
			}
		}
	}
	for _, fc := range fam {
		fc.Cfg.ExactPriors = exact
		fc.Cfg.StaticBestCap = staticBestCap
		fc.Cfg.NoBestEffort = noBestEffort
	}
	start := time.Now()
	fr, err := servesim.RunFamily(fam, seed, false, func(r servesim.FamilyRow) {
		fmt.Fprintf(g.stderr, "simulate serve: %s: %d models on %g GiB in %.1f s\n", r.Config, r.Models, r.CardGiB, r.Seconds)
	})
	if err != nil {
		return fmt.Errorf("simulate serve: %w", err)
	}
	fmt.Fprintf(g.stderr, "simulate serve: %d configs in %.1f s\n", n, time.Since(start).Seconds())
	return g.printValue(fr, func(w io.Writer) error { return servesim.WriteFamilyTable(w, fr) })
}

func writeSweepHTML(path string, cfg *servesim.Config, sw *servesim.SweepResult) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := servesim.WriteSweepHTML(f, "gpuplane simulate serve: SLO attainment against request rate ("+cfg.Card.Name+")", []*servesim.SweepResult{sw}); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
