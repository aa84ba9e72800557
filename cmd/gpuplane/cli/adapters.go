package cli

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/gpuplane/gpuplane/fsm"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// adapterTable is the adapters section of `models get`: each adapter of the
// deployment with where it is on each placed replica (card, loading, host
// RAM or disk, as the nodes last reported), those on a card first.
func adapterTable(spec *pb.ModelSpec, replicas []*pb.Replica) table {
	type row struct {
		a     *pb.Adapter
		tiers []string
		best  pb.AdapterTier
	}
	var placed []*pb.Replica
	for _, r := range replicas {
		if r.GetNode() != "" {
			placed = append(placed, r)
		}
	}
	tierOf := make([]map[string]pb.AdapterTier, len(placed))
	for i, r := range placed {
		tierOf[i] = map[string]pb.AdapterTier{}
		for _, a := range r.GetAdapters() {
			tierOf[i][a.GetName()] = a.GetTier()
		}
	}
	rows := make([]row, 0, len(spec.GetAdapters()))
	for _, a := range spec.GetAdapters() {
		rw := row{a: a, best: pb.AdapterTier_ADAPTER_TIER_DISK}
		for i, r := range placed {
			t := tierOf[i][a.GetName()]
			if t == pb.AdapterTier_ADAPTER_TIER_UNSPECIFIED {
				t = pb.AdapterTier_ADAPTER_TIER_DISK
			}
			rw.best = max(rw.best, t)
			name := fsm.AdapterTierName(t)
			if len(placed) > 1 {
				name = fmt.Sprintf("%d:%s", r.GetIndex(), name)
			}
			rw.tiers = append(rw.tiers, name)
		}
		rows = append(rows, rw)
	}
	slices.SortStableFunc(rows, func(x, y row) int {
		return cmp.Or(cmp.Compare(y.best, x.best), cmp.Compare(x.a.GetName(), y.a.GetName()))
	})
	return tableOf([]string{"ADAPTER", "RANK", "SOURCE", "TENANTS", "TIER"}, rows, func(r row) []string {
		tenants := strings.Join(r.a.GetTenants(), ",")
		tier := strings.Join(r.tiers, " ")
		if tier == "" {
			tier = "-"
		}
		return []string{r.a.GetName(), itoa(r.a.GetRank()), r.a.GetSource(), tenants, tier}
	})
}
