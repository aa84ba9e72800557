package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/gpuplane/gpuplane/cluster/scheduler"
	"github.com/gpuplane/gpuplane/fsm"
	"github.com/gpuplane/gpuplane/internal/wireenum"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// maxPlanSize bounds the placements in one PlaceReplicas entry, so that one
// log entry stays small and a rejected plan wastes little work.
const maxPlanSize = 512

// Placer is the leader's scheduling loop. After every applied entry it looks
// for pending replicas, asks the scheduler for a plan over the current state
// and proposes it as one PlaceReplicas entry. The state machine re-checks the
// plan at apply, so a plan made on stale state is rejected and planned again,
// never applied. On followers it only waits.
type Placer struct {
	c      *Cluster
	policy scheduler.Policy
	log    *slog.Logger
}

// NewPlacer returns a placer for c using policy (the default when empty).
func NewPlacer(c *Cluster, policy scheduler.Policy, log *slog.Logger) *Placer {
	if policy == "" {
		policy = scheduler.PolicyDefault
	}
	if log == nil {
		log = slog.Default()
	}
	return &Placer{c: c, policy: policy, log: log}
}

// Run schedules until ctx ends.
//
// A follower plans nothing, so it only polls its leadership
// (leaderPollInterval) instead of waking on every applied entry, which
// under a write load was work on every server for every batch. The leader
// wakes on every batch the state machine applies (only commands can change
// what is pending), or now and then, and plans at once when it becomes
// leader.
func (p *Placer) Run(ctx context.Context) {
	// One timer for every wait (Go 1.23 timers: Reset leaves no stale tick).
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	sleep := func(d time.Duration, wake <-chan struct{}) {
		timer.Reset(d)
		select {
		case <-ctx.Done():
		case <-wake:
		case <-timer.C:
		}
	}
	var seen uint64
	leading := false
	for ctx.Err() == nil {
		if !p.c.IsLeader() {
			leading = false
			sleep(leaderPollInterval, nil)
			continue
		}
		if leading {
			// Wait for the state machine to apply past what the last round saw.
			if applied, advanced := p.c.fsm.progress(); applied <= seen {
				sleep(time.Second, advanced)
			}
		}
		leading = true
		seen = p.c.AppliedIndex()
		if !p.c.IsLeader() {
			continue
		}
		if err := p.Once(ctx); err != nil && ctx.Err() == nil {
			p.log.Warn("scheduling round failed", "err", err)
			sleep(200*time.Millisecond, nil)
		}
	}
}

// leaderPollInterval is how often a follower's Placer checks whether it has
// become the leader: small beside an election (a heartbeat timeout, 250 ms).
const leaderPollInterval = 50 * time.Millisecond

// Once runs one scheduling round: it proposes a plan when there is something
// to place or a pending reason changed, and reports whether it applied.
func (p *Placer) Once(ctx context.Context) error {
	var plan *pb.PlaceReplicas
	var err error
	p.c.View(func(f *fsm.FSM) {
		if f.HasPending() {
			plan, err = Plan(f, p.policy)
		}
	})
	if err != nil || plan == nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	res, err := p.c.Apply(ctx, &pb.Envelope{Actor: "scheduler", Command: &pb.Envelope_PlaceReplicas{PlaceReplicas: plan}})
	switch {
	case err != nil:
		return err
	case res.GetCode() == pb.Code_CODE_CONFLICT:
		p.log.Info("plan rejected at apply; planning again", "reason", res.GetMessage())
		return nil
	case res.GetCode() != pb.Code_CODE_OK:
		return errors.New(res.GetMessage())
	}
	return nil
}

// Plan computes a PlaceReplicas command for the pending replicas of f, or nil
// when nothing would change. It reads f and never changes it.
func Plan(f *fsm.FSM, policy scheduler.Policy) (*pb.PlaceReplicas, error) {
	view := buildView(f)
	if len(view.requests) == 0 {
		return nil, nil
	}
	st, err := scheduler.NewState(view.nodes, view.accelerators)
	if err != nil {
		return nil, fmt.Errorf("scheduler view: %w", err)
	}
	plan := &pb.PlaceReplicas{Policy: string(policy)}
	for i, d := range st.Plan(view.requests, policy) {
		r := view.pending[i]
		if d.Placed() {
			if len(plan.Placements) >= maxPlanSize {
				continue
			}
			cards := make([]uint32, len(d.Cards))
			for j, c := range d.Cards {
				cards[j] = uint32(c)
			}
			plan.Placements = append(plan.Placements, &pb.Placement{
				Model: r.Model, Replica: r.Index, Generation: r.Generation,
				Node: d.Node, Cards: cards,
			})
			continue
		}
		if d.Reason != r.Reason {
			plan.Pending = append(plan.Pending, &pb.PendingReason{Model: r.Model, Replica: r.Index, Reason: d.Reason})
		}
	}
	if len(plan.Placements) == 0 && len(plan.Pending) == 0 {
		return nil, nil
	}
	return plan, nil
}

// view is the scheduler's picture of the state machine.
type view struct {
	nodes        []scheduler.Node
	accelerators []scheduler.Accelerator
	requests     []scheduler.Request
	pending      []*pb.Replica // parallel to requests
}

func replicaID(r *pb.Replica) string { return fmt.Sprintf("%s/%d", r.Model, r.Index) }

func buildView(f *fsm.FSM) view {
	var v view
	specs := map[string]*pb.AcceleratorSpec{}
	for _, a := range f.Accelerators() {
		specs[a.Name] = a.Spec
		t := scheduler.Dedicated
		if a.Spec.Tenancy == pb.Tenancy_TENANCY_SHARED {
			t = scheduler.Shared
		}
		v.accelerators = append(v.accelerators, scheduler.Accelerator{
			Name: a.Name, Device: a.Spec.Device, Tenancy: t,
			MaxModels: int(a.Spec.MaxModels), DevicesPerReplica: int(a.Spec.DevicesPerReplica),
		})
	}
	models := map[string]*pb.ModelDeployment{}
	for _, m := range f.Models() {
		models[m.Name] = m
	}
	type cardKey struct {
		node  string
		index uint32
	}
	shares := map[cardKey][]scheduler.Share{}
	hostCPU, hostMem := map[string]int64{}, map[string]int64{}
	for _, r := range f.Replicas("", "") {
		if r.Node == "" {
			if _, ok := specs[r.Accelerator]; !ok {
				continue // its accelerator was deleted: the reason says so already
			}
			_, milli, ok := f.ReplicaShare(r.Model)
			if !ok {
				continue
			}
			m := models[r.Model]
			res := m.GetSpec().GetResources()
			v.requests = append(v.requests, scheduler.Request{
				Replica: replicaID(r), Deployment: r.Model, Accelerator: r.Accelerator, Milli: int(milli),
				Residency: wireenum.Residency(m.GetSpec().GetResidency()),
				CPUMilli:  int64(res.GetCpuMilli()), MemoryMiB: int64(res.GetMemoryMib()),
				Selector: m.GetSpec().GetPlacement().GetNodeSelector(),
			})
			v.pending = append(v.pending, r)
			continue
		}
		for _, idx := range r.Cards {
			k := cardKey{r.Node, idx}
			shares[k] = append(shares[k], scheduler.Share{Replica: replicaID(r), Deployment: r.Model, Accelerator: r.Accelerator,
				Milli: int(r.ShareMilli), Residency: wireenum.Residency(models[r.Model].GetSpec().GetResidency())})
		}
		res := models[r.Model].GetSpec().GetResources()
		hostCPU[r.Node] += int64(res.GetCpuMilli())
		hostMem[r.Node] += int64(res.GetMemoryMib())
	}
	for _, n := range f.Nodes() {
		sn := scheduler.Node{
			Name: n.Name, Alive: n.Status == pb.NodeStatus_NODE_STATUS_ALIVE, Labels: n.Labels,
			CPUMilli: int64(n.CpuMilli), MemoryMiB: int64(n.MemoryMib),
			CPUUsedMilli: hostCPU[n.Name], MemoryUsedMiB: hostMem[n.Name],
		}
		for _, c := range n.Cards {
			sc := scheduler.Card{Index: int(c.Index), Device: c.Device, MemoryMiB: int64(c.MemoryMib), Healthy: c.Healthy}
			if s := shares[cardKey{n.Name, c.Index}]; len(s) > 0 {
				sc.Shares, sc.Accelerator = s, s[0].Accelerator
			}
			sn.Cards = append(sn.Cards, sc)
		}
		v.nodes = append(v.nodes, sn)
	}
	return v
}
