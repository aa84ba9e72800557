package servesim

import (
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/gpuplane/gpuplane/node/gateway/queue"
)

// A family of configs: cards and model mixes nobody tuned for, drawn from
// a seed, each run under every policy (`simulate serve --family N`).
//
// The distributions (documented in examples/serve/README.md, "A family of
// configs"):
//   - card: one of familyCards GiB, uniformly;
//   - models: 3–12, uniformly, each an archetype of familyArchetypes drawn
//     uniformly (repeats get a suffix), its memory the archetype's at a
//     24 GiB card scaled by √(card/24) (bigger cards hold bigger variants)
//     and by U[0.7, 1.4], capped so that its
//     load peak fits the card; load time the archetype's per GiB ×
//     U[0.7, 1.4], wake a tenth of it;
//   - class: the archetype's; an interactive one is standard with
//     probability 0.2;
//   - residency: background models onDemand; the others pinned with
//     probability 0.1 (only models under a tenth of the card), warm 0.25,
//     onDemand otherwise; then the largest reserved ones become onDemand
//     until the reserved shares take at most 70% of the usable memory;
//   - traffic: the archetype's stream with its rate × U[0.5, 2] (closed
//     loops keep their concurrency); the first chat and the first coder
//     replay the Azure LLM 2023 conv and code traces (when found) at a
//     time scale of 1, 2 or 4 instead;
//   - 30 min measured after a 5 min warm-up, two tenants.
type familyArchetype struct {
	name, class              string
	memoryGiB, peakGiB       float64 // at a 24 GiB card
	loadPerGiB               float64 // seconds
	tokensPerSecond, prefill float64
	maxInFlight, kvTokens    int
	sloTTFT                  float64
	rate                     float64 // open loop, per second
	concurrency              int     // closed loop
	prompt, output           int
	onSeconds, offSeconds    float64
	azure                    string // conv or code
	computePercent           float64
}

var familyCards = []float64{12, 16, 24, 32, 40, 48, 64, 80, 94, 141}

var familyArchetypes = []familyArchetype{
	{name: "chat", class: "interactive", memoryGiB: 9, peakGiB: 10, loadPerGiB: 3.3, tokensPerSecond: 85, prefill: 5000, maxInFlight: 16, kvTokens: 65536, sloTTFT: 2, rate: 0.8, prompt: 600, output: 150, azure: "conv"},
	{name: "coder", class: "interactive", memoryGiB: 8.5, peakGiB: 9, loadPerGiB: 3.1, tokensPerSecond: 100, prefill: 5500, maxInFlight: 16, kvTokens: 65536, sloTTFT: 2, rate: 0.4, prompt: 1500, output: 60, azure: "code"},
	{name: "embedder", class: "interactive", memoryGiB: 1.5, loadPerGiB: 3.3, tokensPerSecond: 800, maxInFlight: 32, sloTTFT: 0.5, rate: 0.8, prompt: 300},
	{name: "vision", class: "interactive", memoryGiB: 4, peakGiB: 4.6, loadPerGiB: 4, tokensPerSecond: 120, prefill: 4000, maxInFlight: 8, kvTokens: 32768, sloTTFT: 3, rate: 0.2, prompt: 1000, output: 100, onSeconds: 60, offSeconds: 840},
	{name: "speech", class: "interactive", memoryGiB: 3.5, loadPerGiB: 3.4, tokensPerSecond: 200, prefill: 10000, maxInFlight: 8, kvTokens: 16384, sloTTFT: 3, rate: 0.02, prompt: 1500, output: 150},
	{name: "reranker", class: "interactive", memoryGiB: 1.2, loadPerGiB: 3.3, tokensPerSecond: 600, maxInFlight: 32, sloTTFT: 0.5, rate: 0.5, prompt: 400, output: 1},
	{name: "guard", class: "interactive", memoryGiB: 2, loadPerGiB: 3, tokensPerSecond: 400, maxInFlight: 32, sloTTFT: 0.5, rate: 0.6, prompt: 200, output: 5},
	{name: "reasoner", class: "interactive", memoryGiB: 16, peakGiB: 17, loadPerGiB: 3.5, tokensPerSecond: 40, prefill: 3000, maxInFlight: 8, kvTokens: 65536, sloTTFT: 10, rate: 0.005, prompt: 2000, output: 1000},
	{name: "translate", class: "standard", memoryGiB: 3, loadPerGiB: 4, tokensPerSecond: 120, maxInFlight: 8, sloTTFT: 5, rate: 0.01, prompt: 400, output: 300},
	{name: "sql", class: "standard", memoryGiB: 5, loadPerGiB: 3, tokensPerSecond: 100, maxInFlight: 8, sloTTFT: 5, rate: 0.05, prompt: 800, output: 100},
	{name: "batch", class: "background", memoryGiB: 7, peakGiB: 7.5, loadPerGiB: 4, tokensPerSecond: 60, maxInFlight: 8, concurrency: 2, prompt: 2000, output: 800, computePercent: 25},
	{name: "summarizer", class: "background", memoryGiB: 10, loadPerGiB: 3.5, tokensPerSecond: 60, maxInFlight: 8, concurrency: 1, prompt: 4000, output: 500, computePercent: 25},
}

// FamilyConfig is one generated config: its YAML (what `--family-dir`
// writes, which `--config` runs again) and the parsed config.
type FamilyConfig struct {
	Name string
	YAML []byte
	Cfg  *Config
}

// GenerateFamily draws n configs from the seed (the distributions above).
// azureDir, when not empty, is where the Azure LLM 2023 traces are; the
// configs name them by absolute path (skipped when absent).
func GenerateFamily(seed uint64, n int, azureDir string) ([]FamilyConfig, error) {
	if n < 1 {
		return nil, fmt.Errorf("family: the number of configs must be ≥ 1, got %d", n)
	}
	rng := rand.New(rand.NewPCG(seed, 0xfa3117))
	u := func(lo, hi float64) float64 { return lo + (hi-lo)*rng.Float64() }
	var out []FamilyConfig
	for k := range n {
		name := fmt.Sprintf("f%d-%02d", seed, k+1)
		card := familyCards[rng.IntN(len(familyCards))]
		usable := card * 0.95
		scale := math.Sqrt(card / 24)
		nm := 3 + rng.IntN(10)
		type model struct {
			a                familyArchetype
			name, class, res string
			mem, peak, load  float64
			rate             float64
			azure            string
			timeScale        float64
			wakeSecs         float64
		}
		var ms []model
		seen := map[string]int{}
		azureUsed := map[string]bool{}
		for range nm {
			a := familyArchetypes[rng.IntN(len(familyArchetypes))]
			seen[a.name]++
			m := model{a: a, name: a.name, class: a.class}
			if c := seen[a.name]; c > 1 {
				m.name = fmt.Sprintf("%s%d", a.name, c)
			}
			f := u(0.7, 1.4)
			m.mem = a.memoryGiB * scale * f
			peak := max(a.peakGiB, a.memoryGiB) * scale * f
			if peak > usable*0.9 {
				r := usable * 0.9 / peak
				m.mem, peak = m.mem*r, peak*r
			}
			m.mem, m.peak = roundTo(m.mem, 0.1), roundTo(peak, 0.1)
			m.peak = max(m.peak, m.mem)
			m.load = roundTo(max(2, m.mem*a.loadPerGiB*u(0.7, 1.4)), 1)
			m.wakeSecs = roundTo(max(0.2, m.load/10), 0.1)
			if m.class == "interactive" && rng.Float64() < 0.2 {
				m.class = "standard"
			}
			switch {
			case m.class == "background":
				m.res = "onDemand"
			default:
				p := rng.Float64()
				switch {
				case p < 0.1 && m.mem < usable/10:
					m.res = "pinned"
				case p < 0.35:
					m.res = "warm"
				default:
					m.res = "onDemand"
				}
			}
			if a.concurrency == 0 {
				m.rate = a.rate * u(0.5, 2)
			}
			if a.azure != "" && azureDir != "" && !azureUsed[a.azure] {
				azureUsed[a.azure] = true
				m.azure = a.azure
				m.timeScale = []float64{1, 2, 4}[rng.IntN(3)]
			}
			ms = append(ms, m)
		}
		// Reserved shares take at most 70% of the card.
		for {
			var reserved float64
			big := -1
			for i, m := range ms {
				if m.res != "onDemand" {
					reserved += m.mem
					if big < 0 || m.mem > ms[big].mem {
						big = i
					}
				}
			}
			if reserved <= 0.7*usable || big < 0 {
				break
			}
			ms[big].res = "onDemand"
		}
		var b strings.Builder
		fmt.Fprintf(&b, "# %s: generated by `gpuplane simulate serve --family` (seed %d)\n", name, seed)
		fmt.Fprintf(&b, "card: {name: %s, memoryGiB: %g}\nmodels:\n", name, card)
		for _, m := range ms {
			fmt.Fprintf(&b, "  - {name: %s, class: %s, residency: %s, memoryGiB: %.4g, peakGiB: %.4g, loadSeconds: %.4g, wakeSeconds: %.3g, tokensPerSecond: %g",
				m.name, m.class, m.res, m.mem, m.peak, m.load, m.wakeSecs, m.a.tokensPerSecond)
			if m.a.prefill > 0 {
				fmt.Fprintf(&b, ", prefillTokensPerSecond: %g", m.a.prefill)
			}
			if m.a.kvTokens > 0 {
				fmt.Fprintf(&b, ", kvTokens: %d", m.a.kvTokens)
			}
			if m.a.computePercent > 0 {
				fmt.Fprintf(&b, ", computePercent: %g", m.a.computePercent)
			}
			fmt.Fprintf(&b, ", maxInFlight: %d", m.a.maxInFlight)
			if m.class != "background" {
				fmt.Fprintf(&b, ", sloTTFTSeconds: %g", m.a.sloTTFT)
			}
			b.WriteString("}\n")
		}
		b.WriteString("tenants: [{name: alice}, {name: bob}]\nwarmupSeconds: 300\ndurationSeconds: 2100\n")
		var traces, synth []string
		for _, m := range ms {
			switch {
			case m.azure != "":
				file := "AzureLLMInferenceTrace_" + m.azure + ".csv"
				traces = append(traces, fmt.Sprintf("  - {file: %q, path: %q, model: %s, tenants: [alice, bob], timeScale: %g}",
					file, filepath.Join(azureDir, file), m.name, m.timeScale))
			case m.a.concurrency > 0:
				synth = append(synth, fmt.Sprintf("  - {model: %s, tenants: [alice], concurrency: %d, promptTokens: %d, outputTokens: %d}",
					m.name, m.a.concurrency, m.a.prompt, m.a.output))
			default:
				s := fmt.Sprintf("  - {model: %s, tenants: [alice, bob], ratePerSecond: %.4g, promptTokens: %d, outputTokens: %d",
					m.name, m.rate, m.a.prompt, m.a.output)
				if m.a.onSeconds > 0 {
					s += fmt.Sprintf(", onSeconds: %g, offSeconds: %g", m.a.onSeconds, m.a.offSeconds)
				}
				synth = append(synth, s+"}")
			}
		}
		if len(traces) > 0 {
			b.WriteString("traces:\n" + strings.Join(traces, "\n") + "\n")
		}
		if len(synth) > 0 {
			b.WriteString("synthetic:\n" + strings.Join(synth, "\n") + "\n")
		}
		y := []byte(b.String())
		cfg, err := ParseConfig(name+".yaml", y)
		if err != nil {
			return nil, fmt.Errorf("family: generated %w\n%s", err, y)
		}
		out = append(out, FamilyConfig{Name: name, YAML: y, Cfg: cfg})
	}
	return out, nil
}

func roundTo(x, step float64) float64 { return math.Round(x/step) * step }

// FindAzureDir is the Azure LLM 2023 traces' directory: shared/data/
// azure-llm-2023 in the working directory or one of its parents, or ""
// when there is none.
func FindAzureDir() string {
	dir, err := os.Getwd()
	if err != nil {
		return ""
	}
	for {
		p := filepath.Join(dir, "shared", "data", "azure-llm-2023")
		if _, err := os.Stat(filepath.Join(p, "AzureLLMInferenceTrace_conv.csv")); err == nil {
			return p
		}
		up := filepath.Dir(dir)
		if up == dir {
			return ""
		}
		dir = up
	}
}

// FamilyRow is one config of a family: its card and models, and per
// policy its models at SLO, starved models and the figures the goals use.
type FamilyRow struct {
	Config    string  `json:"config"`
	CardGiB   float64 `json:"cardGiB"`
	Models    int     `json:"models"`
	ModelsGiB float64 `json:"modelsGiB"`
	// AtSLO, Starved (by the starved rule of the table) and
	// InteractiveGoodput (interactive requests within SLO per second) per
	// policy.
	AtSLO              map[string]int     `json:"atSLO"`
	Starved            map[string]int     `json:"starved"`
	InteractiveGoodput map[string]float64 `json:"interactiveGoodput"`
	// GpuplaneStarvedNames: gpuplane's starved models; GpuplaneUnder10:
	// its models that completed < 10% of their offered requests.
	GpuplaneStarvedNames []string `json:"gpuplaneStarved"`
	GpuplaneUnder10      []string `json:"gpuplaneUnder10"`
	// StaticBestUnder10: static-best's models that completed < 10% of
	// their offered requests (the models it reaches its count without).
	StaticBestUnder10 []string `json:"staticBestUnder10"`
	LedgerViolations  int      `json:"ledgerViolations"`
	StaticBestProven  bool     `json:"staticBestProven"`
	Seconds           float64  `json:"-"`
	Results           []Result `json:"results,omitempty"`
}

// FamilySummary is the family's goals (examples/serve/README.md).
type FamilySummary struct {
	Configs int `json:"configs"`
	// AtLeastStaticBest: configs where gpuplane holds ≥ static-best's
	// models at SLO; TwoBelowStaticBest those where it holds ≥ 2 fewer.
	AtLeastStaticBest  int `json:"atLeastStaticBest"`
	TwoBelowStaticBest int `json:"twoBelowStaticBest"`
	// WithinTwoOfIdeal: configs where gpuplane holds ≥ ideal − 2.
	WithinTwoOfIdeal int `json:"withinTwoOfIdeal"`
	// StarvedConfigs: configs where gpuplane starves a model (< 10% of its
	// offered requests completed).
	StarvedConfigs int `json:"starvedConfigs"`
	// GoodputRatioMedian: the median over configs of gpuplane's
	// interactive goodput over the best of ollama, ollama-np4 and
	// llamaswap (configs where all three serve nothing count as ∞).
	GoodputRatioMedian float64 `json:"goodputRatioMedian"`
	LedgerViolations   int     `json:"ledgerViolations"`
	NotProven          int     `json:"staticBestNotProven"`
	// StaticBestStarves: configs where static-best completes < 10% of a
	// model's offered requests; BelowOnlyWhereStaticBestStarves: configs
	// where gpuplane is below static-best's models at SLO and static-best
	// starves a model there.
	StaticBestStarves               int `json:"staticBestStarves"`
	BelowOnlyWhereStaticBestStarves int `json:"belowWhereStaticBestStarves"`
}

// FamilyResult is a family's run.
type FamilyResult struct {
	Seed    uint64        `json:"seed"`
	Rows    []FamilyRow   `json:"rows"`
	Summary FamilySummary `json:"summary"`
}

// interactiveGoodput is r's interactive requests within SLO per second.
func interactiveGoodput(r Result) float64 {
	if r.DurationSeconds <= 0 {
		return 0
	}
	var met float64
	for _, m := range r.Models {
		if m.Class == queue.Interactive.String() {
			met += m.SLO / 100 * float64(m.Requests)
		}
	}
	return met / r.DurationSeconds
}

// RunFamily runs every policy on each config (its default traces, the
// seed's streams) and summarises the goals; each, when set, hears of each
// row as it is done.
func RunFamily(fam []FamilyConfig, seed uint64, keepResults bool, each func(FamilyRow)) (*FamilyResult, error) {
	res := &FamilyResult{Seed: seed}
	for _, fc := range fam {
		start := time.Now()
		traces, _ := fc.Cfg.DefaultTraces()
		w, err := NewWorkload(fc.Cfg, traces, seed)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", fc.Name, err)
		}
		rs, err := RunAll(fc.Cfg, w, Policies, seed, nil)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", fc.Name, err)
		}
		row := FamilyRow{Config: fc.Name, CardGiB: fc.Cfg.Card.MemoryGiB, Models: len(fc.Cfg.Models),
			AtSLO: map[string]int{}, Starved: map[string]int{}, InteractiveGoodput: map[string]float64{},
			GpuplaneStarvedNames: []string{}, GpuplaneUnder10: []string{}, StaticBestUnder10: []string{}}
		for _, m := range fc.Cfg.Models {
			row.ModelsGiB += m.MemoryGiB
		}
		row.ModelsGiB = round(row.ModelsGiB, 1)
		for _, r := range rs {
			row.AtSLO[r.Policy] = r.ModelsAtSLO
			row.Starved[r.Policy] = len(r.StarvedModels)
			row.InteractiveGoodput[r.Policy] = round(interactiveGoodput(r), 3)
			switch r.Policy {
			case "gpuplane":
				row.GpuplaneStarvedNames = r.StarvedModels
				row.LedgerViolations = r.LedgerViolations
				for _, m := range r.Models {
					if m.Requests > 0 && float64(m.Completed) < 0.1*float64(m.Requests) {
						row.GpuplaneUnder10 = append(row.GpuplaneUnder10, m.Model)
					}
				}
			case PolicyStaticBest:
				row.StaticBestProven = r.StaticBestSearch != nil && r.StaticBestSearch.Proven
				for _, m := range r.Models {
					if m.Requests > 0 && float64(m.Completed) < 0.1*float64(m.Requests) {
						row.StaticBestUnder10 = append(row.StaticBestUnder10, m.Model)
					}
				}
			}
		}
		if keepResults {
			row.Results = rs
		}
		row.Seconds = time.Since(start).Seconds()
		res.Rows = append(res.Rows, row)
		if each != nil {
			each(row)
		}
	}
	res.Summary = summarize(res.Rows)
	return res, nil
}

func summarize(rows []FamilyRow) FamilySummary {
	s := FamilySummary{Configs: len(rows)}
	var ratios []float64
	for _, r := range rows {
		g, sb, id := r.AtSLO["gpuplane"], r.AtSLO[PolicyStaticBest], r.AtSLO[PolicyIdeal]
		if g >= sb {
			s.AtLeastStaticBest++
		}
		if len(r.StaticBestUnder10) > 0 {
			s.StaticBestStarves++
			if g < sb {
				s.BelowOnlyWhereStaticBestStarves++
			}
		}
		if g <= sb-2 {
			s.TwoBelowStaticBest++
		}
		if g >= id-2 {
			s.WithinTwoOfIdeal++
		}
		if len(r.GpuplaneUnder10) > 0 {
			s.StarvedConfigs++
		}
		s.LedgerViolations += r.LedgerViolations
		if !r.StaticBestProven {
			s.NotProven++
		}
		best := max(r.InteractiveGoodput["ollama"], r.InteractiveGoodput["ollama-np4"], r.InteractiveGoodput["llamaswap"])
		switch {
		case best > 0:
			ratios = append(ratios, r.InteractiveGoodput["gpuplane"]/best)
		case r.InteractiveGoodput["gpuplane"] > 0:
			ratios = append(ratios, math.Inf(1))
		}
	}
	if len(ratios) > 0 {
		slices.Sort(ratios)
		mid := len(ratios) / 2
		if len(ratios)%2 == 1 {
			s.GoodputRatioMedian = ratios[mid]
		} else {
			s.GoodputRatioMedian = (ratios[mid-1] + ratios[mid]) / 2
		}
		s.GoodputRatioMedian = round(s.GoodputRatioMedian, 2)
	}
	return s
}

// familyPolicies are the table's columns.
var familyPolicies = []string{"gpuplane", "ollama", "ollama-np4", "llamaswap", "static", PolicyStaticBest, PolicyIdeal}

// WriteFamilyTable prints one row per config and the summary.
func WriteFamilyTable(w io.Writer, fr *FamilyResult) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "config\tcard GiB\tmodels (GiB)\t%s\tgpuplane starved\tviolations\t\n", strings.Join(familyPolicies, "\t"))
	for _, r := range fr.Rows {
		cells := []string{r.Config, fmt.Sprint(r.CardGiB), fmt.Sprintf("%d (%g)", r.Models, r.ModelsGiB)}
		for _, p := range familyPolicies {
			c := fmt.Sprint(r.AtSLO[p])
			if p == PolicyStaticBest && !r.StaticBestProven {
				c += "?"
			}
			cells = append(cells, c)
		}
		st := "-"
		if len(r.GpuplaneStarvedNames) > 0 {
			st = strings.Join(r.GpuplaneStarvedNames, ",")
		}
		cells = append(cells, st, fmt.Sprint(r.LedgerViolations))
		fmt.Fprintln(tw, strings.Join(cells, "\t")+"\t")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	writeFamilySummary(w, fr.Summary)
	return nil
}

func writeFamilySummary(w io.Writer, s FamilySummary) {
	pct := func(k int) float64 { return round(100*float64(k)/float64(max(s.Configs, 1)), 1) }
	fmt.Fprintf(w, "\nmodels at SLO: gpuplane ≥ static-best on %d of %d configs (%g%%; goal ≥ 90%%), 2 or more below on %d (goal 0)\n",
		s.AtLeastStaticBest, s.Configs, pct(s.AtLeastStaticBest), s.TwoBelowStaticBest)
	fmt.Fprintf(w, "static-best completes < 10%% of a model's requests on %d configs; gpuplane is below it on %d of those\n", s.StaticBestStarves, s.BelowOnlyWhereStaticBestStarves)
	fmt.Fprintf(w, "gpuplane ≥ ideal − 2 on %d of %d (%g%%; goal ≥ 80%%)\n", s.WithinTwoOfIdeal, s.Configs, pct(s.WithinTwoOfIdeal))
	fmt.Fprintf(w, "configs where gpuplane completes < 10%% of a model's requests: %d (goal 0)\n", s.StarvedConfigs)
	fmt.Fprintf(w, "interactive goodput, gpuplane / best of ollama, ollama-np4, llamaswap: median ×%g (goal ≥ ×1.5)\n", s.GoodputRatioMedian)
	fmt.Fprintf(w, "ledger violations: %d (goal 0); static-best not proven optimal (?): %d\n", s.LedgerViolations, s.NotProven)
}
