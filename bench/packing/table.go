package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// tolerance is how far, in points, the default may trail the best of the
// others and still count as level with it.
const tolerance = 0.1

type rowKey struct {
	list, nodes string
	inflate     float64
}

// half names the half of the family a list belongs to.
func half(list string) string {
	if Tune[list] {
		return "tune"
	}
	return "**held-out**"
}

// verdict is one row's comparison on one metric: the default's mean, the
// best other's, and the difference in points (positive: the default is
// better).
type verdict struct {
	mine, best float64
	bestBy     string
	gain       float64
}

func (v verdict) ok() bool { return v.gain >= -tolerance-1e-9 }

// writeTable writes the markdown table: per node list, the tune half then
// the held-out half, each list's cells for every policy on both metrics,
// and the default's margin over the best of the others.
func (c *config) writeTable(w io.Writer, cells []Cell, start time.Time, took time.Duration) error {
	by := map[rowKey]map[string]Cell{}
	var rows []rowKey
	for _, cl := range cells {
		k := rowKey{cl.List, cl.Nodes, cl.Inflate}
		if by[k] == nil {
			by[k] = map[string]Cell{}
			rows = append(rows, k)
		}
		by[k][cl.Policy] = cl
	}
	slices.SortFunc(rows, func(a, b rowKey) int {
		if a.nodes != b.nodes {
			return strings.Compare(b.nodes, a.nodes)
		}
		if ta, tb := Tune[a.list], Tune[b.list]; ta != tb {
			if ta {
				return -1
			}
			return 1
		}
		if ia, ib := slices.Index(PodLists, a.list), slices.Index(PodLists, b.list); ia != ib {
			return ia - ib
		}
		switch {
		case a.inflate < b.inflate:
			return -1
		case a.inflate > b.inflate:
			return 1
		}
		return 0
	})
	mine := string(c.policies[0])
	others := c.policies[1:]
	fmt.Fprintf(w, "`%s`, started %s UTC, took %s.\n\n", c.command, start.Format("2006-01-02 15:04"), took.Round(time.Second))
	if len(c.absentLists) > 0 {
		fmt.Fprintf(w, "Absent from %s, skipped: %s.\n\n", c.dir, strings.Join(c.absentLists, ", "))
	}
	if len(c.absentNLs) > 0 {
		fmt.Fprintf(w, "Node lists absent, skipped: %s.\n\n", strings.Join(c.absentNLs, ", "))
	}
	fmt.Fprintf(w, "Mean over seeds 1–%d (± sample standard deviation), %% of the cluster's GPU capacity. "+
		"Margin: %s minus the best of the others, in points, positive when %s is better; "+
		"\"ok\" when it trails by at most %.1f.\n\n", c.seeds, mine, mine, tolerance)
	hdr := []string{"list", "half", "nodes", "inflate"}
	for _, p := range c.policies {
		hdr = append(hdr, string(p)+" unallocated at 100 %")
	}
	hdr = append(hdr, "margin")
	for _, p := range c.policies {
		hdr = append(hdr, string(p)+" allocated at first failure")
	}
	hdr = append(hdr, "margin")
	fmt.Fprintf(w, "| %s |\n|%s\n", strings.Join(hdr, " | "), strings.Repeat("---|", len(hdr)))

	type tally struct {
		rows, ok100, okFF     int
		worst100, worstFF     float64
		worst100At, worstFFAt string
	}
	tallies := map[string]*tally{}
	var halves []string
	for _, k := range rows {
		m := by[k]
		cells := []string{k.list, half(k.list), k.nodes, fmt.Sprintf("%g %%", k.inflate)}
		var v100, vFF verdict
		have := len(others) > 0
		for _, metric := range []int{0, 1} {
			val := func(cl Cell) (float64, float64) {
				if metric == 0 {
					return 100 * cl.UnallocatedAt100.Mean, 100 * cl.UnallocatedAt100.Spread
				}
				return 100 * cl.AllocatedAtFirstFailure.Mean, 100 * cl.AllocatedAtFirstFailure.Spread
			}
			v := verdict{}
			first := true
			for i, p := range c.policies {
				cl, ok := m[string(p)]
				if !ok {
					cells = append(cells, "–")
					have = false
					continue
				}
				mean, sd := val(cl)
				cells = append(cells, fmt.Sprintf("%.2f ± %.2f", mean, sd))
				if i == 0 {
					v.mine = mean
					continue
				}
				better := (metric == 0 && mean < v.best) || (metric == 1 && mean > v.best)
				if first || better {
					v.best, v.bestBy, first = mean, string(p), false
				}
			}
			if !have {
				cells = append(cells, "–")
				continue
			}
			if metric == 0 {
				v.gain = v.best - v.mine
				v100 = v
			} else {
				v.gain = v.mine - v.best
				vFF = v
			}
			mark := "ok"
			if !v.ok() {
				mark = "**short**"
			}
			cells = append(cells, fmt.Sprintf("%+.2f %s", v.gain, mark))
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(cells, " | "))
		if !have {
			continue
		}
		hk := k.nodes + " nodes, " + strings.Trim(half(k.list), "*")
		t := tallies[hk]
		if t == nil {
			t = &tally{worst100: 1e9, worstFF: 1e9}
			tallies[hk] = t
			halves = append(halves, hk)
		}
		t.rows++
		if v100.ok() {
			t.ok100++
		}
		if vFF.ok() {
			t.okFF++
		}
		if v100.gain < t.worst100 {
			t.worst100, t.worst100At = v100.gain, k.list
		}
		if vFF.gain < t.worstFF {
			t.worstFF, t.worstFFAt = vFF.gain, k.list
		}
	}
	if len(halves) == 0 {
		return nil
	}
	fmt.Fprintf(w, "\n| node list, half | lists | %s level or ahead at 100 %% | smallest margin | level or ahead at first failure | smallest margin |\n|---|---|---|---|---|---|\n", mine)
	for _, hk := range halves {
		t := tallies[hk]
		fmt.Fprintf(w, "| %s | %d | %d | %+.2f (%s) | %d | %+.2f (%s) |\n", hk, t.rows, t.ok100, t.worst100, t.worst100At,
			t.okFF, t.worstFF, t.worstFFAt)
	}
	return nil
}
