package fsm

import (
	"fmt"
	"sort"

	"google.golang.org/protobuf/proto"

	"github.com/gpuplane/gpuplane/internal/catalog"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// The views below derive what users see from the stored state. They return
// copies: callers may keep and change them.

// Nodes returns every node, sorted by name.
func (f *FSM) Nodes() []*pb.Node {
	out := make([]*pb.Node, 0, len(f.nodes))
	for _, name := range sortedKeys(f.nodes) {
		out = append(out, proto.Clone(f.nodes[name]).(*pb.Node))
	}
	return out
}

// RangeNodes calls fn with every node, in no order, without copying:
// for readers that look at each node of a large fleet in a View, such as
// the leader's reconcile rounds. fn must neither change nor keep n.
func (f *FSM) RangeNodes(fn func(n *pb.Node)) {
	for _, n := range f.nodes {
		fn(n)
	}
}

// Node returns one node.
func (f *FSM) Node(name string) (*pb.Node, bool) {
	n, ok := f.nodes[name]
	if !ok {
		return nil, false
	}
	return proto.Clone(n).(*pb.Node), true
}

// live says whether a card can host work now: its node is alive and the card
// is healthy.
func live(n *pb.Node, c *pb.Card) bool {
	return n.Status == pb.NodeStatus_NODE_STATUS_ALIVE && c.Healthy
}

// cardBinding is the accelerator a card is bound to ("" when unbound), the
// replicas on it, the memory they reserve (pinned and warm shares), the
// shares loaded now, the residuals of those asleep, and what the replicas
// awake hold: the loaded shares and the reserved shares not loaded and not
// lent (docs/residency.md). used + sleeping + free = the card's memory.
type cardBinding struct {
	accelerator string
	replicas    []string
	reservedMiB uint64
	residentMiB uint64
	sleepingMiB uint64
	usedMiB     uint64
}

// deviceSummaries groups the inventory by device kind.
func (f *FSM) deviceSummaries() map[string]*pb.Device {
	out := map[string]*pb.Device{}
	for _, name := range sortedKeys(f.nodes) {
		n := f.nodes[name]
		perNode := map[string]uint32{}
		for _, c := range n.Cards {
			d := out[c.Device]
			if d == nil {
				d = &pb.Device{Name: c.Device, Product: c.Product, MemoryMib: c.MemoryMib, Architecture: c.Architecture, Fp8: c.Fp8}
				out[c.Device] = d
			}
			if c.MemoryMib < d.MemoryMib {
				d.MemoryMib = c.MemoryMib
			}
			d.Total++
			if acc, _ := f.boundTo(n.Name, c.Index); live(n, c) && acc == "" {
				d.Free++
			}
			perNode[c.Device]++
		}
		for dev, k := range perNode {
			if k > out[dev].MaxPerNode {
				out[dev].MaxPerNode = k
			}
		}
	}
	return out
}

// Devices returns every device kind present in the inventory, sorted by name.
func (f *FSM) Devices() []*pb.Device {
	sum := f.deviceSummaries()
	out := make([]*pb.Device, 0, len(sum))
	for _, name := range sortedKeys(sum) {
		out = append(out, sum[name])
	}
	return out
}

// Device returns one device kind and the status of each of its cards. A kind
// known to the catalog but absent from the inventory is returned with no cards.
func (f *FSM) Device(name string) (*pb.Device, []*pb.CardStatus, bool) {
	d, ok := f.deviceSummaries()[name]
	if !ok {
		c, known := catalog.BySlug(name)
		if !known {
			return nil, nil, false
		}
		d = &pb.Device{Name: c.Slug, Product: c.Product, MemoryMib: c.MemoryMiB, Architecture: c.Architecture, Fp8: c.FP8}
	}
	var cards []*pb.CardStatus
	for _, nodeName := range sortedKeys(f.nodes) {
		n := f.nodes[nodeName]
		for _, c := range n.Cards {
			if c.Device != name {
				continue
			}
			b := f.binding(n.Name, c.Index)
			free := uint64(0)
			if held := b.usedMiB + b.sleepingMiB; c.MemoryMib > held {
				free = c.MemoryMib - held
			}
			cards = append(cards, &pb.CardStatus{
				Node: n.Name, Index: c.Index, Uuid: c.Uuid, MemoryMib: c.MemoryMib,
				UsedMib: b.usedMiB, FreeMib: free, Accelerator: b.accelerator,
				Replicas: b.replicas, Healthy: c.Healthy, NodeStatus: n.Status,
				ReservedMib: b.reservedMiB, ResidentMib: b.residentMiB, SleepingMib: b.sleepingMiB,
			})
		}
	}
	return d, cards, true
}

// Accelerators returns every accelerator with its derived status, by name.
func (f *FSM) Accelerators() []*pb.Accelerator {
	sum := f.deviceSummaries()
	inUse := f.placedPerAccelerator()
	out := make([]*pb.Accelerator, 0, len(f.accelerators))
	for _, name := range sortedKeys(f.accelerators) {
		out = append(out, f.acceleratorView(f.accelerators[name], sum, inUse[name]))
	}
	return out
}

// Accelerator returns one accelerator with its derived status.
func (f *FSM) Accelerator(name string) (*pb.Accelerator, bool) {
	a, ok := f.accelerators[name]
	if !ok {
		return nil, false
	}
	return f.acceleratorView(a, f.deviceSummaries(), f.placedPerAccelerator()[name]), true
}

// acceleratorView computes the derived columns of `accelerators list` (docs/cli.md, Columns):
// dedicated: MEMORY/MODEL = card memory × devicesPerReplica, CAN PLACE = Σ
// over nodes ⌊unbound live cards / devicesPerReplica⌋; shared: MEMORY/MODEL =
// card memory ÷ maxModels, CAN PLACE = free model slots over its bound and the
// unbound live cards. READY: at least one live card of its device.
func (f *FSM) acceleratorView(a *pb.StoredAccelerator, sum map[string]*pb.Device, inUse uint32) *pb.Accelerator {
	spec := a.Spec
	memory := uint64(0)
	if d := sum[spec.Device]; d != nil {
		memory = d.MemoryMib
	} else if c, ok := catalog.BySlug(spec.Device); ok {
		memory = c.MemoryMiB
	}
	st := &pb.AcceleratorStatus{InUse: inUse}
	if spec.Tenancy == pb.Tenancy_TENANCY_SHARED {
		st.MemoryPerModelMib = memory / uint64(max(spec.MaxModels, 1))
	} else {
		st.MemoryPerModelMib = memory * uint64(spec.DevicesPerReplica)
	}
	for _, nodeName := range sortedKeys(f.nodes) {
		n := f.nodes[nodeName]
		unbound := uint32(0)
		for _, c := range n.Cards {
			if c.Device != spec.Device || !live(n, c) {
				continue
			}
			st.Ready = true
			acc, replicas := f.boundTo(n.Name, c.Index)
			switch {
			case spec.Tenancy == pb.Tenancy_TENANCY_SHARED && (acc == "" || acc == a.Name):
				if used := uint32(replicas); used < spec.MaxModels {
					st.CanPlace += spec.MaxModels - used
				}
			case acc == "":
				unbound++
			}
		}
		if spec.Tenancy != pb.Tenancy_TENANCY_SHARED {
			st.CanPlace += unbound / max(spec.DevicesPerReplica, 1)
		}
	}
	return &pb.Accelerator{
		Name:         a.Name,
		Spec:         proto.Clone(spec).(*pb.AcceleratorSpec),
		Status:       st,
		CreatedIndex: a.CreatedIndex,
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// Models returns every deployment with its status, by name.
func (f *FSM) Models() []*pb.ModelDeployment {
	out := make([]*pb.ModelDeployment, 0, len(f.models))
	for _, name := range sortedKeys(f.models) {
		out = append(out, f.modelView(f.models[name]))
	}
	return out
}

// Model returns one deployment with its status and its replicas.
func (f *FSM) Model(name string) (*pb.ModelDeployment, []*pb.Replica, bool) {
	m, ok := f.models[name]
	if !ok {
		return nil, nil, false
	}
	return f.modelView(m), f.Replicas(name, ""), true
}

// Replicas returns replicas by deployment and ordinal, optionally only those
// of one deployment and/or on one node.
func (f *FSM) Replicas(model, node string) []*pb.Replica {
	var out []*pb.Replica
	for _, k := range f.sortedReplicaKeys() {
		r := f.replicas[k]
		if (model == "" || r.Model == model) && (node == "" || r.Node == node) {
			c := replicaView(r)
			out = append(out, c)
		}
	}
	return out
}

// modelView derives a deployment's status from its replicas. Ready means every
// desired replica runs (its node reported Running); otherwise the reason names
// the first problem: pending (with why), failed, or still starting.
func (f *FSM) modelView(m *pb.ModelDeployment) *pb.ModelDeployment {
	out := proto.Clone(m).(*pb.ModelDeployment)
	st := &pb.ModelStatus{Desired: m.Spec.Replicas}
	if acc, ok := f.accelerators[m.Spec.Placement.Accelerator]; ok {
		sh := shareOf(m.Spec, acc.Spec, f.cardMemory(acc.Spec.Device))
		st.MemoryPerReplicaMib = sh.memoryMiB * uint64(sh.cards)
	}
	var pending, failed, starting []*pb.Replica
	for i := uint32(0); i < m.Spec.Replicas; i++ {
		r := f.replicas[replicaKey{m.Name, i}]
		if r == nil {
			continue
		}
		switch {
		case r.Node == "":
			pending = append(pending, r)
		case r.State == pb.ReplicaState_REPLICA_STATE_FAILED:
			failed = append(failed, r)
			st.Placed++
		case r.State == pb.ReplicaState_REPLICA_STATE_RUNNING:
			st.Placed++
			st.Running++
		default:
			starting = append(starting, r)
			st.Placed++
		}
	}
	switch {
	case len(pending) > 0:
		st.Reason = fmt.Sprintf("%d of %d replicas pending: %s", len(pending), st.Desired, pending[0].Reason)
	case len(failed) > 0:
		st.Reason = fmt.Sprintf("%d of %d replicas failed: %s", len(failed), st.Desired, failed[0].Reason)
	case len(starting) > 0:
		r := starting[0]
		st.Reason = fmt.Sprintf("%d of %d replicas not running yet: replica %d is %s on %s", len(starting), st.Desired, r.Index, ReplicaStateName(r.State), r.Node)
	default:
		st.Ready = true
	}
	out.Status = st
	return out
}

// ReplicaShare is what one replica of a deployment takes: how many cards and
// what share of each, in thousandths. ok is false when the deployment or its
// accelerator does not exist.
func (f *FSM) ReplicaShare(model string) (cards, milli uint32, ok bool) {
	m, found := f.models[model]
	if !found {
		return 0, 0, false
	}
	acc, found := f.accelerators[m.Spec.Placement.Accelerator]
	if !found {
		return 0, 0, false
	}
	sh := shareOf(m.Spec, acc.Spec, f.cardMemory(acc.Spec.Device))
	return sh.cards, sh.milli, true
}

// placedPerAccelerator counts placed replicas by accelerator (IN USE).
func (f *FSM) placedPerAccelerator() map[string]uint32 {
	out := map[string]uint32{}
	for _, r := range f.replicas {
		if r.Node != "" {
			out[r.Accelerator]++
		}
	}
	return out
}

// HasPending reports whether any replica waits for a placement on an
// existing accelerator: the placer's cheap check before it plans.
func (f *FSM) HasPending() bool {
	for _, r := range f.replicas {
		if r.Node == "" {
			if _, ok := f.accelerators[r.Accelerator]; ok {
				return true
			}
		}
	}
	return false
}
