package servesim

import (
	"fmt"
	"html"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
)

// The rate sweep the serving papers report (AlpaServe, MuxServe, Aegaeon):
// SLO attainment against request rate, every trace's rate scaled alike.

// SweepPoint is one policy at one rate.
type SweepPoint struct {
	Rate float64 `json:"rate"`
	// InteractiveSLO is the interactive SLO attainment over offered
	// requests, in percent.
	InteractiveSLO   float64  `json:"interactiveSLO"`
	ModelsAtSLO      int      `json:"modelsAtSLO"`
	ModelsWithDemand int      `json:"modelsWithDemand"`
	StarvedModels    []string `json:"starvedModels"`
	GoodputPerSecond float64  `json:"goodputPerSecond"`
}

// SweepResult is a config's sweep: per policy its points, in rate order,
// and its maxRateAt90.
type SweepResult struct {
	Card     string                  `json:"card"`
	Rates    []float64               `json:"rates"`
	Policies []string                `json:"policies"`
	Points   map[string][]SweepPoint `json:"points"`
	// MaxRateAt90 is, per policy, the largest rate swept at which its
	// interactive SLO attainment over offered requests is ≥ 90% (0 when
	// none).
	MaxRateAt90 map[string]float64 `json:"maxRateAt90"`
}

// ScaleRate returns a copy of cfg whose every trace plays rate times as
// fast and whose open-loop synthetic streams send rate times as often;
// closed loops (batch jobs) keep their concurrency.
func ScaleRate(cfg *Config, rate float64) *Config {
	c := *cfg
	c.Traces = slices.Clone(cfg.Traces)
	for i := range c.Traces {
		c.Traces[i].TimeScale /= rate
		c.Traces[i].OffsetSeconds /= rate
	}
	c.Synthetic = slices.Clone(cfg.Synthetic)
	for i := range c.Synthetic {
		c.Synthetic[i].RatePerSecond *= rate
	}
	// durationSeconds and warmupSeconds stay: the same span is measured
	// at every rate (a config without a duration ends at its last
	// arrival, which comes sooner).
	return &c
}

// Sweep runs the policies at each rate (RunAll: the same workload for
// every policy at a rate) and finds each policy's maxRateAt90.
func Sweep(cfg *Config, traces []string, seed uint64, policies []string, rates []float64) (*SweepResult, error) {
	res := &SweepResult{Card: cfg.Card.Name, Rates: slices.Clone(rates), Policies: slices.Clone(policies),
		Points: map[string][]SweepPoint{}, MaxRateAt90: map[string]float64{}}
	for _, p := range policies {
		res.MaxRateAt90[p] = 0
	}
	for _, rate := range rates {
		if !(rate > 0) || math.IsInf(rate, 0) {
			return nil, fmt.Errorf("sweep rate %g: must be > 0", rate)
		}
		c := ScaleRate(cfg, rate)
		w, err := NewWorkload(c, traces, seed)
		if err != nil {
			return nil, err
		}
		rs, err := RunAll(c, w, policies, seed, nil)
		if err != nil {
			return nil, err
		}
		for _, r := range rs {
			pt := SweepPoint{Rate: rate, InteractiveSLO: r.SLOAttainment["interactive"], ModelsAtSLO: r.ModelsAtSLO,
				ModelsWithDemand: r.ModelsWithDemand, StarvedModels: r.StarvedModels, GoodputPerSecond: r.GoodputPerSecond}
			res.Points[r.Policy] = append(res.Points[r.Policy], pt)
			if pt.InteractiveSLO >= 90 && rate > res.MaxRateAt90[r.Policy] {
				res.MaxRateAt90[r.Policy] = rate
			}
		}
	}
	return res, nil
}

// WriteSweepTable prints interactive SLO attainment (and models at SLO)
// per policy per rate, then maxRateAt90.
func WriteSweepTable(w io.Writer, s *SweepResult) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := []string{"interactive SLO % (models at SLO) at rate ×"}
	for _, r := range s.Rates {
		head = append(head, fmt.Sprintf("%g", r))
	}
	head = append(head, "maxRateAt90")
	fmt.Fprintln(tw, strings.Join(head, "\t")+"\t")
	for _, p := range s.Policies {
		cells := []string{p}
		for _, pt := range s.Points[p] {
			cells = append(cells, fmt.Sprintf("%g (%d/%d)", pt.InteractiveSLO, pt.ModelsAtSLO, pt.ModelsWithDemand))
		}
		cells = append(cells, fmt.Sprintf("%g", s.MaxRateAt90[p]))
		fmt.Fprintln(tw, strings.Join(cells, "\t")+"\t")
	}
	return tw.Flush()
}

// WriteSweepHTML draws each sweep's curves, interactive SLO attainment
// against rate (log scale), as inline SVG: a page with no script and no
// network.
func WriteSweepHTML(w io.Writer, title string, sweeps []*SweepResult) error {
	var b strings.Builder
	fmt.Fprintf(&b, "<!doctype html><html><head><meta charset=\"utf-8\"><title>%s</title>"+
		"<style>body{font-family:sans-serif;margin:2em}svg{background:#fff}text{font-size:12px}</style></head><body><h1>%s</h1>\n",
		html.EscapeString(title), html.EscapeString(title))
	colors := []string{"#d62728", "#1f77b4", "#aec7e8", "#2ca02c", "#7f7f7f", "#9467bd", "#000000", "#ff7f0e"}
	const W, H, L, R, T, B = 640.0, 360.0, 60.0, 170.0, 20.0, 40.0
	for _, s := range sweeps {
		if len(s.Rates) == 0 {
			continue
		}
		lo, hi := math.Log2(slices.Min(s.Rates)), math.Log2(slices.Max(s.Rates))
		if hi == lo {
			lo, hi = lo-1, hi+1
		}
		x := func(r float64) float64 { return L + (math.Log2(r)-lo)/(hi-lo)*(W-L-R) }
		y := func(v float64) float64 { return T + (100-v)/100*(H-T-B) }
		fmt.Fprintf(&b, "<h2>%s</h2>\n<svg width=\"%g\" height=\"%g\" role=\"img\" aria-label=\"interactive SLO attainment against rate, %s\">\n",
			html.EscapeString(s.Card), W, H, html.EscapeString(s.Card))
		for v := 0.0; v <= 100; v += 20 {
			fmt.Fprintf(&b, "<line x1=\"%g\" x2=\"%g\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/><text x=\"%g\" y=\"%.1f\" text-anchor=\"end\">%g%%</text>\n",
				L, W-R, y(v), y(v), L-6, y(v)+4, v)
		}
		fmt.Fprintf(&b, "<line x1=\"%g\" x2=\"%g\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#888\" stroke-dasharray=\"4 3\"/>\n", L, W-R, y(90), y(90))
		for _, r := range s.Rates {
			fmt.Fprintf(&b, "<text x=\"%.1f\" y=\"%g\" text-anchor=\"middle\">×%g</text>\n", x(r), H-B+18, r)
		}
		fmt.Fprintf(&b, "<text x=\"%g\" y=\"%g\" text-anchor=\"middle\">request rate (× the config's)</text>\n", (L+W-R)/2, H-4)
		for i, p := range s.Policies {
			col := colors[i%len(colors)]
			var pts []string
			for _, pt := range s.Points[p] {
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(pt.Rate), y(pt.InteractiveSLO)))
			}
			width := 1.5
			if p == "gpuplane" {
				width = 3
			}
			fmt.Fprintf(&b, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"%g\" points=\"%s\"/>\n", col, width, strings.Join(pts, " "))
			for _, pt := range s.Points[p] {
				fmt.Fprintf(&b, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"><title>%s ×%g: %g%% (%d of %d models at SLO)</title></circle>\n",
					x(pt.Rate), y(pt.InteractiveSLO), col, html.EscapeString(p), pt.Rate, pt.InteractiveSLO, pt.ModelsAtSLO, pt.ModelsWithDemand)
			}
			fmt.Fprintf(&b, "<rect x=\"%g\" y=\"%g\" width=\"12\" height=\"3\" fill=\"%s\"/><text x=\"%g\" y=\"%g\">%s (max ×%g at 90%%)</text>\n",
				W-R+10, T+float64(i)*18+6, col, W-R+26, T+float64(i)*18+10, html.EscapeString(p), s.MaxRateAt90[p])
		}
		b.WriteString("</svg>\n")
	}
	b.WriteString("</body></html>\n")
	_, err := io.WriteString(w, b.String())
	return err
}
