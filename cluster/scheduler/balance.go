package scheduler

import (
	"math"
	"math/bits"
	"slices"
)

// The default policy's terms beyond fragmentation (see DESIGN.md): host
// CPU as the fragment of host-only types, card capacity stranded for lack
// of CPU, and the pressure that typed task types put on their kinds.

// strandShare is how much card capacity stranded for lack of host CPU
// counts in the blend, per milli-card.
const strandShare = 2

// kindShare is how much the capacity a placement takes on a kind that
// typed task types need counts in the blend, in sixteenths, per milli-card
// and per unit of the kind's pressure.
const kindShare = 160

// pressureScale is the fixed point of kindPressure.
const pressureScale = 1024

// maxPressure bounds a kind's pressure (64 times the average demand per
// card) so that the charge cannot overflow; a kind under that much
// pressure is already kept from untyped work.
const maxPressure = 64 * pressureScale

// cpuUnits converts a node's free CPU to milli-cards at the cluster's
// ratio of card capacity to CPU, so that the scarcity measure can count a
// host-only type's fragment in the same units as the others'. A node whose
// CPU is not tracked has none to strand.
func (s *State) cpuUnits(free int64, n *nodeState) int64 {
	if n.cpuCap <= 0 || s.cpuCapTotal == 0 {
		return 0
	}
	return mulDiv(max(free, 0), s.gpuCap, s.cpuCapTotal)
}

// kindPressure is the card demand that typed task types (those limited to
// some device kinds) put on each card of the kind, each type's demand
// spread over the cards it could use, over the demand per card of all
// types that ask for cards, in 1/pressureScale. Untyped work taking a kind
// of high pressure takes what only typed tasks could have used; a kind no
// typed type asks for has none. It depends on the workload and the cards
// only, never on what is placed (the node indexes rely on it).
func (s *State) kindPressure(kind int32) int64 {
	wl := &s.wl
	if !s.pressOK || s.pressGen != wl.gen || s.pressTot != wl.total[byCount] {
		if s.usableGen != wl.gen || !s.pressOK {
			// The cards each group could use change only with the groups.
			s.usableGen = wl.gen
			s.usable = s.usable[:0]
			for gi := range wl.groups {
				g := &wl.groups[gi]
				var u int64
				if g.mode != modeHost && g.kinds != nil {
					for ci := range s.cards {
						if c := &s.cards[ci]; c.healthy && g.kinds.has(c.kind) {
							u++
						}
					}
				}
				s.usable = append(s.usable, u)
			}
		}
		// In integers (not floating point, which a compiler may fuse
		// differently on another machine): e[k] is the typed demand per
		// card of kind k, in 1/pressureScale milli-cards.
		e := make([]int64, len(s.kindNames))
		var all int64
		for gi := range wl.groups {
			g := &wl.groups[gi]
			if g.mode == modeHost {
				continue
			}
			d := g.w[byCount] * int64(g.milli) * int64(g.k)
			all += d
			if u := s.usable[gi]; g.kinds != nil && u > 0 {
				for k := range e {
					if g.kinds.has(int32(k)) {
						e[k] += d * pressureScale / u
					}
				}
			}
		}
		s.pressOK, s.pressGen, s.pressTot = true, wl.gen, wl.total[byCount]
		s.press = s.press[:0]
		for k := range e {
			var v int64
			if all > 0 {
				v = min(mulDiv(e[k], s.healthyCards, all), maxPressure)
			}
			s.press = append(s.press, v)
		}
	}
	if int(kind) < len(s.press) {
		return s.press[kind]
	}
	return 0
}

// cpuPerCard is the workload's CPU per milli-card among the task types that
// ask for cards, as the sums (cpu, milli).
func (s *State) cpuPerCard() (cpu, milli int64) {
	wl := &s.wl
	if !s.rhoOK || s.rhoGen != wl.gen || s.rhoTot != wl.total[byCount] {
		s.rhoOK, s.rhoGen, s.rhoTot = true, wl.gen, wl.total[byCount]
		s.rhoCPU, s.rhoMilli, s.rhoAllCPU = 0, 0, 0
		for i := range wl.types {
			t := &wl.types[i]
			g := &wl.groups[t.g]
			s.rhoAllCPU += t.w[byCount] * t.cpu
			if g.mode == modeHost {
				continue
			}
			s.rhoCPU += t.w[byCount] * t.cpu
			s.rhoMilli += t.w[byCount] * int64(g.milli) * int64(g.k)
		}
	}
	return s.rhoCPU, s.rhoMilli
}

// hostFitShare is how much CPU left free on the node counts in the blend
// when the workload is CPU-bound: per core, hostFitShare/64 card for each
// unit of cpuBound above 1.
const hostFitShare = 46

// cpuBound is how much CPU the workload asks for each card it asks, over
// what the cluster has for each card, in 1/1024: the CPU of every task type
// (host-only ones too) per milli-card of the types that ask for cards,
// against the cluster's tracked CPU per milli-card. Above 1024 the host CPU
// runs out before the cards do.
func (s *State) cpuBound() int64 {
	_, milli := s.cpuPerCard()
	if milli <= 0 || s.cpuCapTotal <= 0 || s.rhoAllCPU <= 0 {
		return 0
	}
	return mulDiv(mulDiv(s.rhoAllCPU, s.gpuCap, milli), 1024, s.cpuCapTotal)
}

// hostFitDelta packs host CPU on a CPU-bound workload: it charges the CPU
// the placement leaves free on the node, in proportion to how far the
// workload's CPU demand exceeds the cluster's CPU per card, so requests
// fill nodes whose CPU is nearly taken and the CPU left when it runs out
// is in fewer, larger pieces. Zero where the workload is not CPU-bound.
func (ev *evaluator) hostFitDelta() int64 {
	n := ev.n
	if n.cpuCap <= 0 {
		return 0
	}
	excess := ev.s.cpuBound() - 1024
	if excess <= 0 {
		return 0
	}
	return hostFitShare * excess * max(n.cpuFree()-ev.q.CPUMilli, 0) * (blendUnit / 65536)
}

// stranded is the free card capacity (milli) on a node that its free CPU
// cannot feed at the workload's CPU per card.
func (s *State) stranded(n *nodeState, freeMilli, cpuFree int64) int64 {
	if n.cpuCap <= 0 {
		return 0
	}
	cpu, milli := s.cpuPerCard()
	if cpu <= 0 {
		return 0
	}
	if fed := mulDiv(max(cpuFree, 0), milli, cpu); freeMilli > fed {
		return freeMilli - fed
	}
	return 0
}

// strandDelta is how much the placement grows the node's stranded card
// capacity. On an empty node kept whole for a host-scarce type (keptWhole)
// it is at least the capacity the request itself would strand at the
// workload's CPU per card: such a node's CPU is there for the type that
// needs it, not to spare other nodes' cards, and without this floor a
// CPU-hungry request would find the node's spare CPU free of charge and
// break it (see DESIGN.md).
func (ev *evaluator) strandDelta(cards []int32) int64 {
	n, q := ev.n, ev.q
	tot0 := ev.fc.tot
	tot1 := tot0 - int64(q.reserve)*int64(len(cards))
	d := ev.s.stranded(n, tot1, n.cpuFree()-q.CPUMilli) - ev.s.stranded(n, tot0, n.cpuFree())
	if n.cpuCap > 0 && n.cpuUsed == 0 && n.gpuUsed == 0 && ev.s.keptWhole(ev.ni) {
		d = max(d, ev.ownStrand(len(cards)))
	}
	return d
}

// ownStrand is the card capacity a request strands wherever it goes, at
// the workload's CPU per card: the cards its CPU could feed beyond those
// it takes.
func (ev *evaluator) ownStrand(ncards int) int64 {
	cpu, milli := ev.s.cpuPerCard()
	if cpu <= 0 {
		return 0
	}
	return max(0, mulDiv(max(ev.q.CPUMilli, 0), milli, cpu)-int64(ev.q.reserve)*int64(ncards))
}

// mulDiv is a × b / c for non-negative a, b and positive c, rounded down,
// with a 128-bit intermediate; it saturates where the result would not fit.
func mulDiv(a, b, c int64) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi >= uint64(c) {
		return math.MaxInt64 / 4
	}
	q, _ := bits.Div64(hi, lo, uint64(c))
	return int64(min(q, math.MaxInt64/4))
}

// hostScarceFactor is how much scarcer a type's cards must be for its host
// request than for its kinds and card count alone for the nodes that fit
// it to be kept whole for it.
const hostScarceFactor = 2

// keptWhole reports whether the node, empty, is one of the few that some
// type of the workload asking for cards fits for its host request: the
// type's cards are at least hostScarceFactor times scarcer counting the
// host than counting kinds and cards alone (openb's 8-card tasks asking
// 120 cores fit only the 128-core nodes). It depends on capacities and the
// workload only.
func (s *State) keptWhole(ni int32) bool {
	wl := &s.wl
	if !s.reservedOK || s.reservedGen != wl.gen || s.reservedTot != wl.total[byCount] {
		s.reservedOK, s.reservedGen, s.reservedTot = true, wl.gen, wl.total[byCount]
		s.reservedFor = slices.Grow(s.reservedFor[:0], len(s.nodes))[:len(s.nodes)]
		clear(s.reservedFor)
		for i := range wl.types {
			t := &wl.types[i]
			g := &wl.groups[t.g]
			if g.mode == modeHost || (t.cpu <= 0 && t.mem <= 0) {
				continue
			}
			q := request{mode: g.mode, k: int(g.k), kinds: g.kinds}
			if s.scarcity(&q, t.cpu, t.mem) < hostScarceFactor*s.scarcity(&q, 0, 0) {
				continue
			}
			for nj := range s.nodes {
				n := &s.nodes[nj]
				if (n.cpuCap > 0 && t.cpu > n.cpuCap) || (n.memCap > 0 && t.mem > n.memCap) {
					continue
				}
				var c int32
				for ci := n.first; ci < n.first+n.n; ci++ {
					if card := &s.cards[ci]; card.healthy && g.kinds.has(card.kind) {
						c++
					}
				}
				if c >= max(g.k, 1) {
					s.reservedFor[nj] = true
				}
			}
		}
	}
	return int(ni) < len(s.reservedFor) && s.reservedFor[ni]
}
