package executor

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/protobuf/proto"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// Residency (docs/residency.md) is where a replica's weights are: Cold, Loading,
// Resident, Draining, Sleeping or Waking. It travels in the ReplicaStatus
// the executor reports, so every transition is committed to the Raft log
// with its reason: `replicas list` shows it, `audit log --resource
// model/NAME`, `audit replay` and `events` show the transitions.
//
// Two sources report it. The engine's own transitions imply one
// (engineResidency): an engine starting loads its weights, one running
// holds them, one failed or stopped holds nothing. Until a residency
// controller sleeps and wakes engines, every engine the executor runs is
// loaded when placed, so these are the whole truth. A controller reports the
// transitions it drives (sleep, wake, evict, load on demand) with
// ReportResidency; the engine's transitions stay facts about the process
// and keep being reported after it (a crashed engine is Cold whatever the
// controller last said).

// ErrNotRunning is returned by ReportResidency for a replica this node does
// not run, or whose engine has not reported a state yet.
var ErrNotRunning = errors.New("replica has no engine on this node yet")

// ReportResidency commits a residency transition of a replica this node
// runs, with why it happened: the decision's trigger and the numbers that
// decided it ("evict coder: value 0.4 < chat 3.1; frees 9.8Gi, chat needs
// 7.2Gi"). It is reported as a ReplicaStatus carrying the engine's last
// reported state, so it changes nothing but the residency. An identical
// transition is not reported twice. It returns the Reporter's error (a
// stale report: the replica moved on) or ErrNotRunning; it is safe to call
// from any goroutine. residualMiB is what a sleeping engine keeps on the
// card (ignored for any other residency), so that `devices get` counts it
// and frees the rest of the share.
func (e *Executor) ReportResidency(ctx context.Context, model string, replica uint32, residency pb.ReplicaResidency, reason string, residualMiB uint64) error {
	if residency == pb.ReplicaResidency_REPLICA_RESIDENCY_UNSPECIFIED {
		return fmt.Errorf("report residency of %s/%d: no residency given", model, replica)
	}
	e.mu.Lock()
	s := e.sups[key{model, replica}]
	e.mu.Unlock()
	if s == nil {
		return fmt.Errorf("report residency of %s/%d: %w", model, replica, ErrNotRunning)
	}
	return s.reportResidency(ctx, residency, reason, residualMiB)
}

func (s *supervisor) reportResidency(ctx context.Context, residency pb.ReplicaResidency, reason string, residualMiB uint64) error {
	s.reportMu.Lock()
	defer s.reportMu.Unlock()
	if s.latest == nil {
		return fmt.Errorf("report residency of %s: %w", s.k, ErrNotRunning)
	}
	st := proto.Clone(s.latest).(*pb.ReplicaStatus)
	st.Residency, st.ResidencyReason, st.ResidualMib = residency, reason, 0
	if residency == pb.ReplicaResidency_REPLICA_RESIDENCY_SLEEPING {
		st.ResidualMib = residualMiB
	}
	if proto.Equal(st, s.latest) {
		return nil
	}
	if err := s.e.rep.Report(ctx, st); err != nil {
		return fmt.Errorf("report residency of %s: %w", s.k, err)
	}
	s.accepted(st)
	return nil
}

// engineResidency is the residency an engine transition implies, with its
// reason, or unspecified (the residency stays as it is).
func engineResidency(state pb.ReplicaState, reason string) (pb.ReplicaResidency, string) {
	switch state {
	case pb.ReplicaState_REPLICA_STATE_STARTING:
		return pb.ReplicaResidency_REPLICA_RESIDENCY_LOADING, "engine starting"
	case pb.ReplicaState_REPLICA_STATE_RUNNING:
		return pb.ReplicaResidency_REPLICA_RESIDENCY_RESIDENT, "engine running: loaded when placed"
	case pb.ReplicaState_REPLICA_STATE_FAILED:
		return pb.ReplicaResidency_REPLICA_RESIDENCY_COLD, "engine failed: " + reason
	case pb.ReplicaState_REPLICA_STATE_STOPPED:
		return pb.ReplicaResidency_REPLICA_RESIDENCY_COLD, "engine stopped: " + reason
	}
	return pb.ReplicaResidency_REPLICA_RESIDENCY_UNSPECIFIED, ""
}

// heldResidency is engineResidency for a replica a Gate holds: loaded on
// demand, and Cold while it waits for demand.
func heldResidency(state pb.ReplicaState, reason string) (pb.ReplicaResidency, string) {
	switch state {
	case pb.ReplicaState_REPLICA_STATE_PLACED:
		return pb.ReplicaResidency_REPLICA_RESIDENCY_COLD, reason
	case pb.ReplicaState_REPLICA_STATE_RUNNING:
		return pb.ReplicaResidency_REPLICA_RESIDENCY_RESIDENT, "engine running: loaded on demand"
	}
	return engineResidency(state, reason)
}

// ReportAdapters commits where a replica's adapters are (their tiers, those
// on disk left out), as a ReplicaStatus carrying the engine's last reported
// state, so that `models get` shows them. A list equal to the last one
// reported is not reported again. Errors as ReportResidency.
func (e *Executor) ReportAdapters(ctx context.Context, model string, replica uint32, adapters []*pb.AdapterStatus) error {
	e.mu.Lock()
	s := e.sups[key{model, replica}]
	e.mu.Unlock()
	if s == nil {
		return fmt.Errorf("report adapters of %s/%d: %w", model, replica, ErrNotRunning)
	}
	s.reportMu.Lock()
	defer s.reportMu.Unlock()
	if s.latest == nil {
		return fmt.Errorf("report adapters of %s: %w", s.k, ErrNotRunning)
	}
	st := proto.Clone(s.latest).(*pb.ReplicaStatus)
	st.Adapters = &pb.ReplicaAdapters{Adapters: adapters}
	if proto.Equal(st, s.latest) {
		return nil
	}
	if err := s.e.rep.Report(ctx, st); err != nil {
		return fmt.Errorf("report adapters of %s: %w", s.k, err)
	}
	s.accepted(st)
	return nil
}

// accepted records st, built on latest, as accepted: it carries latest's
// engine state, which is no longer to be resent. Called with reportMu held.
func (s *supervisor) accepted(st *pb.ReplicaStatus) {
	s.latest, s.unsent = st, false
}
