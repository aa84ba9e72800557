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
	shareMilli  uint32
	memoryMiB   uint64
}

func keyOf(r *pb.Replica) replicaKey { return replicaKey{r.Model, r.Index} }

// occupy records a placed replica's share on each of its cards, and the
// replica among its node's.
func (f *FSM) occupy(r *pb.Replica) {
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
		u.shareMilli += r.ShareMilli
		u.memoryMiB += r.MemoryMib
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
		u.shareMilli -= min(u.shareMilli, r.ShareMilli)
		u.memoryMiB -= min(u.memoryMiB, r.MemoryMib)
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
	names := make([]string, len(u.replicas))
	for i, k := range u.replicas {
		names[i] = k.String()
	}
	return cardBinding{accelerator: u.accelerator, replicas: names, usedMiB: u.memoryMiB}
}
