package fsm

import (
	"fmt"
	"strings"
	"unicode"

	"github.com/gpuplane/gpuplane/internal/cardfit"
	"github.com/gpuplane/gpuplane/internal/wireenum"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// Residency modes (docs/residency.md) decide what a replica takes from its card:
// pinned and warm replicas reserve their share (rule 11: reserved shares sum
// to ≤ 100 %), onDemand replicas are assigned to the card (they count
// against maxModels) without a reservation, and each onDemand share must fit
// in the card minus its pinned shares, so that it can always be loaded by
// evicting or sleeping what is not pinned.

// residencyOf is a spec's residency, the default (pinned) for unspecified.
func residencyOf(spec *pb.ModelSpec) pb.Residency {
	if r := spec.GetResidency(); r != pb.Residency_RESIDENCY_UNSPECIFIED {
		return r
	}
	return pb.Residency_RESIDENCY_PINNED
}

// reserves says whether a replica of that residency reserves its share.
func reserves(r pb.Residency) bool { return r != pb.Residency_RESIDENCY_ON_DEMAND }

// ResidencyName is the descriptor spelling of a residency: pinned, warm or
// onDemand (unspecified reads as pinned).
func ResidencyName(r pb.Residency) string {
	if r < pb.Residency_RESIDENCY_UNSPECIFIED || r > pb.Residency_RESIDENCY_ON_DEMAND {
		return fmt.Sprintf("unknown(%d)", int32(r))
	}
	return wireenum.Residency(r).String()
}

// PriorityName is the descriptor spelling of a priority: interactive,
// standard or background (unspecified reads as standard).
func PriorityName(p pb.Priority) string {
	if p < pb.Priority_PRIORITY_UNSPECIFIED || p > pb.Priority_PRIORITY_BACKGROUND {
		return fmt.Sprintf("unknown(%d)", int32(p))
	}
	return wireenum.Class(p).String()
}

// ReplicaResidencyName is the name users see for where a replica's weights
// are (docs/residency.md): Cold, Loading, Resident, Draining, Sleeping, Waking; ""
// for unspecified (a replica that is not placed; the views show a placed
// one its node has not reported on as Cold).
func ReplicaResidencyName(r pb.ReplicaResidency) string {
	switch r {
	case pb.ReplicaResidency_REPLICA_RESIDENCY_UNSPECIFIED:
		return ""
	case pb.ReplicaResidency_REPLICA_RESIDENCY_COLD:
		return "Cold"
	case pb.ReplicaResidency_REPLICA_RESIDENCY_LOADING:
		return "Loading"
	case pb.ReplicaResidency_REPLICA_RESIDENCY_RESIDENT:
		return "Resident"
	case pb.ReplicaResidency_REPLICA_RESIDENCY_DRAINING:
		return "Draining"
	case pb.ReplicaResidency_REPLICA_RESIDENCY_SLEEPING:
		return "Sleeping"
	case pb.ReplicaResidency_REPLICA_RESIDENCY_WAKING:
		return "Waking"
	}
	return "Unknown"
}

// MaxQuantizationLen bounds engine.quantization.
const MaxQuantizationLen = 64

// validateResidencyFields checks the fields of docs/residency.md that need no state.
// MaxIdleSeconds bounds spec.idle's timeouts.
const MaxIdleSeconds = 7 * 24 * 3600

func validateResidencyFields(v *violations, spec *pb.ModelSpec) {
	if r := spec.GetResidency(); r < pb.Residency_RESIDENCY_UNSPECIFIED || r > pb.Residency_RESIDENCY_ON_DEMAND {
		v.add("spec.residency", "must be pinned, warm or onDemand, got %d", int32(r))
	}
	if p := spec.GetPriority(); p < pb.Priority_PRIORITY_UNSPECIFIED || p > pb.Priority_PRIORITY_BACKGROUND {
		v.add("spec.priority", "must be interactive, standard or background, got %d", int32(p))
	}
	if i := spec.GetIdle(); i != nil {
		pinned := spec.GetResidency() == pb.Residency_RESIDENCY_PINNED || spec.GetResidency() == pb.Residency_RESIDENCY_UNSPECIFIED
		for _, f := range []struct {
			field string
			s     uint32
		}{{"spec.idle.sleepAfter", i.GetSleepAfterSeconds()}, {"spec.idle.unloadAfter", i.GetUnloadAfterSeconds()}} {
			switch {
			case f.s == 0:
			case pinned:
				v.add(f.field, "a pinned model is never demoted when idle: only warm and onDemand deployments take idle timeouts")
			case f.s > MaxIdleSeconds:
				v.add(f.field, "must be at most %d seconds (7 days), got %d", MaxIdleSeconds, f.s)
			}
		}
		if i.GetUnloadAfterSeconds() > 0 && spec.GetResidency() == pb.Residency_RESIDENCY_WARM {
			v.add("spec.idle.unloadAfter", "a warm model is never unloaded when idle (its share stays reserved): only onDemand deployments take it")
		}
	}
	if spec.GetSlo() != nil && spec.GetSlo().GetTtftMs() == 0 {
		v.add("spec.slo.ttftMs", "must be more than 0 milliseconds (leave slo out for no target)")
	}
	if q := spec.GetEngine().GetQuantization(); q != "" {
		if msg := CheckQuantization(q); msg != "" {
			v.add("spec.engine.quantization", "%s", msg)
		}
	}
}

// CheckQuantization says why q is not an acceptable engine.quantization
// (a single word such as bf16, fp8, awq or q4_k_m), or "".
func CheckQuantization(q string) string {
	switch {
	case strings.IndexFunc(q, unicode.IsSpace) >= 0:
		return fmt.Sprintf("%q must be one word without spaces (e.g. bf16, fp8, awq, q4_k_m)", q)
	case len(q) > MaxQuantizationLen:
		return fmt.Sprintf("must be at most %d characters, got %d", MaxQuantizationLen, len(q))
	}
	return ""
}

// checkResidencyTenancy is the rule of docs/residency.md that needs the accelerator:
// an onDemand or warm deployment needs a shared accelerator.
func checkResidencyTenancy(v *violations, spec *pb.ModelSpec, accName string, acc *pb.AcceleratorSpec) {
	if r := residencyOf(spec); r != pb.Residency_RESIDENCY_PINNED && acc.Tenancy != pb.Tenancy_TENANCY_SHARED {
		v.add("spec.residency", "an onDemand or warm deployment needs a shared accelerator: %q is dedicated (residency %s)", accName, ResidencyName(r))
	}
}

// fits is rule 11 (docs/residency.md) for one more share of residency r on
// a card of a shared accelerator holding l: nil or the rule it breaks. The
// scheduler chooses cards by the same rule (internal/cardfit).
func fits(l cardfit.Load, r pb.Residency, milli, maxModels uint32) error {
	return l.Why(wireenum.Residency(r), int32(milli), int32(maxModels))
}

// load is what the placed replicas take from card k, by their deployments'
// residency.
func (f *FSM) load(k cardKey) cardfit.Load {
	u := f.cards[k]
	if u == nil {
		return cardfit.Load{}
	}
	l := cardfit.Load{Replicas: int32(len(u.replicas)), Reserved: int32(u.shareMilli), Pinned: int32(u.pinnedMilli)}
	if u.onDemand > 0 {
		for _, rk := range u.replicas {
			r := f.replicas[rk]
			if r != nil && residencyOf(f.models[r.Model].GetSpec()) == pb.Residency_RESIDENCY_ON_DEMAND {
				l.OnDemandMax = max(l.OnDemandMax, int32(r.ShareMilli))
			}
		}
	}
	return l
}

// changeResidency moves m's placed replicas to the residency of spec: each
// leaves its cards under the old residency and takes them again under the
// new one where rule 11 allows; one that no longer fits (onDemand becoming
// reserved on a full card) returns to pending with the numbers, for the
// scheduler to place again, and is named in the warnings returned. Nothing
// else is re-placed. m.Spec becomes spec.
func (f *FSM) changeResidency(m *pb.ModelDeployment, spec *pb.ModelSpec) (warnings []string) {
	var placed []*pb.Replica
	for i := uint32(0); i < m.Spec.Replicas; i++ {
		if r := f.replicas[replicaKey{m.Name, i}]; r != nil && r.Node != "" {
			f.release(r)
			placed = append(placed, r)
		}
	}
	m.Spec = spec
	res := residencyOf(spec)
	for _, r := range placed {
		if err := f.refits(r, res); err != nil {
			reason := fmt.Sprintf("residency changed to %s: %v", ResidencyName(res), err)
			warnings = append(warnings, fmt.Sprintf("replica %s/%d returns to pending to be placed again: %s", r.Model, r.Index, reason))
			f.clearPlacement(r, reason+"; waiting for the scheduler")
			continue
		}
		f.occupy(r)
	}
	return warnings
}

// refits checks that a replica taken off its cards fits them again with
// residency res.
func (f *FSM) refits(r *pb.Replica, res pb.Residency) error {
	acc, ok := f.accelerators[r.Accelerator]
	if !ok || acc.Spec.Tenancy != pb.Tenancy_TENANCY_SHARED {
		return nil // dedicated replicas are pinned: nothing changes
	}
	for _, idx := range r.Cards {
		if err := fits(f.load(cardKey{r.Node, idx}), res, r.ShareMilli, acc.Spec.MaxModels); err != nil {
			return fmt.Errorf("card %s/%d %w", r.Node, idx, err)
		}
	}
	return nil
}
