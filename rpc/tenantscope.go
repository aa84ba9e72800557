package rpc

import (
	"context"
	"regexp"
	"slices"

	"google.golang.org/protobuf/proto"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// A read token is a tenant's key (principal.tenantScoped). Where a read
// shows other tenants' data and the part that is the tenant's own is
// clearly defined, the read is filtered for it here rather than refused
// (docs/operations.md#who-reads-what):
//
//   - deployments (models list/get) and replicas: every tenant may use
//     every deployment, so each is shown, with only the adapters the
//     tenant may use (open ones and those that name it); a restricted one
//     names no tenant but the caller's. A replica's adapter tiers are
//     those of the same adapters.
//   - residency decisions: those about deployments (which every tenant
//     may use), with the operator who asked for a load or unload not
//     named. Adapter decisions are left out: their reasons name the
//     deployment's other adapters (the one unloaded to make room, the one
//     waiting) and adapters since removed, whose tenants are no longer
//     known.

// tenantScope is the tenant whose data alone ctx's caller may read, and
// whether the caller is so bound (a read token with ACLs on).
func tenantScope(ctx context.Context) (string, bool) {
	p, ok := principalFrom(ctx)
	if !ok || !p.tenantScoped() {
		return "", false
	}
	return p.tenant, true
}

// mayUse reports whether tenant may use adapter a: it is open to every
// tenant or names this one (the gateway's rule).
func mayUse(a *pb.Adapter, tenant string) bool {
	return len(a.GetTenants()) == 0 || slices.Contains(a.GetTenants(), tenant)
}

// usableAdapters are the names of m's adapters tenant may use.
func usableAdapters(m *pb.ModelDeployment, tenant string) map[string]bool {
	out := map[string]bool{}
	for _, a := range m.GetSpec().GetAdapters() {
		if mayUse(a, tenant) {
			out[a.GetName()] = true
		}
	}
	return out
}

// scopeModel removes from m (a copy) what tenant may not see: the adapters
// it may not use and, of those restricted to it among others, the other
// tenants' names.
func scopeModel(m *pb.ModelDeployment, tenant string) {
	spec := m.GetSpec()
	if spec == nil {
		return
	}
	kept := spec.Adapters[:0]
	for _, a := range spec.Adapters {
		if !mayUse(a, tenant) {
			continue
		}
		if len(a.Tenants) > 0 {
			a.Tenants = []string{tenant}
		}
		kept = append(kept, a)
	}
	clear(spec.Adapters[len(kept):])
	spec.Adapters = kept
}

// scopeReplicas keeps in each replica (a copy) only the adapter tiers of
// adapters its deployment offers tenant (usable: deployment name → the
// adapters tenant may use; a deployment missing offers none).
func scopeReplicas(rs []*pb.Replica, usable map[string]map[string]bool) {
	for _, r := range rs {
		own := usable[r.GetModel()]
		r.Adapters = slices.DeleteFunc(r.Adapters, func(a *pb.AdapterStatus) bool { return !own[a.GetName()] })
	}
}

// adapterActions are the residency decisions about adapters.
var adapterActions = map[string]bool{"load-adapter": true, "unload-adapter": true, "drop-adapter": true}

// operatorNamed is how a decision's reason names the operator who asked
// (node/residency's askedBy).
var operatorNamed = regexp.MustCompile(`asked by the operator \([^)]*\)`)

// scopeDecisions keeps the decisions a tenant's key may read: not those
// about adapters, and without the name of the operator who asked (in the
// reason, nor as the decision's by). The
// decisions kept are copies.
func scopeDecisions(ds []*pb.ResidencyDecision) []*pb.ResidencyDecision {
	out := make([]*pb.ResidencyDecision, 0, len(ds))
	for _, d := range ds {
		if adapterActions[d.GetAction()] {
			continue
		}
		if operatorNamed.MatchString(d.GetReason()) || d.GetBy() != "" {
			d = proto.Clone(d).(*pb.ResidencyDecision)
			d.Reason = operatorNamed.ReplaceAllString(d.Reason, "asked by the operator")
			d.By = ""
		}
		out = append(out, d)
	}
	return out
}
