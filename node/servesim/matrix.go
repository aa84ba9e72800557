package servesim

import (
	"fmt"
	"html/template"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
)

// The interference matrix of docs/simulate.md in virtual time: each model alone,
// every pair, then the whole set, under short, long, bursty and background
// request mixes (short: ~256 tokens in, ~128 out; long: 8k in, 1k out;
// bursty: on/off; background: 2k out, a closed batch), under gpuplane's
// policy. It is
// the simulated half of `gpuplane bench interference` (which runs the same
// matrix on real agents and sim engine processes): the same cells, measures,
// flags and report.

// Mix is one request mix of the matrix: the synthetic stream each model of
// a cell gets.
type Mix struct {
	Name   string
	stream func(m *ModelConfig) SyntheticStream
}

// Mixes are the matrix's request mixes: short (in ~256, out ~128), long
// (in 8k, out 1k, within the KV pool), bursty (on/off: 30 s of 2 req/s
// every 2 minutes) and background (a closed batch: 4 outstanding, out 2k).
var Mixes = []Mix{
	{"short", func(m *ModelConfig) SyntheticStream {
		return SyntheticStream{RatePerSecond: 0.5, PromptTokens: 256, OutputTokens: 128}
	}},
	{"long", func(m *ModelConfig) SyntheticStream {
		in := 8000
		if m.KVTokens > 0 {
			in = min(in, m.KVTokens/4)
		}
		return SyntheticStream{RatePerSecond: 0.05, PromptTokens: in, OutputTokens: 1000}
	}},
	{"bursty", func(m *ModelConfig) SyntheticStream {
		return SyntheticStream{RatePerSecond: 2, OnSeconds: 30, OffSeconds: 90, PromptTokens: 256, OutputTokens: 128}
	}},
	{"background", func(m *ModelConfig) SyntheticStream {
		return SyntheticStream{Concurrency: 4, PromptTokens: 2000, OutputTokens: 2000}
	}},
}

// Cell is one run of the matrix: a set of models under one mix.
type Cell struct {
	Models []string `json:"models"`
	Mix    string   `json:"mix"`
	// PerModel is each model's latency and outcome in the cell.
	PerModel         []ModelStats `json:"perModel"`
	ColdLoadsPerHour float64      `json:"coldLoadsPerHour"`
	WakesPerHour     float64      `json:"wakesPerHour"`
	Evictions        int          `json:"evictions"`
	LedgerViolations int          `json:"ledgerViolations"`
}

// Flag is a pair that breaks a model's target or forces repeated reloads,
// with the remedy.
type Flag struct {
	Pair   [2]string `json:"pair"`
	Mix    string    `json:"mix"`
	Reason string    `json:"reason"`
	Remedy string    `json:"remedy"`
}

// MatrixResult is the whole matrix: the cells, each model's p95 TTFT with
// each partner (and with the full set) relative to alone under its worst
// mix, and the flags.
type MatrixResult struct {
	Card string `json:"card"`
	// Variant is the variant of the config the matrix ran (variant.go).
	Variant string   `json:"variant,omitempty"`
	Models  []string `json:"models"`
	Cells   []Cell   `json:"cells"`
	// Relative[i][j] is model i's p95 TTFT with model j (j = i: the full
	// set) over its p95 alone, under the mix where that ratio is largest;
	// 0 where either did not complete a request.
	Relative  [][]float64 `json:"relative"`
	WorstMix  [][]string  `json:"worstMix"`
	Flags     []Flag      `json:"flags"`
	Seconds   float64     `json:"secondsPerCell"`
	Thrashing float64     `json:"thrashReloadsPerHour"`
	// Isolation is what a live run checked of tenant isolation (nil: not
	// checked, as in virtual time, which has no caches or identities).
	Isolation *Isolation `json:"isolation,omitempty"`
}

// Isolation is what a live run of the matrix checked of tenant
// isolation: that every answer reached the request that asked for it
// (its id, model and token counts are the request's), and that no
// tenant's request hit another tenant's prompt cache, while its own
// repeats did (so that the cache check can fail).
type Isolation struct {
	// Answers is how many answers had their identity checked;
	// IdentityViolations how many were another request's or malformed.
	Answers            int `json:"answersChecked"`
	IdentityViolations int `json:"identityViolations"`
	// CacheProbes is how many probe requests read the engines' prompt
	// caches; CrossTenantHits how many hit a prompt only another tenant
	// (or another set) sent; OwnHits how many repeats of a tenant's own
	// prompt hit, which shows the cache was there to leak.
	CacheProbes     int `json:"cacheProbes"`
	CrossTenantHits int `json:"crossTenantCacheHits"`
	OwnHits         int `json:"ownCacheHits"`
	// Examples describe the first violations.
	Examples []string `json:"examples,omitempty"`
}

// Violations is the count of isolation violations: non-zero fails a run.
func (x *Isolation) Violations() int {
	if x == nil {
		return 0
	}
	return x.IdentityViolations + x.CrossTenantHits
}

// maxExamples bounds Isolation.Examples.
const maxExamples = 10

// Violation records one violation of kind ("identity" or "cache").
func (x *Isolation) Violation(kind, what string) {
	if kind == "cache" {
		x.CrossTenantHits++
	} else {
		x.IdentityViolations++
	}
	if len(x.Examples) < maxExamples {
		x.Examples = append(x.Examples, kind+": "+what)
	}
}

// Add adds y's counts to x.
func (x *Isolation) Add(y *Isolation) {
	x.Answers += y.Answers
	x.IdentityViolations += y.IdentityViolations
	x.CacheProbes += y.CacheProbes
	x.CrossTenantHits += y.CrossTenantHits
	x.OwnHits += y.OwnHits
	for _, e := range y.Examples {
		if len(x.Examples) < maxExamples {
			x.Examples = append(x.Examples, e)
		}
	}
}

// MatrixVariants runs the matrix once per variant, on the variant's
// change of cfg.
func MatrixVariants(cfg *Config, variants []Variant, seed uint64, seconds float64) ([]*MatrixResult, error) {
	var out []*MatrixResult
	for _, v := range variants {
		res, err := Matrix(v.Apply(cfg), seed, seconds)
		if err != nil {
			return nil, fmt.Errorf("variant %s: %w", v.Name, err)
		}
		res.Variant = v.Name
		out = append(out, res)
	}
	return out, nil
}

// matrixThrash is the reloads per hour (cold loads and wakes) of a pair,
// beyond what its models cost alone, that count as thrashing.
const matrixThrash = 30

// Matrix runs the interference matrix for cfg's models, each cell for
// seconds of virtual time after a warm-up of a fifth of it.
func Matrix(cfg *Config, seed uint64, seconds float64) (*MatrixResult, error) {
	if seconds <= 0 {
		return nil, fmt.Errorf("matrix: seconds must be > 0, got %g", seconds)
	}
	n := len(cfg.Models)
	sets := Sets(n)
	res := &MatrixResult{Card: cfg.Card.Name, Seconds: seconds, Thrashing: matrixThrash}
	for _, m := range cfg.Models {
		res.Models = append(res.Models, m.Name)
	}
	// p95[set key][mix][model] for the ratios.
	type key struct {
		set string
		mix int
	}
	stats := map[key]map[string]ModelStats{}
	reloads := map[key]float64{}
	for _, set := range sets {
		// Closed-loop streams draw in the simulator by stream order; open
		// ones are drawn here per model.
		for mi, mix := range Mixes {
			c := *cfg
			c.Models = slices.Clone(cfg.Models)
			c.Traces, c.Synthetic = nil, nil
			c.WarmupSeconds = seconds / 5
			c.DurationSeconds = c.WarmupSeconds + seconds
			var tenants []string
			for _, t := range cfg.Tenants[:min(2, len(cfg.Tenants))] {
				tenants = append(tenants, t.Name)
			}
			var names []string
			for _, i := range set {
				st := mix.stream(&c.Models[i])
				st.Model, st.Tenants = c.Models[i].Name, tenants
				c.Synthetic = append(c.Synthetic, st)
				names = append(names, c.Models[i].Name)
			}
			for _, i := range set {
				if st, ok := c.Beside(&c.Models[i]); ok {
					st.Tenants = tenants
					c.Synthetic = append(c.Synthetic, st)
				}
			}
			// Each model's arrivals come from its own stream of the seed, so
			// a model sees the same requests alone and in every set.
			w := &Workload{End: c.DurationSeconds}
			for k, i := range set {
				one := c
				one.Synthetic = c.Synthetic[k : k+1]
				w.Arrivals = append(w.Arrivals, syntheticOpen(&one, seed<<16|uint64(i), w.End)...)
			}
			sortArrivals(w.Arrivals)
			r, err := Run(&c, w, "gpuplane", seed)
			if err != nil {
				return nil, err
			}
			cell := Cell{Models: names, Mix: mix.Name, ColdLoadsPerHour: r.ColdLoadsPerHour, WakesPerHour: r.WakesPerHour,
				Evictions: r.Evictions, LedgerViolations: r.LedgerViolations}
			k := key{strings.Join(names, "+"), mi}
			stats[k] = map[string]ModelStats{}
			for _, ms := range r.Models {
				if slices.Contains(names, ms.Model) {
					cell.PerModel = append(cell.PerModel, ms)
					stats[k][ms.Model] = ms
				}
			}
			reloads[k] = r.ColdLoadsPerHour + r.WakesPerHour
			res.Cells = append(res.Cells, cell)
		}
	}
	allKey := strings.Join(res.Models, "+")
	res.Relative = make([][]float64, n)
	res.WorstMix = make([][]string, n)
	for i, a := range res.Models {
		res.Relative[i] = make([]float64, n)
		res.WorstMix[i] = make([]string, n)
		for j := range res.Models {
			with := allKey
			if j != i {
				with = pairKey(res.Models, i, j)
			}
			for mi := range Mixes {
				alone, ok1 := stats[key{a, mi}][a]
				shared, ok2 := stats[key{with, mi}][a]
				if !ok1 || !ok2 || alone.Completed == 0 || shared.Completed == 0 || alone.TTFTP95 <= 0 {
					continue
				}
				if ratio := shared.TTFTP95 / alone.TTFTP95; ratio > res.Relative[i][j] {
					res.Relative[i][j], res.WorstMix[i][j] = round(ratio, 2), Mixes[mi].Name
				}
			}
		}
	}
	for i := range n {
		for j := i + 1; j < n; j++ {
			pk := pairKey(res.Models, i, j)
			pair := [2]string{res.Models[i], res.Models[j]}
			for mi, mix := range Mixes {
				extra := reloads[key{pk, mi}] - reloads[key{res.Models[i], mi}] - reloads[key{res.Models[j], mi}]
				if extra > matrixThrash {
					res.Flags = append(res.Flags, Flag{Pair: pair, Mix: mix.Name,
						Reason: fmt.Sprintf("%.0f reloads/h together beyond what each costs alone (> %d)", extra, matrixThrash),
						Remedy: fmt.Sprintf("serialize %s and %s: time slots on the card instead of a swap per request", pair[0], pair[1])})
				}
				for _, x := range []int{i, j} {
					m := &cfg.Models[x]
					alone, ok1 := stats[key{m.Name, mi}][m.Name]
					shared, ok2 := stats[key{pk, mi}][m.Name]
					if m.SLOTTFTSeconds == 0 || !ok1 || !ok2 || alone.Completed == 0 || alone.TTFTP95 > m.SLOTTFTSeconds {
						continue
					}
					if shared.Completed == 0 || shared.TTFTP95 > m.SLOTTFTSeconds {
						other := pair[0]
						if other == m.Name {
							other = pair[1]
						}
						res.Flags = append(res.Flags, Flag{Pair: pair, Mix: mix.Name,
							Reason: fmt.Sprintf("%s p95 TTFT %gs with %s breaks its %gs target (alone %gs)", m.Name, shared.TTFTP95, other, m.SLOTTFTSeconds, alone.TTFTP95),
							Remedy: fmt.Sprintf("time-slot %s behind %s's traffic, or give %s a reserved share (warm or pinned)", other, m.Name, m.Name)})
					}
				}
			}
		}
	}
	return res, nil
}

func pairKey(models []string, i, j int) string {
	return models[min(i, j)] + "+" + models[max(i, j)]
}

// WriteMatrix prints the relative p95 matrix, the flags and, from a live
// run, the isolation checks.
func WriteMatrix(w io.Writer, res *MatrixResult) error {
	if res.Variant != "" {
		fmt.Fprintf(w, "variant %s\n", res.Variant)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "p95 TTFT vs alone (worst mix)\t"+strings.Join(res.Models, "\t")+"\tfull set\t")
	for i, a := range res.Models {
		cells := []string{a}
		for j := range res.Models {
			switch {
			case j == i:
				cells = append(cells, "-")
			case res.Relative[i][j] == 0:
				cells = append(cells, "n/a")
			default:
				cells = append(cells, fmt.Sprintf("%g×", res.Relative[i][j]))
			}
		}
		full := "n/a"
		if res.Relative[i][i] > 0 {
			full = fmt.Sprintf("%g×", res.Relative[i][i])
		}
		fmt.Fprintln(tw, strings.Join(append(cells, full), "\t")+"\t")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(res.Flags) == 0 {
		fmt.Fprintln(w, "no pair breaks a target or thrashes")
	}
	for _, f := range res.Flags {
		fmt.Fprintf(w, "FLAG %s+%s (%s): %s; remedy: %s\n", f.Pair[0], f.Pair[1], f.Mix, f.Reason, f.Remedy)
	}
	if x := res.Isolation; x != nil {
		fmt.Fprintf(w, "isolation: %d violations: %d of %d answers not the request's own; %d cross-tenant prompt-cache hits in %d probes (%d hits on a tenant's own prompt)\n",
			x.Violations(), x.IdentityViolations, x.Answers, x.CrossTenantHits, x.CacheProbes, x.OwnHits)
		for _, e := range x.Examples {
			fmt.Fprintf(w, "VIOLATION %s\n", e)
		}
	}
	return nil
}

var matrixPage = template.Must(template.New("page").Funcs(template.FuncMap{
	"color": func(x float64) template.CSS {
		if x == 0 {
			return "background:#eee"
		}
		// 1× green, 2× yellow, ≥ 4× red.
		t := math.Min(math.Max(math.Log2(x)/2, 0), 1)
		return template.CSS(fmt.Sprintf("background:hsl(%.0f,70%%,75%%)", 120*(1-t)))
	},
	"cell": func(i, j int, res *MatrixResult) float64 { return res.Relative[i][j] },
}).Parse(`<!doctype html>
<html><head><meta charset="utf-8"><title>Interference matrix: {{(index . 0).Card}}</title>
<style>body{font-family:sans-serif}table{border-collapse:collapse}td,th{border:1px solid #999;padding:4px 8px;text-align:right}.bad{color:#b00;font-weight:bold}</style>
</head><body>
<h1>Interference matrix: {{(index . 0).Card}}</h1>
{{if gt (len .) 1}}<p>Variants: {{range $k, $r := .}}{{if $k}}, {{end}}<a href="#{{$r.Variant}}">{{$r.Variant}}</a>{{end}}.</p>{{end}}
{{range .}}{{template "matrix" .}}{{end}}
</body></html>
{{define "matrix"}}{{if .Variant}}<h2 id="{{.Variant}}">Variant: {{.Variant}}</h2>{{end}}
<p>Each model's p95 time to first token with a partner (or the full set) relative to running alone, under the mix where it is worst; {{.Seconds}} s of virtual time per cell, gpuplane's policy.</p>
<table><tr><th>model \ with</th>{{range .Models}}<th>{{.}}</th>{{end}}<th>full set</th></tr>
{{$res := .}}{{range $i, $a := .Models}}<tr><th>{{$a}}</th>{{range $j, $b := $res.Models}}{{if eq $i $j}}<td>–</td>{{else}}{{$x := cell $i $j $res}}<td style="{{color $x}}" title="worst mix: {{index (index $res.WorstMix $i) $j}}">{{if $x}}{{$x}}×{{else}}n/a{{end}}</td>{{end}}{{end}}{{$f := cell $i $i $res}}<td style="{{color $f}}">{{if $f}}{{$f}}×{{else}}n/a{{end}}</td></tr>
{{end}}</table>
<h3>Flags{{if .Variant}} ({{.Variant}}){{end}}</h3>
{{if .Flags}}<ul>{{range .Flags}}<li><b>{{index .Pair 0}} + {{index .Pair 1}}</b> ({{.Mix}}): {{.Reason}}. Remedy: {{.Remedy}}.</li>{{end}}</ul>{{else}}<p>No pair breaks a target or thrashes.</p>{{end}}
{{with .Isolation}}<h3>Isolation</h3>
<p{{if .Violations}} class="bad"{{end}}>{{.Violations}} violations: {{.IdentityViolations}} of {{.Answers}} answers not the request's own; {{.CrossTenantHits}} cross-tenant prompt-cache hits in {{.CacheProbes}} probes ({{.OwnHits}} hits on a tenant's own prompt).</p>
{{if .Examples}}<ul>{{range .Examples}}<li>{{.}}</li>{{end}}</ul>{{end}}{{end}}
{{end}}`))

// WriteMatrixHTML writes the report with the heatmap.
func WriteMatrixHTML(w io.Writer, res *MatrixResult) error {
	return WriteMatricesHTML(w, []*MatrixResult{res})
}

// WriteMatricesHTML writes one report with each variant's heatmap, flags
// and isolation checks.
func WriteMatricesHTML(w io.Writer, res []*MatrixResult) error {
	if len(res) == 0 {
		return fmt.Errorf("matrix report: no matrix")
	}
	return matrixPage.Execute(w, res)
}
