package scheduler

import (
	"fmt"
	"sort"
	"strings"
)

// reason explains, with numbers, why no node can take the request (docs/descriptors.md rule 12), e.g.
//
//	no l4 card has 45% free: 2 cards bound to "fast", 2 cards have at most 30% free
//
// Each card is counted once, under the first obstacle in this order: its
// node is down, does not match the selector, or lacks host CPU or memory;
// the card is unhealthy, bound to another accelerator, full of replicas
// (maxModels) or of shares. It is only called when placement failed, so it
// may be slow.
func (s *State) reason(q *request) string {
	var (
		nodesDown, cardsDown   int
		nodesSel, nodesHost    int
		maxCPU, maxMem         int64 = -1, -1
		unhealthy, atMax, held int
		lowFree, maxLow        int = 0, -1
		fewNodes, maxFew       int
		kindCards              int
		bound                  = make([]int, len(s.accs)) // per accelerator
	)
	// A request for one kind concerns only the nodes with cards of it
	// (kindNodes, ascending as the full scan): the others have none of its
	// cards to count.
	var only []int32
	if k := q.singleKind(); k >= 0 && q.mode != modeHost && int(k) < len(s.kindNodes) {
		only = s.kindNodes[k]
	}
	count := len(s.nodes)
	if only != nil {
		count = len(only)
	}
	for i := 0; i < count; i++ {
		ni := i
		if only != nil {
			ni = int(only[i])
		}
		n := &s.nodes[ni]
		nc := 0
		if q.mode != modeHost && q.kinds == nil {
			nc = int(n.n) // every card is of an allowed kind
		} else if q.mode != modeHost {
			for ci := n.first; ci < n.first+n.n; ci++ {
				if q.kinds.has(s.cards[ci].kind) {
					nc++
				}
			}
			if nc == 0 {
				continue
			}
		}
		kindCards += nc
		switch {
		case !n.alive:
			nodesDown++
			cardsDown += nc
			continue
		case len(q.Selector) > 0 && !selectorMatches(q.Selector, n.labels):
			nodesSel++
			continue
		case !n.hostFits(q.CPUMilli, q.MemoryMiB):
			nodesHost++
			maxCPU = max(maxCPU, n.cpuFree())
			maxMem = max(maxMem, n.memFree())
			continue
		}
		if q.mode == modeHost {
			continue
		}
		wholeFree := 0
		for ci := n.first; ci < n.first+n.n; ci++ {
			c := &s.cards[ci]
			if !q.kinds.has(c.kind) {
				continue
			}
			switch {
			case !c.healthy:
				unhealthy++
			case c.acc >= 0 && c.acc != q.acc:
				bound[c.acc]++
			case q.mode == modeWhole && c.Replicas > 0:
				held++
			case q.mode == modeWhole:
				wholeFree++
			case q.maxMM > 0 && c.Replicas >= q.maxMM:
				atMax++
			case q.milli > c.Room(q.res):
				lowFree++
				maxLow = max(maxLow, int(c.Room(q.res)))
			}
		}
		if q.mode == modeWhole && wholeFree > 0 && wholeFree < q.k {
			fewNodes++
			maxFew = max(maxFew, wholeFree)
		}
	}

	kind := s.kindText(q.kinds)
	var head string
	switch q.mode {
	case modeHost:
		head = "no node has " + hostText(q.CPUMilli, q.MemoryMiB) + " free"
		if q.CPUMilli == 0 && q.MemoryMiB == 0 {
			head = "no node can take it"
		}
		if len(s.nodes) == 0 {
			return "no nodes in the cluster"
		}
	case modeShared:
		head = fmt.Sprintf("no %scard has %s free", kind, Percent(int(q.milli)))
		if q.res == OnDemand {
			head = fmt.Sprintf("no %scard has %s not pinned for an onDemand replica", kind, Percent(int(q.milli)))
		}
	default:
		if q.k == 1 {
			head = fmt.Sprintf("no free %scard", kind)
		} else {
			head = fmt.Sprintf("no node has %d free %scards", q.k, kind)
		}
	}
	if q.mode != modeHost && kindCards == 0 {
		return fmt.Sprintf("no %scards in the cluster", kind)
	}

	var parts []string
	if nodesDown > 0 {
		p := plural(nodesDown, "node") + " down"
		if q.mode != modeHost {
			p += " (" + plural(cardsDown, "card") + ")"
		}
		parts = append(parts, p)
	}
	if nodesSel > 0 {
		parts = append(parts, fmt.Sprintf("%s %s not match selector %s",
			plural(nodesSel, "node"), pick(nodesSel, "does", "do"), selectorText(q.Selector)))
	}
	if nodesHost > 0 {
		parts = append(parts, fmt.Sprintf("%s %s at most %s free", plural(nodesHost, "node"),
			pick(nodesHost, "has", "have"), hostFreeText(q.CPUMilli, q.MemoryMiB, maxCPU, maxMem)))
	}
	if unhealthy > 0 {
		parts = append(parts, plural(unhealthy, "card")+" unhealthy")
	}
	var accs []int32
	for a, n := range bound {
		if n > 0 {
			accs = append(accs, int32(a))
		}
	}
	sort.Slice(accs, func(i, j int) bool { return s.accs[accs[i]].spec.Name < s.accs[accs[j]].spec.Name })
	for _, a := range accs {
		parts = append(parts, fmt.Sprintf("%s bound to %q", plural(bound[a], "card"), s.accs[a].spec.Name))
	}
	if held > 0 {
		parts = append(parts, fmt.Sprintf("%s already %s a replica of %q", plural(held, "card"),
			pick(held, "holds", "hold"), q.Accelerator))
	}
	if atMax > 0 {
		parts = append(parts, fmt.Sprintf("%s already %s %d replicas (maxModels)", plural(atMax, "card"),
			pick(atMax, "holds", "hold"), q.maxMM))
	}
	if lowFree > 0 {
		free := "free"
		if q.res == OnDemand {
			free = "not pinned"
		}
		parts = append(parts, fmt.Sprintf("%s %s at most %s %s", plural(lowFree, "card"),
			pick(lowFree, "has", "have"), Percent(maxLow), free))
	}
	if fewNodes > 0 {
		parts = append(parts, fmt.Sprintf("%s %s at most %s", plural(fewNodes, "node"),
			pick(fewNodes, "has", "have"), plural(maxFew, "free card")))
	}
	if len(parts) == 0 {
		return head
	}
	return head + ": " + strings.Join(parts, ", ")
}

func (s *State) kindText(k kindSet) string {
	if k == nil {
		return ""
	}
	var names []string
	for id, name := range s.kindNames {
		if k.has(int32(id)) {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	return strings.Join(names, "|") + " "
}

func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

func pick(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

func selectorText(sel map[string]string) string {
	keys := make([]string, 0, len(sel))
	for k := range sel {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for i, k := range keys {
		keys[i] = k + "=" + sel[k]
	}
	return strings.Join(keys, ",")
}

// hostText names a host request: "4000m CPU and 8192 MiB memory".
func hostText(cpu, mem int64) string {
	var p []string
	if cpu > 0 {
		p = append(p, fmt.Sprintf("%dm CPU", cpu))
	}
	if mem > 0 {
		p = append(p, fmt.Sprintf("%d MiB memory", mem))
	}
	return strings.Join(p, " and ")
}

// hostFreeText names the most free host resources seen, for the tracked
// dimensions the request asks for.
func hostFreeText(cpu, mem, maxCPU, maxMem int64) string {
	var p []string
	if cpu > 0 && maxCPU < unlimited {
		p = append(p, fmt.Sprintf("%dm CPU", maxCPU))
	}
	if mem > 0 && maxMem < unlimited {
		p = append(p, fmt.Sprintf("%d MiB memory", maxMem))
	}
	return strings.Join(p, " and ")
}
