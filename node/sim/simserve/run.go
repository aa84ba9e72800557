package simserve

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
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
	return run(cfg, w, policy, seed, nil)
}

func run(cfg *Config, w *Workload, policy string, seed uint64, observe func(*sim)) (Result, error) {
	s := newSim(cfg, seed, w.End)
	s.observe = observe
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
		hosted, err := staticBest(cfg, w, seed)
		if err != nil {
			return Result{}, err
		}
		s.pol = &static{s: s, hosted: hosted}
	case PolicyIdeal:
		// An unbounded card: every model resident, compute still shared.
		s.usable = math.MaxInt64
		hosted := make([]bool, len(s.engines))
		for i := range hosted {
			hosted[i] = true
		}
		s.pol = &static{s: s, hosted: hosted}
	default:
		_, err := ParsePolicy(policy)
		return Result{}, err
	}
	s.run(w.Arrivals)
	return s.met.result(policy), nil
}

// RunAll runs the policies on the same workload and flags starved models
// (MarkStarved), running static-best and ideal as references where they
// are not among the policies; only the policies asked for are returned.
func RunAll(cfg *Config, w *Workload, policies []string, seed uint64, each func(Result)) ([]Result, error) {
	all := slices.Clone(policies)
	for _, ref := range []string{PolicyStaticBest, PolicyIdeal} {
		if !slices.Contains(all, ref) {
			all = append(all, ref)
		}
	}
	var rs []Result
	for _, p := range all {
		r, err := Run(cfg, w, p, seed)
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

// staticBestCandidates bounds how many sets static-best simulates.
const staticBestCandidates = 8

// staticBest searches for the strongest static partition an operator could
// choose for the workload: every maximal set of models that fits the card
// (its models resident together, loaded one at a time), ranked by the
// requests of the workload it hosts; the first staticBestCandidates are
// simulated and the one with the most models at SLO, then the most
// goodput, wins (ties: the earlier in rank).
func staticBest(cfg *Config, w *Workload, seed uint64) ([]bool, error) {
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
	type cand struct {
		set    []bool
		demand int
	}
	var cands []cand
	set := make([]bool, n)
	var walk func(i int)
	walk = func(i int) {
		if len(cands) >= 1<<14 {
			return
		}
		if i == n {
			for j := range set {
				if !set[j] {
					set[j] = true
					ok := fits(set)
					set[j] = false
					if ok {
						return // not maximal
					}
				}
			}
			d := 0
			for j, in := range set {
				if in {
					d += demand[j]
				}
			}
			cands = append(cands, cand{slices.Clone(set), d})
			return
		}
		set[i] = true
		if fits(set) {
			walk(i + 1)
		}
		set[i] = false
		walk(i + 1)
	}
	walk(0)
	slices.SortStableFunc(cands, func(a, b cand) int { return -cmp.Compare(a.demand, b.demand) })
	var best []bool
	bestAt, bestGood := -1, -1.0
	for k, c := range cands {
		if k == staticBestCandidates {
			break
		}
		s := newSim(cfg, seed, w.End)
		s.pol = &static{s: s, hosted: c.set}
		s.run(w.Arrivals)
		r := s.met.result(PolicyStaticBest)
		if r.ModelsAtSLO > bestAt || r.ModelsAtSLO == bestAt && r.GoodputPerSecond > bestGood {
			best, bestAt, bestGood = c.set, r.ModelsAtSLO, r.GoodputPerSecond
		}
	}
	if best == nil {
		return nil, fmt.Errorf("static-best: no set of models fits card %s", cfg.Card.Name)
	}
	return best, nil
}
