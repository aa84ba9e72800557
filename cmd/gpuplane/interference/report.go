package interference

import (
	"bytes"
	"fmt"
	"html"
	"io"
	"math"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/gpuplane/gpuplane/node/servesim"
)

// stats are a model's measures in the cell, in the config's seconds.
func (b *bench) stats(m *servesim.ModelConfig, samples []sample) servesim.ModelStats {
	ms := servesim.ModelStats{Model: m.Name, Class: m.Class, Requests: len(samples)}
	var ttft, tpot []float64
	met := 0
	for _, s := range samples {
		if s.err != nil {
			ms.Failed++
			continue
		}
		ms.Completed++
		t := s.ttft * b.o.TimeScale
		ttft = append(ttft, t)
		if s.tpot > 0 {
			tpot = append(tpot, s.tpot*b.o.TimeScale)
		}
		if m.SLOTTFTSeconds == 0 || t <= m.SLOTTFTSeconds {
			met++
		}
	}
	if ms.Completed > 0 {
		ms.SLO = servesim.Round(float64(met)/float64(ms.Completed), 3)
	}
	ms.TTFTP50 = servesim.Round(servesim.Percentile(ttft, 50), 3)
	ms.TTFTP95 = servesim.Round(servesim.Percentile(ttft, 95), 3)
	ms.TTFTP99 = servesim.Round(servesim.Percentile(ttft, 99), 3)
	ms.TPOTP95 = servesim.Round(servesim.Percentile(tpot, 95), 4)
	return ms
}

// benchAgree is the largest relative gap between the live and the
// replayed p95 TTFT that counts as agreement: within 15%.
const benchAgree = 0.15

// agreement counts the comparisons with both p95s and those within
// benchAgree of each other.
func (res *VariantResult) agreement() (within, compared int) {
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

// WriteReport prints each variant's matrix, flags and isolation checks as
// simulate interference does, then each cell's live p95 TTFT against the
// replayed one.
func WriteReport(w io.Writer, res *Result) error {
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
		if err := writeVariant(w, v); err != nil {
			return err
		}
	}
	if res.IsolationViolations > 0 {
		_, err := fmt.Fprintf(w, "\nFAILED: %d isolation violations\n", res.IsolationViolations)
		return err
	}
	return nil
}

func writeVariant(w io.Writer, res *VariantResult) error {
	if err := servesim.WriteMatrix(w, res.MatrixResult); err != nil {
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

// WriteHTML writes simulate interference's report with each
// variant's heatmap, flags and isolation checks, with each variant's
// live/replayed comparison added before its end.
func WriteHTML(path string, res *Result) error {
	var page bytes.Buffer
	var all []*servesim.MatrixResult
	for _, v := range res.Variants {
		all = append(all, v.MatrixResult)
	}
	if err := servesim.WriteMatricesHTML(&page, all); err != nil {
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
