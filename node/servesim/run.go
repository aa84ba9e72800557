package servesim

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"
)

// The policies whose results MarkStarved compares against.
const (
	PolicyStaticBest = "static-best"
	PolicyIdeal      = "ideal"
)

// Policies are the policies `--policy` accepts, in table order.
var Policies = []string{"gpuplane", "ollama", "ollama-np4", "llamaswap", "static", PolicyStaticBest, PolicyIdeal}

// ParsePolicy checks a policy name.
func ParsePolicy(name string) (string, error) {
	for _, p := range Policies {
		if strings.EqualFold(name, p) {
			return p, nil
		}
	}
	return "", fmt.Errorf("unknown policy %q: want %s or all", name, strings.Join(Policies, ", "))
}

// Workload is what a run replays: the trace arrivals and the synthetic
// open-loop arrivals, sorted, and where arrivals stop.
type Workload struct {
	Arrivals []Arrival
	End      float64
}

// NewWorkload reads the traces and draws the synthetic streams for a seed.
// The same config, traces and seed always give the same workload.
func NewWorkload(cfg *Config, traces []string, seed uint64) (*Workload, error) {
	arr, err := ReadTraces(cfg, traces, seed)
	if err != nil {
		return nil, err
	}
	end := cfg.DurationSeconds
	if end == 0 {
		if len(arr) > 0 {
			end = arr[len(arr)-1].Time
		} else {
			end = 3600
		}
	}
	kept := arr[:0]
	for _, a := range arr {
		if a.Time <= end {
			kept = append(kept, a)
		}
	}
	arr = append(kept, syntheticOpen(cfg, seed, end)...)
	sortArrivals(arr)
	return &Workload{Arrivals: arr, End: end}, nil
}

// Run replays the workload under one policy and returns its result.
func Run(cfg *Config, w *Workload, policy string, seed uint64) (Result, error) {
	return run(cfg, w, policy, seed, nil, nil)
}

// run replays the workload under one policy; ideal, when given, is the
// ideal reference already run on it (static-best's bound and the
// background objective), else it is run here when needed.
func run(cfg *Config, w *Workload, policy string, seed uint64, observe func(*sim), ideal *Result) (Result, error) {
	if policy == PolicyIdeal {
		return runIdeal(cfg, w, seed), nil
	}
	needIdeal := policy == PolicyStaticBest || cfg.hasBackground()
	if ideal == nil && needIdeal {
		r := runIdeal(cfg, w, seed)
		ideal = &r
	}
	s := newSim(cfg, seed, w.End)
	s.observe = observe
	var search *SearchReport
	switch policy {
	case "gpuplane":
		p, err := newGpuplane(s)
		if err != nil {
			return Result{}, err
		}
		s.pol = p
	case "ollama":
		s.pol = &ollama{s: s, numParallel: cfg.Ollama.NumParallel}
	case "ollama-np4":
		s.pol = &ollama{s: s, numParallel: 4}
	case "llamaswap":
		s.pol = &llamaSwap{s: s}
	case "static":
		s.pol = &static{s: s, hosted: staticFirstFit(s)}
	case PolicyStaticBest:
		hosted, rep, err := staticBest(cfg, w, seed, ideal, cfg.StaticBestCap)
		if err != nil {
			return Result{}, err
		}
		search = &rep
		s.pol = &static{s: s, hosted: hosted}
	default:
		_, err := ParsePolicy(policy)
		return Result{}, err
	}
	s.run(w.Arrivals)
	r := s.met.result(policy)
	r.StaticBestSearch = search
	if g, ok := s.pol.(*gpuplane); ok {
		for _, e := range g.c.BestEffort() {
			r.BestEffort = append(r.BestEffort, e.Reason)
		}
	}
	if ideal != nil {
		ScoreBackground(&r, ideal)
	}
	return r, nil
}

// runIdeal is the per-model upper bound: each model alone on a card of
// its own of the same kind, loaded at the start and kept, replaying only
// its own arrivals; the result gathers each model's figures from its own
// run (the card totals are their sums).
func runIdeal(cfg *Config, w *Workload, seed uint64) Result {
	all := newMetrics(cfg)
	all.measuring = true
	for i := range cfg.Models {
		s := newSim(cfg, seed, w.End)
		s.alone = i + 1
		hosted := make([]bool, len(s.engines))
		hosted[i] = true
		s.pol = &static{s: s, hosted: hosted}
		s.run(w.Arrivals)
		m := s.met
		m.fairnessGap()
		all.models[i] = m.models[i]
		all.coldLoads += m.coldLoads
		all.wakes += m.wakes
		all.evictions += m.evictions
		all.adapterLoads += m.adapterLoads
		for k := range all.atWarmup {
			all.atWarmup[k] += m.atWarmup[k]
		}
		all.ctrlViolations += m.ctrlViolations
		all.memoryViolations += m.memoryViolations
		all.fairGap = max(all.fairGap, m.fairGap)
		all.fairWindows += m.fairWindows
		all.duration = m.duration
	}
	return all.result(PolicyIdeal)
}

// RunAll runs the policies on the same workload and flags starved models
// (MarkStarved), running static-best and ideal as references where they
// are not among the policies; only the policies asked for are returned.
// Ideal runs first: static-best's search and the background objective
// (ScoreBackground) are measured against it.
func RunAll(cfg *Config, w *Workload, policies []string, seed uint64, each func(Result)) ([]Result, error) {
	ideal := runIdeal(cfg, w, seed)
	all := slices.Clone(policies)
	for _, ref := range []string{PolicyStaticBest, PolicyIdeal} {
		if !slices.Contains(all, ref) {
			all = append(all, ref)
		}
	}
	var rs []Result
	for _, p := range all {
		if p == PolicyIdeal {
			rs = append(rs, ideal)
			continue
		}
		r, err := run(cfg, w, p, seed, nil, &ideal)
		if err != nil {
			return nil, err
		}
		rs = append(rs, r)
	}
	MarkStarved(rs)
	rs = rs[:len(policies)]
	if each != nil {
		for _, r := range rs {
			each(r)
		}
	}
	return rs, nil
}

// SearchReport is what static-best's search did: how many sets it
// simulated of how many it had to consider, whether it proved its
// choice optimal, and how long it took.
type SearchReport struct {
	// Candidates: the sets of models that fit the card and could hold all
	// their models at SLO (each at SLO alone); every other set is bounded
	// by one of them.
	Candidates int `json:"candidates"`
	// Simulated: the sets run (candidates, then the extension of the best
	// with the remaining models).
	Simulated int `json:"simulated"`
	// Proven: no set not simulated can hold more models at SLO than the
	// one chosen (the search stopped on its bound, not on the cap).
	Proven bool `json:"proven"`
	Cap    int  `json:"cap"`
	// Seconds is the search's wall time (not in the JSON, which the same
	// inputs always reproduce).
	Seconds float64 `json:"-"`
	// Hosted names the models of the chosen set.
	Hosted []string `json:"hosted"`
}

// staticBestTies is how many sets of the best size found static-best
// also tries for goodput.
const staticBestTies = 4

// DefaultStaticBestCap bounds how many sets static-best simulates.
const DefaultStaticBestCap = 400

// staticBest searches for the strongest static partition an operator could
// choose for the workload, exactly: a model held at SLO in any set is held
// at SLO alone on the card (ideal, which no set beats per model), so a set
// holds at most as many models at SLO as it has models at SLO alone.
// Every set of such models that fits the card (resident together, loaded
// one at a time) is a candidate whose bound is its size; candidates run
// largest first (ties: the most requests hosted) until the best found
// reaches the bound of the next, which proves it optimal, or cap sets
// ran; static's own set is the first. The winner is then offered, one at a time by demand, the models
// outside it that fit beside it, each kept when it adds goodput and
// costs no model its SLO.
func staticBest(cfg *Config, w *Workload, seed uint64, ideal *Result, cap int) ([]bool, SearchReport, error) {
	start := time.Now()
	if cap <= 0 {
		cap = DefaultStaticBestCap
	}
	rep := SearchReport{Cap: cap}
	n := len(cfg.Models)
	usable := cfg.usableBytes()
	demand := make([]int, n)
	for _, a := range w.Arrivals {
		if a.Time >= cfg.WarmupSeconds && !a.aside {
			demand[a.Model]++
		}
	}
	for _, st := range cfg.Synthetic {
		// Closed loops have no arrivals ahead: each outstanding request
		// weighs as 100 requests, as an operator weighs a batch job.
		demand[cfg.model(st.Model)] += st.Concurrency * 100
	}
	fits := func(set []bool) bool {
		var sum, extra int64
		for i, in := range set {
			if in {
				m := &cfg.Models[i]
				sum += bytesOf(m.MemoryGiB)
				extra = max(extra, bytesOf(m.PeakGiB)-bytesOf(m.MemoryGiB))
			}
		}
		return sum+extra <= usable
	}
	var able []int
	for i := range n {
		if ideal.Models[i].AtSLO {
			able = append(able, i)
		}
	}
	type cand struct {
		set          []bool
		size, demand int
	}
	var cands []cand
	set := make([]bool, n)
	var walk func(k, size int)
	walk = func(k, size int) {
		if k == len(able) {
			if size == 0 {
				return
			}
			d := 0
			for j, in := range set {
				if in {
					d += demand[j]
				}
			}
			cands = append(cands, cand{slices.Clone(set), size, d})
			return
		}
		i := able[k]
		set[i] = true
		if fits(set) {
			walk(k+1, size+1)
		}
		set[i] = false
		walk(k+1, size)
	}
	walk(0, 0)
	slices.SortStableFunc(cands, func(a, b cand) int {
		return cmp.Or(-cmp.Compare(a.size, b.size), -cmp.Compare(a.demand, b.demand))
	})
	rep.Candidates = len(cands)
	eval := func(hosted []bool) Result {
		rep.Simulated++
		s := newSim(cfg, seed, w.End)
		s.pol = &static{s: s, hosted: hosted}
		s.run(w.Arrivals)
		r := s.met.result(PolicyStaticBest)
		ScoreBackground(&r, ideal)
		return r
	}
	// static's set (first fit) is where the search starts: static-best is
	// never below static.
	s0 := newSim(cfg, seed, w.End)
	best := staticFirstFit(s0)
	r0 := eval(best)
	bestAt, bestGood := r0.ModelsAtSLO, r0.GoodputPerSecond
	rep.Proven = true
	ties := 0
	for _, c := range cands {
		if c.size < bestAt {
			break // no set left can hold more than the best found
		}
		if c.size == bestAt {
			// As many at best: the most demanded few are tried for
			// goodput.
			if ties == staticBestTies {
				break
			}
			ties++
		}
		if rep.Simulated >= cap {
			rep.Proven = false
			break
		}
		r := eval(c.set)
		if r.ModelsAtSLO > bestAt || r.ModelsAtSLO == bestAt && r.GoodputPerSecond > bestGood {
			best, bestAt, bestGood = c.set, r.ModelsAtSLO, r.GoodputPerSecond
		}
	}
	// Extend the winner with models outside it, by demand, where that adds
	// goodput without costing a model its SLO.
	rest := make([]int, 0, n)
	for i := range n {
		if !best[i] && demand[i] > 0 {
			rest = append(rest, i)
		}
	}
	slices.SortStableFunc(rest, func(a, b int) int { return -cmp.Compare(demand[a], demand[b]) })
	for _, i := range rest {
		try := slices.Clone(best)
		try[i] = true
		if !fits(try) || rep.Simulated >= cap {
			continue
		}
		r := eval(try)
		if r.ModelsAtSLO >= bestAt && r.GoodputPerSecond > bestGood {
			best, bestAt, bestGood = try, r.ModelsAtSLO, r.GoodputPerSecond
		}
	}
	for i, in := range best {
		if in {
			rep.Hosted = append(rep.Hosted, cfg.Models[i].Name)
		}
	}
	if !slices.Contains(best, true) {
		return nil, rep, fmt.Errorf("static-best: no set of models fits card %s", cfg.Card.Name)
	}
	rep.Seconds = round(time.Since(start).Seconds(), 2)
	return best, rep, nil
}
