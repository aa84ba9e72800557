package fsm

import (
	"fmt"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// cardKey names one card in the cluster.
type cardKey struct {
	node  string
	index uint32
}

// replicaKey names one replica.
type replicaKey struct {
	model string
	index uint32
}

func (k replicaKey) String() string { return fmt.Sprintf("%s/%d", k.model, k.index) }

// cardUse is what the placed replicas take from one card. It is derived from
// the replicas (and rebuilt on Restore), never stored: the replicas are the
// truth.
type cardUse struct {
	accelerator string
	replicas    []replicaKey
	// shareMilli and memoryMiB are the reserved shares (pinned and warm
	// replicas), pinnedMilli the pinned ones alone; onDemand counts the
	// onDemand replicas, which are assigned without a reservation.
	shareMilli  uint32
	pinnedMilli uint32
	memoryMiB   uint64
	onDemand    int
}

// add records (sign +1) or removes (-1) a share of residency res.
func (u *cardUse) add(res pb.Residency, shareMilli uint32, memoryMiB uint64, sign int) {
	switch {
	case res == pb.Residency_RESIDENCY_ON_DEMAND:
		u.onDemand += sign
	case sign > 0:
		u.shareMilli += shareMilli
		u.memoryMiB += memoryMiB
		if res == pb.Residency_RESIDENCY_PINNED {
			u.pinnedMilli += shareMilli
		}
	default:
		u.shareMilli -= min(u.shareMilli, shareMilli)
		u.memoryMiB -= min(u.memoryMiB, memoryMiB)
		if res == pb.Residency_RESIDENCY_PINNED {
			u.pinnedMilli -= min(u.pinnedMilli, shareMilli)
		}
	}
}

func keyOf(r *pb.Replica) replicaKey { return replicaKey{r.Model, r.Index} }

// occupy records a placed replica's share on each of its cards, as its
// deployment's residency counts it, and the replica among its node's. The
// residency a replica was occupied with must be the one it is released
// with: changeResidency releases and occupies again around a change.
func (f *FSM) occupy(r *pb.Replica) {
	f.touch(r.Node)
	res := residencyOf(f.models[r.Model].GetSpec())
	if f.onNode != nil {
		on := f.onNode[r.Node]
		if on == nil {
			on = map[replicaKey]*pb.Replica{}
			f.onNode[r.Node] = on
		}
		on[keyOf(r)] = r
	}
	for _, idx := range r.Cards {
		k := cardKey{r.Node, idx}
		u := f.cards[k]
		if u == nil {
			u = f.newCardUse(r.Accelerator)
			f.cards[k] = u
		}
		u.replicas = append(u.replicas, keyOf(r))
		u.add(res, r.ShareMilli, r.MemoryMib, 1)
	}
}

// newCardUse returns an empty cardUse bound to accelerator, one release
// set aside if there is one: cards are bound and unbound all the time.
func (f *FSM) newCardUse(accelerator string) *cardUse {
	if n := len(f.spareCards); n > 0 {
		u := f.spareCards[n-1]
		f.spareCards = f.spareCards[:n-1]
		u.accelerator = accelerator
		return u
	}
	return &cardUse{accelerator: accelerator}
}

// release undoes occupy; a card left empty is unbound.
func (f *FSM) release(r *pb.Replica) {
	f.touch(r.Node)
	res := residencyOf(f.models[r.Model].GetSpec())
	if on := f.onNode[r.Node]; on != nil {
		delete(on, keyOf(r))
		if len(on) == 0 {
			delete(f.onNode, r.Node)
		}
	}
	for _, idx := range r.Cards {
		k := cardKey{r.Node, idx}
		u := f.cards[k]
		if u == nil {
			continue
		}
		for i, rk := range u.replicas {
			if rk == keyOf(r) {
				u.replicas = append(u.replicas[:i], u.replicas[i+1:]...)
				break
			}
		}
		u.add(res, r.ShareMilli, r.MemoryMib, -1)
		if len(u.replicas) == 0 {
			delete(f.cards, k)
			*u = cardUse{replicas: u.replicas[:0]}
			f.spareCards = append(f.spareCards, u)
		}
	}
}

// unplace returns a placed replica to pending with a reason.
func (f *FSM) unplace(r *pb.Replica, reason string) {
	if r.Node != "" {
		f.release(r)
	}
	f.clearPlacement(r, reason)
}

// clearPlacement is unplace of a replica already released from its cards.
func (f *FSM) clearPlacement(r *pb.Replica, reason string) {
	r.Residency, r.ResidencyReason, r.ResidualMib = pb.ReplicaResidency_REPLICA_RESIDENCY_UNSPECIFIED, "", 0
	r.Adapters = nil
	r.Node, r.Cards, r.ShareMilli, r.MemoryMib, r.PlacedIndex = "", nil, 0, 0, 0
	r.State = pb.ReplicaState_REPLICA_STATE_PENDING
	r.Reason = reason
	r.Endpoint = ""
	r.Restarts = 0
}

// boundTo returns the accelerator a card is bound to ("" when unbound) and
// how many replicas it holds, without formatting anything: the views call it
// for every card on every listing.
func (f *FSM) boundTo(node string, index uint32) (accelerator string, replicas int) {
	if u := f.cards[cardKey{node, index}]; u != nil {
		return u.accelerator, len(u.replicas)
	}
	return "", 0
}

func (f *FSM) binding(node string, index uint32) cardBinding {
	u := f.cards[cardKey{node, index}]
	if u == nil {
		return cardBinding{}
	}
	b := cardBinding{accelerator: u.accelerator, replicas: make([]string, len(u.replicas)), reservedMiB: u.memoryMiB}
	for i, k := range u.replicas {
		b.replicas[i] = k.String()
		r := f.replicas[k]
		if r == nil {
			continue
		}
		switch r.Residency {
		case pb.ReplicaResidency_REPLICA_RESIDENCY_LOADING, pb.ReplicaResidency_REPLICA_RESIDENCY_RESIDENT,
			pb.ReplicaResidency_REPLICA_RESIDENCY_WAKING, pb.ReplicaResidency_REPLICA_RESIDENCY_DRAINING:
			b.residentMiB += r.MemoryMib
			b.usedMiB += r.MemoryMib
		case pb.ReplicaResidency_REPLICA_RESIDENCY_SLEEPING:
			// Asleep, a replica keeps its residual on the card; the rest
			// of its share is free, lent while a warm owner sleeps.
			b.sleepingMiB += min(r.ResidualMib, r.MemoryMib)
		default:
			// A reserved share is held while its replica is not loaded;
			// a cold onDemand replica holds nothing.
			if reserves(residencyOf(f.models[r.Model].GetSpec())) {
				b.usedMiB += r.MemoryMib
			}
		}
	}
	return b
}
