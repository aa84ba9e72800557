package scheduler

import (
	"fmt"
	"strings"

	"github.com/gpuplane/gpuplane/internal/cardfit"
)

// FullCard is a whole card in milli-cards: shares are counted in 1/1000 of a
// card, so the openb trace's gpu_milli maps directly and memoryPercent 45 is
// 450.
const FullCard = cardfit.Full

// Tenancy says how an accelerator's replicas use cards.
type Tenancy int

const (
	// Dedicated: a replica gets DevicesPerReplica whole cards on one node.
	Dedicated Tenancy = iota
	// Shared: several replicas split one card, each with a memory share.
	Shared
)

// String returns the descriptor spelling: "dedicated" or "shared".
func (t Tenancy) String() string {
	if t == Shared {
		return "shared"
	}
	return "dedicated"
}

// Accelerator is a placement class over one device kind (docs/concepts.md).
type Accelerator struct {
	Name string
	// Device is the device kind slug ("l4"). Empty means any kind; only the
	// simulator uses that, for traces whose tasks are not tied to a kind.
	Device  string
	Tenancy Tenancy
	// MaxModels bounds the replicas per card of a shared accelerator; 0 means
	// no bound (the fsm fills in the default of 2, docs/descriptors.md, before calling).
	MaxModels int
	// DevicesPerReplica is the number of whole cards a dedicated replica
	// takes, all on one node; 0 is read as 1.
	DevicesPerReplica int
}

func (a Accelerator) cardsPerReplica() int {
	if a.Tenancy == Shared || a.DevicesPerReplica < 1 {
		return 1
	}
	return a.DevicesPerReplica
}

// Residency says how a replica holds its share of a card (docs/residency.md):
// the card-fit rule's own type, so that the scheduler and the state machine
// count a share alike.
type Residency = cardfit.Residency

const (
	// Pinned (the zero value) reserves the share; it is never unloaded.
	Pinned = cardfit.Pinned
	// Warm reserves the share, which it may lend while it sleeps.
	Warm = cardfit.Warm
	// OnDemand reserves nothing; its share must fit in the card minus the
	// pinned shares.
	OnDemand = cardfit.OnDemand
)

// Share is one replica's share of one card: reserved, or assigned for an
// onDemand replica.
type Share struct {
	Replica     string
	Deployment  string
	Accelerator string
	// Milli is the share of the card in 1/1000 (1..1000); a dedicated
	// replica holds 1000 on each of its cards.
	Milli     int
	Residency Residency
}

// Card is one physical GPU and what is placed on it.
type Card struct {
	// Node names the card's node. It is filled in by State.Nodes and ignored
	// on input, where the enclosing Node names it.
	Node      string
	Index     int
	Device    string // device kind slug: "l4", "t4", "v100m16", ...
	MemoryMiB int64
	Healthy   bool
	// Accelerator is the accelerator the card is bound to, "" when unbound.
	// A card with shares is bound to their accelerator until it is empty.
	Accelerator string
	Shares      []Share
}

// Used returns the milli-cards reserved on the card (onDemand shares are
// assigned, not reserved).
func (c Card) Used() int {
	u := 0
	for _, s := range c.Shares {
		if s.Residency.Reserves() {
			u += s.Milli
		}
	}
	return u
}

// Replicas returns the number of replicas on the card (what maxModels bounds).
func (c Card) Replicas() int { return len(c.Shares) }

// Node is one machine: its cards and host resources.
type Node struct {
	Name   string
	Alive  bool
	Labels map[string]string
	Cards  []Card
	// Host capacity; 0 means unlimited (not tracked).
	CPUMilli  int64
	MemoryMiB int64
	// Host resources already reserved by placed replicas.
	CPUUsedMilli  int64
	MemoryUsedMiB int64
}

// Request asks for one replica to be placed.
type Request struct {
	Replica    string
	Deployment string
	// Accelerator names the accelerator; "" asks for host resources only
	// (the openb trace's CPU-only tasks).
	Accelerator string
	// Milli is the share of one card for a shared accelerator (1..1000).
	// Dedicated replicas always take whole cards and ignore it.
	Milli int
	// Residency of the replica; OnDemand and Warm need a shared
	// accelerator.
	Residency Residency
	// Optional host resources the replica reserves on its node.
	CPUMilli  int64
	MemoryMiB int64
	// Selector, when set, must match the node's labels exactly.
	Selector map[string]string
	// Devices, when set, restricts the device kinds further (the openb
	// trace's gpu_spec "V100M16|V100M32"). Empty means any kind that the
	// accelerator allows.
	Devices []string
}

// Decision is the outcome for one Request.
type Decision struct {
	Replica     string
	Deployment  string
	Accelerator string
	// Node and Cards (card indices on that node) when placed; Cards is empty
	// for a host-only request.
	Node  string
	Cards []int
	// Milli reserved on each card.
	Milli     int
	CPUMilli  int64
	MemoryMiB int64
	// Reason says, with numbers, why the replica was not placed; empty when
	// it was.
	Reason string
}

// Placed reports whether the decision placed the replica.
func (d Decision) Placed() bool { return d.Reason == "" }

// String renders the decision for logs and tests.
func (d Decision) String() string {
	if !d.Placed() {
		return fmt.Sprintf("%s: pending: %s", d.Replica, d.Reason)
	}
	if len(d.Cards) == 0 {
		return fmt.Sprintf("%s: %s (host only)", d.Replica, d.Node)
	}
	cs := make([]string, len(d.Cards))
	for i, c := range d.Cards {
		cs[i] = fmt.Sprint(c)
	}
	return fmt.Sprintf("%s: %s cards %s %s", d.Replica, d.Node, strings.Join(cs, ","), Percent(d.Milli))
}

// Percent renders milli-cards as a percentage: 450 → "45%", 465 → "46.5%".
func Percent(milli int) string {
	if milli%10 == 0 {
		return fmt.Sprintf("%d%%", milli/10)
	}
	return fmt.Sprintf("%d.%d%%", milli/10, milli%10)
}
