package simserve

import (
	"fmt"
	"strings"
)

// Policies are the policies `--policy` accepts, in table order.
var Policies = []string{"gpuplane", "ollama", "llamaswap", "static"}

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
		s.pol = &ollama{s: s}
	case "llamaswap":
		s.pol = &llamaSwap{s: s}
	case "static":
		s.pol = &static{s: s}
	default:
		_, err := ParsePolicy(policy)
		return Result{}, err
	}
	s.run(w.Arrivals)
	return s.met.result(policy), nil
}
