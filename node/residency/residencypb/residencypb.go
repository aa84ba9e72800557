// Package residencypb serves a node's residency journal in the wire's
// shapes: it adapts *residency.Journal to what rpc's ResidencyService
// declares it needs, so rpc does not import the controller and the
// controller stays free of protobuf.
package residencypb

import (
	"context"
	"errors"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/gpuplane/gpuplane/node/residency"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// Journal adapts a residency journal; J must not be nil.
type Journal struct{ J *residency.Journal }

// Node names the journal's node.
func (a Journal) Node() string { return a.J.Node() }

// Decisions returns the decisions after seq and a channel closed when a
// later one is recorded.
func (a Journal) Decisions(after uint64) ([]*pb.ResidencyDecision, <-chan struct{}) {
	ds, changed := a.J.Decisions(after)
	out := make([]*pb.ResidencyDecision, 0, len(ds))
	for _, d := range ds {
		out = append(out, decisionToProto(d))
	}
	return out, changed
}

// Plan is each card's current plan, stamped now.
func (a Journal) Plan() []*pb.ResidencyCardPlan {
	now := timestamppb.Now()
	var out []*pb.ResidencyCardPlan
	for _, v := range a.J.Cards() {
		c := &pb.ResidencyCardPlan{
			Node: v.Node, Card: v.Card, Mode: v.Mode, PinnedOnly: v.PinnedOnly, Violations: int64(v.Violations),
			UsableBytes: v.Usable, ReservedBytes: v.Ledger.Reserved, ResidentBytes: v.Ledger.Resident,
			ObservedAt: now,
		}
		acct := v.Ledger.Account()
		c.UsedBytes, c.SleepingBytes, c.FreeBytes = acct.Used, acct.Sleeping, acct.Free
		if c.UsableBytes == 0 {
			c.UsableBytes = v.Ledger.Usable
		}
		for _, e := range v.Plan {
			pe := &pb.ResidencyPlanEntry{
				Model: string(e.Model), Residency: e.Residency.String(), Priority: e.Priority.String(),
				State: e.State.String(), Tier: e.Tier, RatePerMinute: e.Rate, Value: e.Value, CostBytes: e.Cost,
			}
			if !e.NextRequest.IsZero() {
				pe.NextRequest = timestamppb.New(e.NextRequest)
			}
			if e.Action != 0 {
				pe.Action, pe.Trigger = e.Action.String(), e.Trigger.String()
			}
			// Without an action, the reason says why its requests wait.
			pe.Reason = e.Reason
			pe.Active, pe.HostBytes, pe.BestEffort = int64(e.Active), e.HostBytes, e.BestEffort
			if w := e.Wait; w.Waiting > 0 {
				pe.Waiting, pe.Wait, pe.WaitSince, pe.WaitedSeconds = int64(w.Waiting), w.Text, timestamppb.New(w.Since), w.Age.Seconds()
				if !w.By.IsZero() {
					pe.WaitBy = timestamppb.New(w.By)
				}
			}
			if e.Next != 0 {
				pe.NextAction, pe.NextAt = e.Next.String()+" ("+e.NextWhy+")", timestamppb.New(e.NextAt)
			}
			c.Entries = append(c.Entries, pe)
		}
		out = append(out, c)
	}
	return out
}

// Profiles are the node's measured profiles.
func (a Journal) Profiles() []*pb.ResidencyProfile {
	var out []*pb.ResidencyProfile
	for _, p := range a.J.Profiles() {
		out = append(out, &pb.ResidencyProfile{
			Node: a.J.Node(), Model: string(p.Key.Model), Quantization: p.Key.Quantization,
			Engine: p.Key.Engine, Device: p.Key.Device,
			LoadMs: p.LoadTime.Milliseconds(), WakeMs: p.WakeTime.Milliseconds(),
			FootprintBytes: p.Footprint, PeakBytes: p.Peak, ResidualBytes: p.Residual,
			TokensPerSecond: p.TokensPerSecond,
			Loads:           int64(p.Loads), Wakes: int64(p.Wakes), Failures: int64(p.Failures),
		})
	}
	return out
}

func decisionToProto(d residency.NodeDecision) *pb.ResidencyDecision {
	in := d.Inputs
	return &pb.ResidencyDecision{
		Seq: d.Seq, Time: timestamppb.New(d.Time), Node: d.Node, Card: d.Card,
		Action: d.Action.String(), Model: string(d.Model), Trigger: d.Trigger.String(),
		ForModel: string(d.For), Reason: d.Reason, Advised: d.Advised, By: d.By,
		Inputs: &pb.ResidencyInputs{
			RatePerMinute: in.Rate, Value: in.Value, ForValue: in.ForValue, Bytes: in.Bytes,
			NeedBytes: in.Need, FreeBytes: in.Free, ReloadMs: in.Reload.Milliseconds(), Active: int64(in.Active),
		},
	}
}

// Protect passes an operator's choice of the protected set to the node's
// residency manager; nothing where the manager does not run.
func (a Journal) Protect(ctx context.Context, models []string, by string) ([]*pb.OperateResult, error) {
	rs, err := a.J.Protect(ctx, models, by)
	if errors.Is(err, residency.ErrNoOperator) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return a.results(rs), nil
}

func (a Journal) results(rs []residency.OperatorResult) []*pb.OperateResult {
	out := make([]*pb.OperateResult, 0, len(rs))
	for _, r := range rs {
		out = append(out, &pb.OperateResult{
			Node: a.J.Node(), Card: r.Card, Replica: string(r.Replica), Action: r.Action.String(), Reason: r.Reason,
		})
	}
	return out
}

// Operate passes an operator's load or unload to the node's residency
// manager; nothing where the manager does not run.
func (a Journal) Operate(ctx context.Context, model string, load bool, by string) ([]*pb.OperateResult, error) {
	rs, err := a.J.Operate(ctx, model, load, by)
	if errors.Is(err, residency.ErrNoOperator) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return a.results(rs), nil
}
