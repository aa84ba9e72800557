package scheduler

import (
	"fmt"
	"strings"
)

// Policy names a placement policy. Every policy obeys the same rules (docs/descriptors.md rule 11); they differ only in which feasible choice they prefer. Among
// equally good choices every policy prefers the node, then the card, with
// fewer replicas of the same deployment, then the lowest node and card.
type Policy string

const (
	// PolicyBestFit packs: the node left with the least free capacity
	// (cards, CPU and memory, each as a share of the node), then the card
	// left with the least free share.
	PolicyBestFit Policy = "bestfit"
	// PolicySpread puts a deployment's replicas on different nodes and
	// cards first, then picks the least-loaded node and card.
	PolicySpread Policy = "spread"
	// PolicyFGD is fragmentation gradient descent (Weng et al., ATC'23):
	// the choice that grows the node's expected fragmentation least, task
	// types weighted by popularity.
	PolicyFGD Policy = "fgd"
	// PolicyDefault is gpuplane's own policy: fragmentation gradient descent
	// over a blend of the paper's measure, one weighted by card demand and
	// by how few cards each task type could use (GPU kind, host capacity,
	// card count) in which CPU-only types count free CPU, the card capacity
	// a placement leaves usable by no task type, the cards it leaves without
	// CPU to feed them, and the capacity it takes from kinds that typed
	// tasks need, with best-fit packing to break its ties; see DESIGN.md.
	PolicyDefault Policy = "gpuplane"
)

// Policies lists the policies in the order reports show them.
func Policies() []Policy {
	return []Policy{PolicyDefault, PolicyFGD, PolicyBestFit, PolicySpread}
}

// ParsePolicy resolves a policy name; "default" and "" mean PolicyDefault.
func ParsePolicy(name string) (Policy, error) {
	switch p := Policy(strings.ToLower(name)); p {
	case "", "default":
		return PolicyDefault, nil
	case PolicyDefault, PolicyFGD, PolicyBestFit, PolicySpread:
		return p, nil
	}
	names := make([]string, 0, 5)
	for _, p := range Policies() {
		names = append(names, string(p))
	}
	return "", fmt.Errorf("unknown policy %q (want %s or default)", name, strings.Join(names, ", "))
}

type policyImpl uint8

const (
	implDefault policyImpl = iota
	implFGD
	implBestFit
	implSpread
)

func (p Policy) impl() policyImpl {
	switch p {
	case PolicyFGD:
		return implFGD
	case PolicyBestFit:
		return implBestFit
	case PolicySpread:
		return implSpread
	}
	return implDefault
}

// score orders candidates: lower is better, compared left to right.
type score [4]int64

func (a score) less(b score) bool {
	for i := range a {
		if a[i] != b[i] {
			return a[i] < b[i]
		}
	}
	return false
}

// evaluator scores the candidates on one node for one request.
type evaluator struct {
	s       *State
	q       *request
	n       *nodeState
	ni      int32
	pol     policyImpl
	nodeDep int32 // replicas of the request's deployment on the node
	ws      int   // workload weighting for fragmentation

	fc         *fragCache
	fragReady  [numWeights]bool
	fragBefore [numWeights]int64
	feasWNew   [numWeights][]int64 // per workload group, after the placement
	ranked     bool                // rcNew, rmNew are set
	rcNew      int32               // rank of the free CPU after the placement among the types' requests
	rmNew      int32               // the same for memory
}

const ppm = 1_000_000

// remainAfter is the node's free capacity after the placement: the free
// share of its cards, CPU and memory, in parts per million, summed.
func (ev *evaluator) remainAfter(cards []int32) int64 {
	n, q := ev.n, ev.q
	var r int64
	if n.gpuCap > 0 {
		r += (n.gpuCap - n.gpuUsed - int64(q.reserve)*int64(len(cards))) * ppm / n.gpuCap
	}
	if n.cpuCap > 0 {
		r += (n.cpuCap - n.cpuUsed - q.CPUMilli) * ppm / n.cpuCap
	}
	if n.memCap > 0 {
		r += (n.memCap - n.memUsed - q.MemoryMiB) * ppm / n.memCap
	}
	return r
}

// cardLeft is the free share left on a shared card after the placement.
func (ev *evaluator) cardLeft(cards []int32) int64 {
	if ev.q.mode != modeShared || len(cards) == 0 {
		return 0
	}
	return int64(FullCard - ev.s.cards[cards[0]].Reserved - ev.q.reserve)
}

// cardDep counts replicas of the request's deployment on the cards.
func (ev *evaluator) cardDep(cards []int32) int64 {
	if ev.nodeDep == 0 {
		return 0
	}
	var k int64
	for _, ci := range cards {
		for _, sh := range ev.s.cards[ci].shares {
			if sh.Deployment == ev.q.Deployment {
				k++
			}
		}
	}
	return k
}

func (ev *evaluator) score(cards []int32) score {
	nd := int64(ev.nodeDep)
	if ev.q.res == OnDemand && len(cards) == 1 {
		return ev.scoreOnDemand(cards[0])
	}
	switch ev.pol {
	case implBestFit:
		return score{ev.remainAfter(cards), ev.cardLeft(cards), nd, ev.cardDep(cards)}
	case implSpread:
		return score{nd, ev.cardDep(cards), -ev.remainAfter(cards), -ev.cardLeft(cards)}
	case implFGD:
		return score{ev.fragDelta(cards), nd, ev.cardDep(cards), 0}
	default:
		return score{ev.blendDelta(cards), ev.remainAfter(cards), ev.cardLeft(cards), nd*FullCard + ev.cardDep(cards)}
	}
}

// scoreOnDemand orders the cards an onDemand replica may be assigned to.
// It reserves nothing, so reserved capacity cannot tell cards apart; what
// differs is whether the card must be bound for it. Every policy but spread
// packs: a card already bound to the accelerator first (binding an empty
// card for a replica that reserves nothing takes the card from every other
// accelerator, and onDemand models are meant to take turns on one card,
// docs/residency.md), then the card with the most room not pinned (where the model
// can stay loaded longest). Spread puts the deployment's replicas apart
// first, then prefers the card with the fewest replicas. maxModels bounds
// how many share a card either way.
func (ev *evaluator) scoreOnDemand(ci int32) score {
	c := &ev.s.cards[ci]
	binds := int64(0)
	if c.acc < 0 {
		binds = 1
	}
	room := int64(c.Room(OnDemand))
	dep := int64(ev.nodeDep)*FullCard + ev.cardDep([]int32{ci})
	if ev.pol == implSpread {
		return score{int64(ev.nodeDep), ev.cardDep([]int32{ci}), int64(c.Replicas), -room}
	}
	return score{binds, -room, dep, 0}
}

// weighting is the workload weighting a policy measures fragmentation with.
func (p policyImpl) weighting() int {
	switch p {
	case implDefault:
		return byScarcity
	case implFGD:
		return byCountPaper
	}
	return byCount
}
