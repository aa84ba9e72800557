package servesim

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/gpuplane/gpuplane/node/gateway/queue"
)

// Result is one policy's run: what a user compares between policies.
type Result struct {
	Policy          string  `json:"policy"`
	Card            string  `json:"card"`
	DurationSeconds float64 `json:"durationSeconds"`
	// Requests are those offered (arrived after the warm-up); every one is
	// scored: a request rejected, failed or never answered misses its SLO
	// and counts as +∞ in the TTFT percentiles.
	Requests  int `json:"offered"`
	Completed int `json:"completed"`
	// Rejected were turned away (429, 503, or no engine for the model);
	// Failed were cut off, preempted or never finished.
	Rejected int `json:"rejected"`
	Failed   int `json:"failed"`
	// SLOAttainment per class: the share of its requests that completed
	// within their model's TTFT (and TPOT) targets; a rejected or failed
	// request misses.
	SLOAttainment map[string]float64 `json:"sloAttainment"`
	// ModelsAtSLO counts the models with ≥ 90% of their offered requests
	// within SLO, of ModelsWithDemand (models offered any request).
	ModelsAtSLO      int `json:"modelsAtSLO"`
	ModelsWithDemand int `json:"modelsWithDemand"`
	// StarvedModels: models served (completed) < 50% of their offered
	// requests while static-best or ideal serves ≥ 90% of theirs (set by
	// MarkStarved, which needs those two runs).
	StarvedModels []string `json:"starvedModels"`
	// GoodputPerSecond: requests completed within SLO per measured second.
	GoodputPerSecond float64 `json:"goodputPerSecond"`
	// InteractiveTTFTP95 is over every offered interactive request, in
	// seconds (+∞, JSON null, when it lands on one never answered).
	InteractiveTTFTP95 float64      `json:"interactiveTTFTP95"`
	TPOTP95            float64      `json:"tpotP95"`
	Models             []ModelStats `json:"models"`
	ColdLoads          int          `json:"coldLoads"`
	Wakes              int          `json:"wakes"`
	ColdLoadsPerHour   float64      `json:"coldLoadsPerHour"`
	WakesPerHour       float64      `json:"wakesPerHour"`
	// Evictions: engines stopped or put to sleep to make room for another.
	Evictions int `json:"evictions"`
	// AdapterLoadsPerHour: LoRA adapters loaded onto running engines.
	AdapterLoadsPerHour       float64 `json:"adapterLoadsPerHour"`
	BackgroundTokensPerSecond float64 `json:"backgroundTokensPerSecond"`
	// FairnessGapPercent: the largest gap in weight-normalised service
	// (prompt and generated tokens) between two equal-weight tenants of one
	// model over a window in which both had requests waiting throughout,
	// as a share of the larger (see metrics.fairnessGap).
	FairnessGapPercent float64 `json:"fairnessGapPercent"`
	// FairnessWindows counts the windows judged (both tenants backlogged
	// throughout, served at least 40 times the largest request in it).
	FairnessWindows int `json:"fairnessWindows"`
	// LedgerViolations: the residency controller's reported violations
	// (gpuplane) plus the simulator's own count of times the engines held
	// more than the card's usable memory (every policy).
	LedgerViolations int `json:"ledgerViolations"`
	// BestEffort: gpuplane's best-effort models at the end of the run,
	// each with why in numbers (residency.Controller.BestEffort).
	BestEffort []string `json:"bestEffort,omitempty"`
	// StaticBestSearch is static-best's search (static-best only).
	StaticBestSearch *SearchReport `json:"staticBestSearch,omitempty"`
}

// ModelStats is one model's latency and outcome. The TTFT percentiles are
// over the offered requests: one that never had a first token (rejected,
// failed before it, never answered) counts as +∞, which JSON writes as
// null and the text table as ∞.
type ModelStats struct {
	Model     string  `json:"model"`
	Class     string  `json:"class"`
	Requests  int     `json:"offered"`
	Completed int     `json:"completed"`
	Rejected  int     `json:"rejected"`
	Failed    int     `json:"failed"`
	SLO       float64 `json:"sloAttainment"`
	TTFTP50   float64 `json:"ttftP50"`
	TTFTP95   float64 `json:"ttftP95"`
	TTFTP99   float64 `json:"ttftP99"`
	TPOTP95   float64 `json:"tpotP95"`
	// AtSLO: ≥ 90% of the offered requests within SLO; Starved: see
	// Result.StarvedModels.
	AtSLO   bool `json:"atSLO"`
	Starved bool `json:"starved"`
	// Objective is a background model's: the requests it must complete
	// to be at SLO, BackgroundObjectiveShare of what it completes alone on
	// the card (ideal); 0 for other classes (ScoreBackground).
	Objective int `json:"objective,omitempty"`
	// withinSLO: ≥ 90% of the offered requests within SLO (AtSLO before
	// any objective).
	withinSLO bool
}

// MarshalJSON writes the +∞ percentiles as null (JSON has no infinity).
func (m ModelStats) MarshalJSON() ([]byte, error) {
	type plain ModelStats
	return json.Marshal(struct {
		plain
		TTFTP50 *float64 `json:"ttftP50"`
		TTFTP95 *float64 `json:"ttftP95"`
		TTFTP99 *float64 `json:"ttftP99"`
	}{plain(m), finite(m.TTFTP50), finite(m.TTFTP95), finite(m.TTFTP99)})
}

// MarshalJSON writes a +∞ pooled percentile as null.
func (r Result) MarshalJSON() ([]byte, error) {
	type plain Result
	return json.Marshal(struct {
		plain
		InteractiveTTFTP95 *float64 `json:"interactiveTTFTP95"`
	}{plain(r), finite(r.InteractiveTTFTP95)})
}

func finite(x float64) *float64 {
	if math.IsInf(x, 0) || math.IsNaN(x) {
		return nil
	}
	return &x
}

// atSLOShare is the share of a model's offered requests within SLO that
// makes it count in modelsAtSLO; starvedShare and servedShare bound a
// starved model (served < starvedShare where a reference serves ≥
// servedShare).
const (
	atSLOShare   = 0.9
	starvedShare = 0.5
	servedShare  = 0.9
)

type modelMet struct {
	requests, completed, rejected, failed, met int
	// ttft is every completed request's; partial the TTFT of requests cut
	// off or preempted after their first token.
	ttft, partial, tpot []float64
	outTokens           int64
}

type metrics struct {
	cfg              *Config
	models           []modelMet
	coldLoads, wakes int
	evictions        int
	adapterLoads     int
	// measuring is set once the warm-up is over: the engine events counted
	// before it are taken off (atWarmup).
	measuring        bool
	atWarmup         [4]int
	ctrlViolations   int
	memoryViolations int
	rejectedByStatus map[int]int
	tenantIdx        map[string]int
	weights          []float64
	backlogged       [][]int // [model][tenant] requests waiting
	// windows[model][a][b] (a < b) is the pair's current window; fairGap
	// the largest gap of a window closed so far, over fairWindows windows.
	windows     [][][]fairWindow
	fairGap     float64
	fairWindows int
	largest     []int // [model] largest request (prompt+output)
	duration    float64
	bgTokens    int64
}

func newMetrics(cfg *Config) *metrics {
	m := &metrics{cfg: cfg, models: make([]modelMet, len(cfg.Models)), rejectedByStatus: map[int]int{}, tenantIdx: map[string]int{}}
	for i, t := range cfg.Tenants {
		m.tenantIdx[t.Name] = i
		m.weights = append(m.weights, t.Weight)
	}
	for range cfg.Models {
		m.backlogged = append(m.backlogged, make([]int, len(cfg.Tenants)))
		w := make([][]fairWindow, len(cfg.Tenants))
		for i := range w {
			w[i] = make([]fairWindow, len(cfg.Tenants))
		}
		m.windows = append(m.windows, w)
	}
	m.largest = make([]int, len(cfg.Models))
	m.measuring = cfg.WarmupSeconds == 0
	return m
}

func (m *metrics) arrive(r *request) {
	if r.warmup {
		return
	}
	m.models[r.a.Model].requests++
	m.largest[r.a.Model] = max(m.largest[r.a.Model], r.a.PromptTokens+r.a.OutputTokens)
}

func (m *metrics) backlog(r *request, waiting bool) {
	if r.warmup {
		return
	}
	mi, a := r.a.Model, m.tenantIdx[r.a.Tenant]
	bl := m.backlogged[mi]
	was := bl[a] > 0
	if waiting {
		bl[a]++
	} else {
		bl[a]--
	}
	if is := bl[a] > 0; is != was {
		// Windows of a's pairs with backlogged tenants open or close.
		for b := range bl {
			if w := m.window(mi, a, b); w != nil && bl[b] > 0 {
				if is {
					w.open = true
				} else {
					m.closeWindow(mi, w)
				}
			}
		}
	}
}

// serve counts tokens of service to r's tenant in every open window of a
// pair of equal-weight tenants of its model (see backlog). The simulator
// charges service before any backlog changes, so each token is counted
// under the backlog it was served in.
func (m *metrics) serve(r *request, tokens float64) {
	if r.warmup {
		return
	}
	mi, a := r.a.Model, m.tenantIdx[r.a.Tenant]
	for b := range m.backlogged[mi] {
		if w := m.window(mi, a, b); w != nil && w.open {
			w.service[side(a, b)] += tokens / m.weights[a]
			w.largest = max(w.largest, r.a.PromptTokens+r.a.OutputTokens)
		}
	}
}

// fairWindow is one pair's current window: a stretch of time in which both
// tenants were backlogged, and the service each got in it.
type fairWindow struct {
	open    bool
	service [2]float64
	// largest is the largest request (prompt + output) served in it.
	largest int
}

// window is the window of the pair {a, b} of model mi, or nil when a and b
// are the same tenant or differ in weight.
func (m *metrics) window(mi, a, b int) *fairWindow {
	if a == b || m.weights[a] != m.weights[b] {
		return nil
	}
	return &m.windows[mi][min(a, b)][max(a, b)]
}

// side is a's index in the service of the pair {a, b}.
func side(a, b int) int {
	if a < b {
		return 0
	}
	return 1
}

// closeWindow ends a pair's window and scores it.
func (m *metrics) closeWindow(mi int, w *fairWindow) {
	w.open = false
	sa, sb, u := w.service[0], w.service[1], w.largest
	w.service, w.largest = [2]float64{}, 0
	// VTC promises at most two requests' worth (2U, U the largest
	// request served in the window) of difference over such a window,
	// which is at most 4U/S of the larger share when the pair was served S
	// together. Only windows with S ≥ 40U, where a fair scheduler is held
	// to a 10% gap, are judged; in shorter ones a single request decides.
	if u == 0 || sa+sb < 40*float64(u) {
		return
	}
	m.fairWindows++
	m.fairGap = max(m.fairGap, (max(sa, sb)-min(sa, sb))/max(sa, sb))
}

func (m *metrics) end(r *request, o outcome, status int, now float64) {
	if r.warmup {
		return
	}
	mm := &m.models[r.a.Model]
	cfg := &m.cfg.Models[r.a.Model]
	switch o {
	case outcomeRejected:
		mm.rejected++
		m.rejectedByStatus[status]++
	case outcomeFailed:
		mm.failed++
		if r.firstAt >= 0 {
			mm.partial = append(mm.partial, r.firstAt-r.a.Time+r.a.lag+r.a.back)
		}
	case outcomeDone:
		mm.completed++
		ttft := r.firstAt - r.a.Time + r.a.lag + r.a.back
		mm.ttft = append(mm.ttft, ttft)
		ok := cfg.SLOTTFTSeconds == 0 || ttft <= cfg.SLOTTFTSeconds
		if r.a.OutputTokens > 1 {
			tpot := (now - r.firstAt) / float64(r.a.OutputTokens-1)
			mm.tpot = append(mm.tpot, tpot)
			ok = ok && (cfg.SLOTPOTSeconds == 0 || tpot <= cfg.SLOTPOTSeconds)
		}
		if ok {
			mm.met++
		}
		mm.outTokens += int64(r.a.OutputTokens)
	}
}

// startMeasuring ends the warm-up: engine events so far are not counted.
func (m *metrics) startMeasuring() {
	m.measuring = true
	m.atWarmup = [4]int{m.coldLoads, m.wakes, m.evictions, m.adapterLoads}
}

// sample runs every tick: it brings the running requests' service up to
// date.
func (m *metrics) sample(s *sim) {
	if !m.measuring && s.now >= m.cfg.WarmupSeconds {
		m.startMeasuring()
	}
	for _, e := range s.engines {
		for _, r := range e.running {
			s.charge(r)
		}
	}
}

// fairnessGap is the largest gap in weight-normalised service between two
// equal-weight tenants of one model over a window in which both were
// backlogged throughout, as a share of the larger: VTC's bound (and what a
// user sees) is about such windows. Across windows the scheduler rightly
// forgives: a tenant that stops sending is not owed the service it did
// not ask for. Windows still open at the end are scored then.
func (m *metrics) fairnessGap() float64 {
	for mi := range m.windows {
		for a := range m.windows[mi] {
			for b := a + 1; b < len(m.windows[mi]); b++ {
				if w := &m.windows[mi][a][b]; w.open {
					m.closeWindow(mi, w)
				}
			}
		}
	}
	return m.fairGap
}

func (m *metrics) finish(s *sim) {
	m.duration = s.end - m.cfg.WarmupSeconds
	if !m.measuring {
		m.startMeasuring()
	}
	// What never ended by the hard end failed.
	for _, e := range s.engines {
		for _, r := range append(append([]*request(nil), e.running...), e.waiting...) {
			r.ended = true
			if r.warmup {
				continue
			}
			m.models[r.a.Model].failed++
			if r.firstAt >= 0 {
				m.models[r.a.Model].partial = append(m.models[r.a.Model].partial, r.firstAt-r.a.Time+r.a.lag+r.a.back)
			}
			if s.onEnd != nil {
				s.onEnd(r, outcomeFailed)
			}
		}
	}
}

func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(math.Ceil(p/100*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}

func round(x float64, places int) float64 {
	if math.IsInf(x, 0) {
		return x
	}
	p := math.Pow(10, float64(places))
	return math.Round(x*p) / p
}

// offeredTTFT is the TTFT of every offered request of a model: completed
// ones, those cut off after their first token, and +∞ for the rest.
func (mm *modelMet) offeredTTFT() []float64 {
	out := make([]float64, 0, mm.requests)
	out = append(append(out, mm.ttft...), mm.partial...)
	for len(out) < mm.requests {
		out = append(out, math.Inf(1))
	}
	return out
}

func (m *metrics) result(policy string) Result {
	r := Result{Policy: policy, Card: m.cfg.Card.Name, DurationSeconds: m.duration, SLOAttainment: map[string]float64{},
		StarvedModels: []string{}}
	hours := m.duration / 3600
	classReq, classMet := map[string]int{}, map[string]int{}
	var inter, tpot []float64
	met := 0
	for i := range m.models {
		mm := &m.models[i]
		cfg := &m.cfg.Models[i]
		class := cfg.class.String()
		failed := mm.failed
		r.Requests += mm.requests
		r.Completed += mm.completed
		r.Rejected += mm.rejected
		// Requests neither completed, rejected nor failed were lost in the
		// drain: count them failed.
		lost := mm.requests - mm.completed - mm.rejected - failed
		failed += lost
		r.Failed += failed
		classReq[class] += mm.requests
		classMet[class] += mm.met
		met += mm.met
		ttft := mm.offeredTTFT()
		if cfg.class == queue.Interactive {
			inter = append(inter, ttft...)
		}
		tpot = append(tpot, mm.tpot...)
		slo := 0.0
		if mm.requests > 0 {
			slo = round(100*float64(mm.met)/float64(mm.requests), 2)
			r.ModelsWithDemand++
		}
		at := mm.requests > 0 && float64(mm.met) >= atSLOShare*float64(mm.requests)
		if at {
			r.ModelsAtSLO++
		}
		r.Models = append(r.Models, ModelStats{Model: cfg.Name, Class: class, Requests: mm.requests, Completed: mm.completed,
			Rejected: mm.rejected, Failed: failed, SLO: slo, AtSLO: at, withinSLO: at,
			TTFTP50: round(percentile(ttft, 50), 3), TTFTP95: round(percentile(ttft, 95), 3), TTFTP99: round(percentile(ttft, 99), 3),
			TPOTP95: round(percentile(mm.tpot, 95), 4)})
		if cfg.class == queue.Background {
			m.bgTokens += mm.outTokens
		}
	}
	for c, n := range classReq {
		if n > 0 {
			r.SLOAttainment[c] = round(100*float64(classMet[c])/float64(n), 2)
		}
	}
	r.InteractiveTTFTP95 = round(percentile(inter, 95), 3)
	r.TPOTP95 = round(percentile(tpot, 95), 4)
	r.ColdLoads, r.Wakes, r.Evictions = m.coldLoads-m.atWarmup[0], m.wakes-m.atWarmup[1], m.evictions-m.atWarmup[2]
	adapterLoads := m.adapterLoads - m.atWarmup[3]
	if hours > 0 {
		r.ColdLoadsPerHour = round(float64(r.ColdLoads)/hours, 1)
		r.WakesPerHour = round(float64(r.Wakes)/hours, 1)
		r.AdapterLoadsPerHour = round(float64(adapterLoads)/hours, 1)
	}
	if m.duration > 0 {
		r.BackgroundTokensPerSecond = round(float64(m.bgTokens)/m.duration, 1)
		r.GoodputPerSecond = round(float64(met)/m.duration, 3)
	}
	r.FairnessGapPercent = round(100*m.fairnessGap(), 2)
	r.FairnessWindows = m.fairWindows
	r.LedgerViolations = m.ctrlViolations + m.memoryViolations
	return r
}

// BackgroundObjectiveShare is a background model's objective: it is at
// SLO only when it also completes at least this share of the requests it
// completes alone on a card of its own (ideal). A background model's
// closed loop offers as many requests as it is answered, so "within SLO"
// alone would count a batch job served 3% of what it could do as at SLO.
const BackgroundObjectiveShare = 0.5

// ScoreBackground holds r's background models to their objective
// against ideal's run of the same workload: one that completed fewer than
// BackgroundObjectiveShare of ideal's completions for it is not at SLO
// (r.ModelsAtSLO recounted). Scoring again gives the same result.
func ScoreBackground(r *Result, ideal *Result) {
	r.ModelsAtSLO = 0
	for j := range r.Models {
		m := &r.Models[j]
		m.AtSLO = m.withinSLO
		m.Objective = 0
		if m.Class == queue.Background.String() && j < len(ideal.Models) {
			m.Objective = int(math.Ceil(BackgroundObjectiveShare * float64(ideal.Models[j].Completed)))
			if m.Completed < m.Objective {
				m.AtSLO = false
			}
		}
		if m.AtSLO {
			r.ModelsAtSLO++
		}
	}
}

// MarkStarved flags, in every result, the models served (completed) less
// than half of their offered requests while a reference policy
// (static-best or ideal, among rs) served ≥ 90% of theirs. Without a
// reference result nothing is flagged.
func MarkStarved(rs []Result) {
	var refs []*Result
	for i := range rs {
		if rs[i].Policy == PolicyStaticBest || rs[i].Policy == PolicyIdeal {
			refs = append(refs, &rs[i])
		}
	}
	for i := range rs {
		r := &rs[i]
		r.StarvedModels = []string{}
		for j := range r.Models {
			m := &r.Models[j]
			m.Starved = false
			if m.Requests == 0 || float64(m.Completed) >= starvedShare*float64(m.Requests) {
				continue
			}
			for _, ref := range refs {
				if j < len(ref.Models) {
					x := ref.Models[j]
					if x.Requests > 0 && float64(x.Completed) >= servedShare*float64(x.Requests) {
						m.Starved = true
					}
				}
			}
			if m.Starved {
				r.StarvedModels = append(r.StarvedModels, m.Model)
			}
		}
	}
}

// secondsText prints a duration in seconds, ∞ for +∞.
func secondsText(v float64) string {
	if math.IsInf(v, 1) {
		return "∞"
	}
	return fmt.Sprintf("%g", v)
}

// WriteTable prints results side by side (one column per policy), then
// each policy's per-model table.
func WriteTable(w io.Writer, rs []Result) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	row := func(name string, f func(Result) string) {
		cells := []string{name}
		for _, r := range rs {
			cells = append(cells, f(r))
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t")+"\t")
	}
	num := func(v float64) string { return fmt.Sprintf("%g", v) }
	row("policy", func(r Result) string { return r.Policy })
	row("models at SLO", func(r Result) string { return fmt.Sprintf("%d of %d", r.ModelsAtSLO, r.ModelsWithDemand) })
	row("starved models", func(r Result) string {
		if len(r.StarvedModels) == 0 {
			return "-"
		}
		return strings.Join(r.StarvedModels, ",")
	})
	row("goodput req/s", func(r Result) string { return num(r.GoodputPerSecond) })
	row("offered", func(r Result) string { return fmt.Sprint(r.Requests) })
	row("completed", func(r Result) string { return fmt.Sprint(r.Completed) })
	row("rejected", func(r Result) string { return fmt.Sprint(r.Rejected) })
	row("failed", func(r Result) string { return fmt.Sprint(r.Failed) })
	for _, c := range []string{"interactive", "standard", "background"} {
		if _, ok := rs[0].SLOAttainment[c]; !ok {
			continue
		}
		row("SLO % "+c, func(r Result) string { return num(r.SLOAttainment[c]) })
	}
	row("interactive TTFT p95 s", func(r Result) string { return secondsText(r.InteractiveTTFTP95) })
	row("TPOT p95 s", func(r Result) string { return num(r.TPOTP95) })
	row("cold loads /h", func(r Result) string { return num(r.ColdLoadsPerHour) })
	row("wakes /h", func(r Result) string { return num(r.WakesPerHour) })
	row("evictions", func(r Result) string { return fmt.Sprint(r.Evictions) })
	row("adapter loads /h", func(r Result) string { return num(r.AdapterLoadsPerHour) })
	row("background tok/s", func(r Result) string { return num(r.BackgroundTokensPerSecond) })
	row("fairness gap % (windows)", func(r Result) string {
		return fmt.Sprintf("%g (%d)", r.FairnessGapPercent, r.FairnessWindows)
	})
	row("ledger violations", func(r Result) string { return fmt.Sprint(r.LedgerViolations) })
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, r := range rs {
		for _, why := range r.BestEffort {
			fmt.Fprintf(w, "\n%s best-effort at the end: %s", r.Policy, why)
		}
		if len(r.BestEffort) > 0 {
			fmt.Fprintln(w)
		}
		if x := r.StaticBestSearch; x != nil {
			how := "optimum proven (no set left could hold more models at SLO)"
			if !x.Proven {
				how = fmt.Sprintf("cap of %d sets reached: best found, not proven", x.Cap)
			}
			fmt.Fprintf(w, "\nstatic-best: %d of %d candidate sets simulated, %s; hosts %s\n", x.Simulated, x.Candidates, how, strings.Join(x.Hosted, ", "))
		}
	}
	for _, r := range rs {
		fmt.Fprintf(w, "\n%s, per model (SLO and TTFT over offered requests; ∞: never answered):\n", r.Policy)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "model\tclass\toffered\tdone\trejected\tfailed\tSLO %\tTTFT p50 s\tp95 s\tp99 s\t\t")
		for _, m := range r.Models {
			mark := ""
			switch {
			case m.Starved:
				mark = "starved"
			case m.AtSLO:
				mark = "at SLO"
			case m.withinSLO && m.Objective > 0:
				mark = fmt.Sprintf("below objective (%d done < %d)", m.Completed, m.Objective)
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%g\t%s\t%s\t%s\t%s\t\n", m.Model, m.Class, m.Requests, m.Completed, m.Rejected, m.Failed,
				m.SLO, secondsText(m.TTFTP50), secondsText(m.TTFTP95), secondsText(m.TTFTP99), mark)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	return nil
}
