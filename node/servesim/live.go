package servesim

import (
	"fmt"
	"math"
	"slices"
	"strings"
)

// What `gpuplane bench interference` (the live matrix on real agents and
// sim engine processes) shares with Matrix: the mixes' streams, the cells'
// model sets, the percentile and the summary (relative p95 and flags) a
// MatrixResult gets from its cells, so that both report the same way.

// MatrixThrash is the reloads per hour of a pair, beyond what its models
// cost alone, that the matrix flags as thrashing.
const MatrixThrash = matrixThrash

// Stream is the synthetic stream the mix gives model m.
func (x Mix) Stream(m *ModelConfig) SyntheticStream { return x.stream(m) }

// Sets are the matrix's model sets, as indexes into the config's models in
// config order: each model alone, every pair, then the whole set (when
// there are more than two).
func Sets(n int) [][]int {
	var sets [][]int
	for i := range n {
		sets = append(sets, []int{i})
	}
	for i := range n {
		for j := i + 1; j < n; j++ {
			sets = append(sets, []int{i, j})
		}
	}
	if n > 2 {
		all := make([]int, n)
		for i := range all {
			all[i] = i
		}
		sets = append(sets, all)
	}
	return sets
}

// Percentile is the nearest-rank p-th percentile of xs (0 for none), as
// the simulator's measures use.
func Percentile(xs []float64, p float64) float64 { return percentile(xs, p) }

// Summarize fills res.Relative, res.WorstMix and res.Flags from res.Cells
// and cfg's targets, by the rules Matrix applies: a model's p95 TTFT with
// a partner (or the full set) over its p95 alone under the mix where that
// is worst; a flag for a pair whose reloads beyond its models' alone
// exceed matrixThrash per hour, or that breaks a target a model meets
// alone. res.Models must be cfg's model names in config order, and each
// cell's Models in that order too.
func Summarize(cfg *Config, res *MatrixResult) {
	type key struct{ set, mix string }
	stats := map[key]map[string]ModelStats{}
	reloads := map[key]float64{}
	for _, c := range res.Cells {
		k := key{strings.Join(c.Models, "+"), c.Mix}
		stats[k] = map[string]ModelStats{}
		for _, ms := range c.PerModel {
			stats[k][ms.Model] = ms
		}
		reloads[k] = c.ColdLoadsPerHour + c.WakesPerHour
	}
	n := len(res.Models)
	allKey := strings.Join(res.Models, "+")
	res.Relative, res.WorstMix, res.Flags = make([][]float64, n), make([][]string, n), nil
	for i, a := range res.Models {
		res.Relative[i], res.WorstMix[i] = make([]float64, n), make([]string, n)
		for j := range res.Models {
			with := allKey
			if j != i {
				with = pairKey(res.Models, i, j)
			}
			for _, mix := range Mixes {
				alone, ok1 := stats[key{a, mix.Name}][a]
				shared, ok2 := stats[key{with, mix.Name}][a]
				if !ok1 || !ok2 || alone.Completed == 0 || shared.Completed == 0 || alone.TTFTP95 <= 0 {
					continue
				}
				if ratio := shared.TTFTP95 / alone.TTFTP95; ratio > res.Relative[i][j] {
					res.Relative[i][j], res.WorstMix[i][j] = round(ratio, 2), mix.Name
				}
			}
		}
	}
	for i := range n {
		for j := i + 1; j < n; j++ {
			pk := pairKey(res.Models, i, j)
			pair := [2]string{res.Models[i], res.Models[j]}
			for _, mix := range Mixes {
				pr, ok := reloads[key{pk, mix.Name}]
				if !ok {
					continue
				}
				extra := pr - reloads[key{res.Models[i], mix.Name}] - reloads[key{res.Models[j], mix.Name}]
				if extra > matrixThrash {
					res.Flags = append(res.Flags, Flag{Pair: pair, Mix: mix.Name,
						Reason: fmt.Sprintf("%.0f reloads/h together beyond what each costs alone (> %d)", extra, matrixThrash),
						Remedy: fmt.Sprintf("serialize %s and %s: time slots on the card instead of a swap per request", pair[0], pair[1])})
				}
				for _, x := range []int{i, j} {
					m := &cfg.Models[slices.IndexFunc(cfg.Models, func(c ModelConfig) bool { return c.Name == res.Models[x] })]
					alone, ok1 := stats[key{m.Name, mix.Name}][m.Name]
					shared, ok2 := stats[key{pk, mix.Name}][m.Name]
					// A model sent nothing in the cell (a short live run of a
					// sparse mix) has nothing to judge.
					if m.SLOTTFTSeconds == 0 || !ok1 || !ok2 || alone.TTFTP95 > m.SLOTTFTSeconds || alone.Requests == 0 || shared.Requests == 0 {
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
}

// Round rounds x to places decimals, as the reports do.
func Round(x float64, places int) float64 {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return x
	}
	return round(x, places)
}
