package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const tinyBenchConfig = `card: {name: tiny, memoryGiB: 24}
models:
  - {name: chat, class: interactive, residency: warm, memoryGiB: 6, loadSeconds: 10, wakeSeconds: 1,
     tokensPerSecond: 90, prefillTokensPerSecond: 6000, kvTokens: 16384, sloTTFTSeconds: 2}
  - {name: embed, class: interactive, residency: onDemand, memoryGiB: 2, loadSeconds: 5, wakeSeconds: 0.5,
     tokensPerSecond: 200, prefillTokensPerSecond: 20000, sloTTFTSeconds: 1}
tenants: [{name: alice}]
`

// TestLiveBenchInterferenceTinyMatrix runs the live matrix of two small
// models under one mix against a real dev agent and real sim engine
// processes: every cell of the matrix is there with its models' measures,
// every request sent was answered, each model's p95 with its partner is
// relative to alone, the simulated p95 of the same cell sits next to the
// live one, and the HTML report has the heatmap and the comparison.
func TestLiveBenchInterferenceTinyMatrix(t *testing.T) {
	dir := t.TempDir()
	cfg, html := filepath.Join(dir, "tiny.yaml"), filepath.Join(dir, "report.html")
	if err := os.WriteFile(cfg, []byte(tinyBenchConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	code := Run(context.Background(), []string{"-o", "json", "bench", "interference", "--config", cfg, "--mix", "short",
		"--duration", "2s", "--html", html}, strings.NewReader(""), &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var res struct {
		Device string   `json:"device"`
		Models []string `json:"models"`
		Cells  []struct {
			Models   []string `json:"models"`
			Mix      string   `json:"mix"`
			PerModel []struct {
				Model     string  `json:"model"`
				Requests  int     `json:"requests"`
				Completed int     `json:"completed"`
				Failed    int     `json:"failed"`
				TTFTP50   float64 `json:"ttftP50"`
				TTFTP95   float64 `json:"ttftP95"`
				TPOTP95   float64 `json:"tpotP95"`
			} `json:"perModel"`
		} `json:"cells"`
		Relative [][]float64 `json:"relative"`
		Compare  []struct {
			Model      string  `json:"model"`
			LiveP95    float64 `json:"liveTtftP95"`
			SimP95     float64 `json:"simTtftP95"`
			SimBareP95 float64 `json:"simTtftP95NoOverhead"`
			Overhead   float64 `json:"overheadP50"`
			LiveEngine float64 `json:"liveEngineTtftP95"`
			Ratio      float64 `json:"ratio"`
		} `json:"compare"`
		Compared int `json:"compared"`
		Requests int `json:"requests"`
		Answered int `json:"answered"`
	}
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("-o json: %v\n%s", err, out.String())
	}
	if res.Device != "rtx4090" || strings.Join(res.Models, ",") != "chat,embed" {
		t.Fatalf("device %q, models %v: want rtx4090 for a 24 GiB card, chat and embed", res.Device, res.Models)
	}
	var cells []string
	for _, c := range res.Cells {
		cells = append(cells, strings.Join(c.Models, "+")+"/"+c.Mix)
		if len(c.PerModel) != len(c.Models) {
			t.Fatalf("cell %v: measures for %d models", c.Models, len(c.PerModel))
		}
		for _, m := range c.PerModel {
			if m.Requests == 0 || m.Completed != m.Requests || m.Failed != 0 {
				t.Fatalf("cell %v, %s: %d requests, %d answered, %d failed: every request must be answered\n%s", c.Models, m.Model, m.Requests, m.Completed, m.Failed, errb.String())
			}
			if m.TTFTP50 <= 0 || m.TTFTP95 < m.TTFTP50 || m.TPOTP95 <= 0 {
				t.Fatalf("cell %v, %s: TTFT p50 %g p95 %g, TPOT p95 %g", c.Models, m.Model, m.TTFTP50, m.TTFTP95, m.TPOTP95)
			}
		}
	}
	if got := strings.Join(cells, " "); got != "chat/short embed/short chat+embed/short" {
		t.Fatalf("cells %s: want each model alone, then the pair, under short", got)
	}
	if res.Requests == 0 || res.Answered != res.Requests {
		t.Fatalf("%d of %d requests answered", res.Answered, res.Requests)
	}
	if len(res.Relative) != 2 || res.Relative[0][1] <= 0 || res.Relative[1][0] <= 0 {
		t.Fatalf("relative p95 %v: want each model's p95 with its partner over alone", res.Relative)
	}
	if len(res.Compare) != 4 {
		t.Fatalf("%d comparisons, want one per model per cell (4)", len(res.Compare))
	}
	for _, c := range res.Compare {
		if c.SimP95 <= 0 || c.LiveP95 <= 0 || c.Ratio <= 0 || c.Overhead <= 0 || c.SimBareP95 <= 0 {
			t.Fatalf("comparison %+v: want live and replayed p95 (with the measured overhead and without), the overhead and their ratio", c)
		}
		// The sim engine stamps its part of each first token; the
		// bench reads it from the answer's headers.
		if c.LiveEngine <= 0 || c.LiveEngine > c.LiveP95 {
			t.Fatalf("comparison %+v: want the engine's own part of the live p95 TTFT, above 0 and at most the live p95", c)
		}
	}
	if res.Compared != 4 {
		t.Fatalf("%d comparisons counted, want 4", res.Compared)
	}
	page, err := os.ReadFile(html)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"<th>chat</th>", "<th>embed</th>", "Live p95 TTFT against the simulated replay", "</html>"} {
		if !strings.Contains(string(page), want) {
			t.Errorf("HTML report lacks %q", want)
		}
	}
}

// Bad flags are usage errors naming the flag, before any agent starts.
func TestBenchInterferenceBadInput(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "tiny.yaml")
	if err := os.WriteFile(cfg, []byte(tinyBenchConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--mix", "short,steady"}, `invalid --mix "steady"`},
		{[]string{"--duration", "0s"}, "invalid --duration"},
		{[]string{"--time-scale", "0.5"}, "invalid --time-scale"},
		{[]string{"--models", "chat,nosuch"}, `invalid --models "nosuch"`},
	} {
		var out, errb bytes.Buffer
		code := Run(context.Background(), append([]string{"bench", "interference", "--config", cfg}, tc.args...), strings.NewReader(""), &out, &errb)
		if code != 2 || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("%v: exit %d, %q; want exit 2 naming %q", tc.args, code, errb.String(), tc.want)
		}
	}
	var out, errb bytes.Buffer
	code := Run(context.Background(), []string{"bench", "interference"}, strings.NewReader(""), &out, &errb)
	if code != 2 || !strings.Contains(errb.String(), "--config") {
		t.Errorf("no --config: exit %d, %q", code, errb.String())
	}
}
