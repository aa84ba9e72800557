package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
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
				Requests  int     `json:"offered"`
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
		{[]string{"--variants", "base,fast"}, `invalid --variants "fast"`},
		{[]string{"--via", "proxy"}, `invalid --via "proxy"`},
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

var tinyTenantsConfig = strings.Replace(tinyBenchConfig, "tenants: [{name: alice}]", "tenants: [{name: alice}, {name: bob}]", 1)

// benchIsolation is a variant's isolation checks in -o json.
type benchIsolation struct {
	Answers            int      `json:"answersChecked"`
	IdentityViolations int      `json:"identityViolations"`
	CacheProbes        int      `json:"cacheProbes"`
	CrossTenantHits    int      `json:"crossTenantCacheHits"`
	OwnHits            int      `json:"ownCacheHits"`
	Examples           []string `json:"examples"`
}

type benchVariantsJSON struct {
	Variants []struct {
		Variant string `json:"variant"`
		Via     string `json:"via"`
		Cells   []struct {
			Models   []string `json:"models"`
			PerModel []struct {
				Requests  int `json:"offered"`
				Completed int `json:"completed"`
			} `json:"perModel"`
		} `json:"cells"`
		Compare            []struct{} `json:"compare"`
		Requests           int        `json:"requests"`
		Answered           int        `json:"answered"`
		BackgroundRequests int        `json:"backgroundRequests"`
		Isolation          *benchIsolation
	} `json:"variants"`
	IsolationViolations int `json:"isolationViolations"`
}

func runTinyVariants(t *testing.T, args ...string) (int, benchVariantsJSON, string, string) {
	t.Helper()
	dir := t.TempDir()
	cfg, html := filepath.Join(dir, "tiny.yaml"), filepath.Join(dir, "report.html")
	if err := os.WriteFile(cfg, []byte(tinyTenantsConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	code := Run(context.Background(), append([]string{"-o", "json", "bench", "interference", "--config", cfg, "--models", "chat", "--mix", "short",
		"--duration", "1s", "--html", html}, args...), strings.NewReader(""), &out, &errb)
	var res benchVariantsJSON
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("exit %d, -o json: %v\n%s\n%s", code, err, out.String(), errb.String())
	}
	page, _ := os.ReadFile(html)
	return code, res, string(page), errb.String()
}

// TestLiveBenchInterferenceVariants runs the live matrix of one model
// under every variant, each on an agent of its own: every variant has its
// cells with every request answered, preemption-off goes through the
// gateway, and every run checked isolation: each answer was its
// request's, no tenant's probe hit the other's prompt cache while each
// tenant's repeat hit its own (so the check could have failed).
func TestLiveBenchInterferenceVariants(t *testing.T) {
	code, res, page, errs := runTinyVariants(t, "--variants", "all")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var names []string
	for _, v := range res.Variants {
		names = append(names, v.Variant)
		if len(v.Cells) != 1 || len(v.Cells[0].PerModel) != 1 || v.Cells[0].PerModel[0].Requests == 0 || v.Requests == 0 || v.Answered != v.Requests {
			t.Fatalf("variant %s: cells %+v, %d of %d answered: want chat's cell with every request answered\n%s", v.Variant, v.Cells, v.Answered, v.Requests, errs)
		}
		if want := map[bool]string{true: "gateway", false: "fronts"}[strings.HasPrefix(v.Variant, "preemption")]; v.Via != want {
			t.Errorf("variant %s went to the %s, want %s", v.Variant, v.Via, want)
		}
		if strings.HasPrefix(v.Variant, "preemption") != (v.BackgroundRequests > 0) {
			t.Errorf("variant %s sent %d background requests beside chat: want some in the preemption variants only", v.Variant, v.BackgroundRequests)
		}
		x := v.Isolation
		if x == nil || x.Answers < v.Requests || x.IdentityViolations != 0 || x.CacheProbes != 4 || x.CrossTenantHits != 0 || x.OwnHits != 2 {
			t.Fatalf("variant %s isolation %+v: want every answer checked (≥ %d) and its own, 4 cache probes, no cross-tenant hit, 2 own hits", v.Variant, x, v.Requests)
		}
		if !strings.Contains(page, `id="`+v.Variant+`"`) {
			t.Errorf("HTML report lacks variant %s", v.Variant)
		}
	}
	if got := strings.Join(names, ","); got != "base,adapters,quantized,batching-off,preemption,preemption-off" {
		t.Fatalf("variants %s", got)
	}
	if res.IsolationViolations != 0 || !strings.Contains(page, "0 violations") {
		t.Fatalf("%d isolation violations; HTML shows them: %v", res.IsolationViolations, strings.Contains(page, "0 violations"))
	}
}

// plantedFaults breaks isolation on the way to the node: it rewrites every
// request's request_id (so each answer carries another request's id) and
// names every request's tenant alice (so bob's probe finds alice's
// prompt in the cache).
type plantedFaults struct{ ids, tenants bool }

func (p plantedFaults) RoundTrip(r *http.Request) (*http.Response, error) {
	if p.tenants && r.Header.Get("X-Gpuplane-Tenant") != "" {
		r.Header.Set("X-Gpuplane-Tenant", "alice")
	}
	if p.ids && r.Body != nil {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return nil, err
		}
		body = bytes.ReplaceAll(body, []byte(`"request_id":"bench-`), []byte(`"request_id":"other-`))
		r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
	}
	return http.DefaultTransport.RoundTrip(r)
}

// The isolation checks catch a planted mix-up: answers carrying another
// request's id, and a tenant reaching another's prompt cache. Each is
// counted and shown in the report, and the run fails.
func TestLiveBenchInterferenceCatchesIsolationBreaks(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fault plantedFaults
		check func(x *benchIsolation) bool
	}{
		{"identity", plantedFaults{ids: true}, func(x *benchIsolation) bool {
			return x.IdentityViolations > 0 && x.CrossTenantHits == 0 && strings.Contains(strings.Join(x.Examples, "\n"), `carries id "cmpl-other-`)
		}},
		{"cache", plantedFaults{tenants: true}, func(x *benchIsolation) bool {
			return x.CrossTenantHits == 1 && x.IdentityViolations == 0 && strings.Contains(strings.Join(x.Examples, "\n"), "tenant bob's first send")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			benchTransport = tc.fault
			defer func() { benchTransport = nil }()
			code, res, page, errs := runTinyVariants(t)
			if code != 1 || !strings.Contains(errs, "isolation violations") {
				t.Fatalf("exit %d, %q: want the run failed for its isolation violations", code, errs)
			}
			if len(res.Variants) != 1 || res.Variants[0].Isolation == nil || !tc.check(res.Variants[0].Isolation) || res.IsolationViolations == 0 {
				t.Fatalf("isolation %+v (%d violations): want the planted %s fault counted", res.Variants[0].Isolation, res.IsolationViolations, tc.name)
			}
			if !strings.Contains(page, "FAILED") || !strings.Contains(page, tc.name+": ") {
				t.Errorf("HTML report does not show the violations")
			}
		})
	}
}
