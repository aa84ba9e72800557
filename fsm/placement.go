package fsm

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/gpuplane/gpuplane/internal/cardfit"
	"github.com/gpuplane/gpuplane/internal/wireenum"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// placeReplicas applies a scheduling decision. Every placement is checked
// against the state as it is now, together with the placements before it in
// the same plan (docs/descriptors.md rule 11); if any fails, nothing is applied and the
// scheduler plans again from the newer state.
func (f *FSM) placeReplicas(c *pb.PlaceReplicas, index uint64, dry bool) *pb.Result {
	// Work on a scratch card index, holding what the plan's placements take,
	// so the plan is checked as a whole. Plans are small: the replicas
	// placed and the nodes they go to are short lists, not maps.
	// On the stack, for plans of up to 16 cards, replicas and 4 nodes.
	var cardsBuf [16]planCard
	var placedBuf [16]replicaKey
	var nodesBuf [4]string
	scratch, placed, planNodes := planCards(cardsBuf[:0]), placedBuf[:0], nodesBuf[:0]
	for _, p := range c.GetPlacements() {
		if !slices.Contains(planNodes, p.GetNode()) {
			planNodes = append(planNodes, p.GetNode())
		}
	}
	var useBuf [4]nodeUse
	hostUse := f.hostUse(useBuf[:0], planNodes)
	// Each replica's share is computed here, once, and applied as it is.
	var sharesBuf [16]share
	shares := sharesBuf[:0]
	for i, p := range c.GetPlacements() {
		r, sh, err := f.checkPlacement(p, scratch, placed, hostUse)
		if err != nil {
			return reject(pb.Code_CODE_CONFLICT, "placement %d (%s/%d): %v; plan rejected, nothing applied", i, p.GetModel(), p.GetReplica(), err)
		}
		placed, shares = append(placed, keyOf(r)), append(shares, sh)
		scratch = scratch.occupy(r.Accelerator, p.Node, p.Cards, sh.milli, residencyOf(f.models[r.Model].GetSpec()))
		// Earlier placements of the plan count against the node's host too.
		if res := f.models[r.Model].GetSpec().GetResources(); res != nil {
			hostUse = hostUse.add(p.Node, res.CpuMilli, res.MemoryMib)
		}
	}
	if dry {
		return accept(pb.Outcome_OUTCOME_CONFIGURED, "would place %d replicas", len(c.GetPlacements()))
	}
	for i, p := range c.GetPlacements() {
		r, sh := f.replicas[replicaKey{p.Model, p.Replica}], shares[i]
		r.Node, r.Cards, r.ShareMilli, r.MemoryMib = p.Node, slices.Clone(p.Cards), sh.milli, sh.memoryMiB
		r.State, r.Reason, r.PlacedIndex = pb.ReplicaState_REPLICA_STATE_PLACED, placedReason(r.Reason), index
		f.occupy(r)
	}
	updated := 0
	for _, pr := range c.GetPending() {
		r := f.replicas[replicaKey{pr.Model, pr.Replica}]
		if r != nil && r.Node == "" && r.Reason != pr.Reason {
			r.Reason = pr.Reason
			updated++
		}
	}
	// As accept(…, "placed %d replicas, %d pending reasons updated", …),
	// without fmt: a plan is one entry in ten of a busy log.
	return f.accepted(pb.Outcome_OUTCOME_CONFIGURED,
		"placed ", strconv.Itoa(len(c.GetPlacements())), " replicas, ", strconv.Itoa(updated), " pending reasons updated")
}

// planCards is what a plan's placements take from each card, for the few
// cards of one plan: a short list rather than a map.
type planCards []planCard

// planCard is a cardUse for checks: the replicas counted, not listed.
type planCard struct {
	key         cardKey
	accelerator string
	load        cardfit.Load
}

// get returns what the plan takes from card k (replicas 0: nothing).
func (s planCards) get(k cardKey) planCard {
	for _, c := range s {
		if c.key == k {
			return c
		}
	}
	return planCard{}
}

// occupy is occupyCards for the plan (no memory: checks use none). Values,
// not pointers, so that a plan's list can stay on the stack.
func (s planCards) occupy(accelerator, node string, cards []uint32, shareMilli uint32, res pb.Residency) planCards {
	for _, idx := range cards {
		k := cardKey{node, idx}
		i := slices.IndexFunc(s, func(c planCard) bool { return c.key == k })
		if i < 0 {
			s = append(s, planCard{key: k, accelerator: accelerator})
			i = len(s) - 1
		}
		s[i].load.Add(wireenum.Residency(res), int32(shareMilli))
	}
	return s
}

// hostUse sums the host resources of placed replicas per node, for the
// given nodes only, from the replicas-by-node index.
// The sums are appended to use.
func (f *FSM) hostUse(use planUse, nodes []string) planUse {
	for _, node := range nodes {
		for _, r := range f.onNode[node] {
			res := f.models[r.Model].GetSpec().GetResources()
			use = use.add(r.Node, res.GetCpuMilli(), res.GetMemoryMib())
		}
	}
	return use
}

// planUse is the host resources taken per node, for the few nodes of a
// plan: a short list rather than a map.
type planUse []nodeUse

type nodeUse struct {
	node      string
	cpuMilli  uint32 // as pb.HostResources, so sums wrap alike
	memoryMiB uint64
}

func (u planUse) add(node string, cpuMilli uint32, memoryMiB uint64) planUse {
	for i := range u {
		if n := &u[i]; n.node == node {
			n.cpuMilli += cpuMilli
			n.memoryMiB += memoryMiB
			return u
		}
	}
	return append(u, nodeUse{node, cpuMilli, memoryMiB})
}

func (u planUse) of(node string) (cpuMilli uint32, memoryMiB uint64) {
	for _, n := range u {
		if n.node == node {
			return n.cpuMilli, n.memoryMiB
		}
	}
	return 0, 0
}

// checkPlacement checks one placement against rule 11 and the deployment's
// constraints, with scratch holding what earlier placements of the plan
// take, and returns the replica and the share it would take.
func (f *FSM) checkPlacement(p *pb.Placement, scratch planCards, placed []replicaKey, hostUse planUse) (*pb.Replica, share, error) {
	r, err := f.checkPlacementOf(p, placed, hostUse)
	if err != nil {
		return nil, share{}, err
	}
	m := f.models[p.Model]
	acc := f.accelerators[m.Spec.Placement.Accelerator]
	n := f.nodes[p.Node]
	sh := shareOf(m.Spec, acc.Spec, f.cardMemory(acc.Spec.Device))
	if uint32(len(p.Cards)) != sh.cards {
		return nil, share{}, fmt.Errorf("needs %d cards on one node, plan gives %d", sh.cards, len(p.Cards))
	}
	// Only an entry written before the state machine computed the share
	// carries one (Placement.legacy_share_milli); it is checked as it was
	// then, so that such a log replays to the same state.
	if p.LegacyShareMilli != 0 && p.LegacyShareMilli != sh.milli {
		return nil, share{}, fmt.Errorf("share %d‰ differs from the deployment's %d‰", p.LegacyShareMilli, sh.milli)
	}
	for j, idx := range p.Cards {
		if slices.Contains(p.Cards[:j], idx) {
			return nil, share{}, fmt.Errorf("card %d listed twice", idx)
		}
		i := slices.IndexFunc(n.Cards, func(c *pb.Card) bool { return c.Index == idx })
		if i < 0 {
			return nil, share{}, fmt.Errorf("node %q has no card %d", n.Name, idx)
		}
		card := n.Cards[i]
		if card.Device != acc.Spec.Device {
			return nil, share{}, fmt.Errorf("card %s/%d is %s, accelerator %q needs %s", n.Name, idx, card.Device, acc.Name, acc.Spec.Device)
		}
		if !card.Healthy {
			return nil, share{}, fmt.Errorf("card %s/%d is unhealthy", n.Name, idx)
		}
		k := cardKey{n.Name, idx}
		if err := fitsCard(acc, sh, residencyOf(m.Spec), f.cards[k], f.load(k), scratch.get(k)); err != nil && !skipCapacityCheck {
			return nil, share{}, fmt.Errorf("card %s/%d: %w", n.Name, idx, err)
		}
	}
	return r, sh, nil
}

// checkPlacementOf checks what a placement asks of the deployment, the
// replica and the node, before its cards.
func (f *FSM) checkPlacementOf(p *pb.Placement, placed []replicaKey, hostUse planUse) (*pb.Replica, error) {
	m, ok := f.models[p.Model]
	if !ok {
		return nil, fmt.Errorf("deployment %q not found", p.Model)
	}
	r, ok := f.replicas[replicaKey{p.Model, p.Replica}]
	if !ok {
		return nil, fmt.Errorf("replica not found (deployment has %d)", m.Spec.Replicas)
	}
	if p.Generation != m.Generation {
		return nil, fmt.Errorf("stale plan for generation %d, deployment is at %d", p.Generation, m.Generation)
	}
	if r.Node != "" || slices.Contains(placed, keyOf(r)) {
		return nil, fmt.Errorf("already placed on %s", r.Node)
	}
	if _, ok := f.accelerators[m.Spec.Placement.Accelerator]; !ok {
		return nil, fmt.Errorf("accelerator %q not found", m.Spec.Placement.Accelerator)
	}
	n, ok := f.nodes[p.Node]
	if !ok {
		return nil, fmt.Errorf("node %q not found", p.Node)
	}
	if n.Status != pb.NodeStatus_NODE_STATUS_ALIVE {
		return nil, fmt.Errorf("node %q is %s", p.Node, StatusName(n.Status))
	}
	// In key order: the message is part of the result every server stores,
	// so it must not depend on map iteration order when several labels miss.
	if sel := m.Spec.Placement.NodeSelector; len(sel) > 0 {
		for _, k := range slices.Sorted(maps.Keys(sel)) {
			if want := sel[k]; n.Labels[k] != want {
				return nil, fmt.Errorf("node %q lacks label %s=%s", p.Node, k, want)
			}
		}
	}
	if res := m.Spec.GetResources(); res != nil {
		usedCPU, usedMiB := hostUse.of(n.Name)
		if n.CpuMilli > 0 && usedCPU+res.CpuMilli > n.CpuMilli {
			return nil, fmt.Errorf("node %q has %dm CPU free, replica needs %dm", n.Name, n.CpuMilli-usedCPU, res.CpuMilli)
		}
		if n.MemoryMib > 0 && usedMiB+res.MemoryMib > n.MemoryMib {
			return nil, fmt.Errorf("node %q has %dMi host memory free, replica needs %dMi", n.Name, n.MemoryMib-usedMiB, res.MemoryMib)
		}
	}
	return r, nil
}

// fitsCard is rule 11 for one card: one accelerator per card, a dedicated
// card holds one replica, at most maxModels replicas, reserved shares sum
// to ≤ 100 % and each onDemand share fits in the card minus its pinned
// shares (docs/residency.md). live is what placed replicas take from the card (nil
// for nothing) and l their load, plan what the plan's earlier placements
// take (no replicas for nothing).
func fitsCard(acc *pb.StoredAccelerator, sh share, res pb.Residency, live *cardUse, l cardfit.Load, plan planCard) error {
	if live != nil && live.accelerator != acc.Name {
		return fmt.Errorf("bound to accelerator %q", live.accelerator)
	}
	if plan.load.Replicas > 0 {
		if plan.accelerator != acc.Name {
			return fmt.Errorf("bound to accelerator %q", plan.accelerator)
		}
		l = l.Merge(plan.load)
	}
	if acc.Spec.Tenancy != pb.Tenancy_TENANCY_SHARED {
		if l.Replicas > 0 {
			return fmt.Errorf("already holds a dedicated replica")
		}
		return nil
	}
	return fits(l, res, sh.milli, acc.Spec.MaxModels)
}

func (f *FSM) unplaceReplica(c *pb.UnplaceReplica, dry bool) *pb.Result {
	r, ok := f.replicas[replicaKey{c.GetModel(), c.GetReplica()}]
	if !ok {
		return reject(pb.Code_CODE_NOT_FOUND, "replica %s/%d not found", c.GetModel(), c.GetReplica())
	}
	if r.Node == "" {
		return accept(pb.Outcome_OUTCOME_UNCHANGED, "replica %s/%d is not placed", c.GetModel(), c.GetReplica())
	}
	if !dry {
		f.unplace(r, c.GetReason())
	}
	return accept(pb.Outcome_OUTCOME_CONFIGURED, "replica %s/%d unplaced: %s", c.GetModel(), c.GetReplica(), c.GetReason())
}

// replicaStatus records a node's report about a replica it runs. Reports for
// another generation or node are stale and rejected: the replica has moved on.
func (f *FSM) replicaStatus(c *pb.ReplicaStatus, dry bool) *pb.Result {
	r, ok := f.replicas[replicaKey{c.GetModel(), c.GetReplica()}]
	switch {
	case !ok:
		return reject(pb.Code_CODE_NOT_FOUND, "replica %s/%d not found", c.GetModel(), c.GetReplica())
	case r.Node == "" || r.Node != c.GetNode() || r.Generation != c.GetGeneration():
		return reject(pb.Code_CODE_FAILED_PRECONDITION, "stale report for replica %s/%d from node %q generation %d: it is placed on %q at generation %d",
			c.GetModel(), c.GetReplica(), c.GetNode(), c.GetGeneration(), r.Node, r.Generation)
	case c.GetState() == pb.ReplicaState_REPLICA_STATE_UNSPECIFIED || c.GetState() == pb.ReplicaState_REPLICA_STATE_PENDING:
		return invalid("replica status", []*pb.Violation{{Field: "state", Description: "must be placed, starting, running, failed or stopped"}})
	case c.GetResidency() < pb.ReplicaResidency_REPLICA_RESIDENCY_UNSPECIFIED || c.GetResidency() > pb.ReplicaResidency_REPLICA_RESIDENCY_WAKING:
		return invalid("replica status", []*pb.Violation{{Field: "residency", Description: "must be cold, loading, resident, draining, sleeping or waking"}})
	}
	if c.Adapters != nil {
		if v := checkReplicaAdapters(c.Adapters); len(v) > 0 {
			return invalid("replica status", v)
		}
	}
	// An unspecified residency leaves the replica's as it is: a report of
	// the engine's state alone says nothing about where its weights are.
	// So does a report without adapters about theirs.
	residency, residencyReason, residual := r.Residency, r.ResidencyReason, r.ResidualMib
	if c.GetResidency() != pb.ReplicaResidency_REPLICA_RESIDENCY_UNSPECIFIED {
		residency, residencyReason, residual = c.GetResidency(), c.GetResidencyReason(), 0
		if residency == pb.ReplicaResidency_REPLICA_RESIDENCY_SLEEPING {
			// A residual above the share would count memory the card
			// never promised it.
			residual = min(c.GetResidualMib(), r.MemoryMib)
		}
	}
	adapters := c.Adapters != nil && !sameAdapters(r.Adapters, c.Adapters.GetAdapters())
	if r.State == c.GetState() && r.Reason == c.GetReason() && r.Restarts == c.GetRestarts() && r.Endpoint == c.GetEndpoint() &&
		r.Residency == residency && r.ResidencyReason == residencyReason && r.ResidualMib == residual && !adapters {
		return accept(pb.Outcome_OUTCOME_UNCHANGED, "replica %s/%d unchanged", c.GetModel(), c.GetReplica())
	}
	moved := r.Residency != residency
	if !dry {
		f.touch(r.Node)
		r.State, r.Reason, r.Restarts, r.Endpoint = c.GetState(), c.GetReason(), c.GetRestarts(), c.GetEndpoint()
		r.Residency, r.ResidencyReason, r.ResidualMib = residency, residencyReason, residual
		if adapters {
			r.Adapters = cloneAdapters(c.Adapters.GetAdapters())
		}
	}
	// Most log entries are status reports: their message is built without
	// fmt (the same text as "replica %s/%d is %s"). A residency transition
	// is named with its reason, so that the audit log shows why.
	if moved {
		msg := ", " + ReplicaResidencyName(residency)
		if residencyReason != "" {
			msg += ": " + residencyReason
		}
		return f.accepted(pb.Outcome_OUTCOME_CONFIGURED,
			"replica ", c.GetModel(), "/", strconv.FormatUint(uint64(c.GetReplica()), 10), " is ", ReplicaStateName(c.GetState()), msg)
	}
	return f.accepted(pb.Outcome_OUTCOME_CONFIGURED,
		"replica ", c.GetModel(), "/", strconv.FormatUint(uint64(c.GetReplica()), 10), " is ", ReplicaStateName(c.GetState()))
}

// ReplicaStateName is the name users see for a replica state.
func ReplicaStateName(s pb.ReplicaState) string {
	switch s {
	case pb.ReplicaState_REPLICA_STATE_PENDING:
		return "Pending"
	case pb.ReplicaState_REPLICA_STATE_PLACED:
		return "Placed"
	case pb.ReplicaState_REPLICA_STATE_STARTING:
		return "Starting"
	case pb.ReplicaState_REPLICA_STATE_RUNNING:
		return "Running"
	case pb.ReplicaState_REPLICA_STATE_FAILED:
		return "Failed"
	case pb.ReplicaState_REPLICA_STATE_STOPPED:
		return "Stopped"
	}
	return "Unknown"
}

// lostSuffix ends the pending reason of a replica whose node went down or
// left (setNodeStatus, deregisterNode).
const lostSuffix = ": waiting to be placed elsewhere"

// placedReason is a placed replica's reason, from its pending reason: a
// failover's cause is kept (cardfit.FailoverReason), anything else is
// cleared.
func placedReason(pending string) string {
	switch {
	case strings.HasSuffix(pending, lostSuffix):
		return cardfit.FailoverReason(strings.TrimSuffix(pending, lostSuffix))
	case strings.HasPrefix(pending, "a card of node ") && strings.HasSuffix(pending, "disappeared from its inventory"):
		return cardfit.FailoverReason(pending)
	}
	return ""
}
