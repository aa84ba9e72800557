package cli

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/gpuplane/gpuplane/fsm"
	"github.com/gpuplane/gpuplane/fsm/descriptor"
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

// adapterFlag is `models deploy --adapter NAME=SOURCE,rank=N[,tenants=A|B]`,
// repeatable: one entry of spec.adapters per use. What the flag's syntax
// cannot say (no '=', an unknown key, a rank that is no number) is a usage
// error naming the flag; the adapter rules themselves (unique names, rank
// 1..512, an engine that can load adapters) are the descriptor's, checked
// on the whole spec.
type adapterFlag struct {
	ads []descriptor.Adapter
	// raw is each use as typed, to name it in a violation.
	raw []string
}

func (f *adapterFlag) String() string { return strings.Join(f.raw, " ") }

func (*adapterFlag) Type() string { return "NAME=SOURCE,rank=N[,tenants=A|B]" }

func (f *adapterFlag) Set(s string) error {
	parts := strings.Split(s, ",")
	name, source, ok := strings.Cut(parts[0], "=")
	if !ok || name == "" || source == "" {
		return fmt.Errorf("want NAME=SOURCE first (such as sql=/adapters/sql,rank=16), got %q", parts[0])
	}
	a := descriptor.Adapter{Name: name, Source: source}
	for _, p := range parts[1:] {
		k, v, _ := strings.Cut(p, "=")
		switch k {
		case "rank":
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return fmt.Errorf("rank: want a whole number, got %q", v)
			}
			a.Rank = &n
		case "tenants":
			if v == "" {
				return fmt.Errorf("tenants: want one or more tenants separated by '|', got nothing")
			}
			a.Tenants = strings.Split(v, "|")
		default:
			return fmt.Errorf("unknown key %q: want rank=N or tenants=A|B after NAME=SOURCE", k)
		}
	}
	f.ads = append(f.ads, a)
	f.raw = append(f.raw, s)
	return nil
}

// deployFlags is modelFlags with each --adapter and --alias given named as
// typed, so that `error: --adapter "sql=/a,rank=600": rank: must be between
// 1 and 512, got 600` says which one.
func deployFlags(ads *adapterFlag, aliases []string) map[string]string {
	out := make(map[string]string, len(modelFlags)+4*len(ads.raw)+len(aliases))
	maps.Copy(out, modelFlags)
	for i, raw := range ads.raw {
		f := fmt.Sprintf("spec.adapters[%d]", i)
		use := fmt.Sprintf("--adapter %q", raw)
		out[f] = use
		for _, field := range []string{"name", "source", "rank"} {
			out[f+"."+field] = use + ": " + field
		}
		for j := range ads.ads[i].Tenants {
			out[fmt.Sprintf("%s.tenants[%d]", f, j)] = fmt.Sprintf("%s: tenants[%d]", use, j)
		}
	}
	for i, a := range aliases {
		out[fmt.Sprintf("spec.aliases[%d]", i)] = fmt.Sprintf("--alias %q", a)
	}
	return out
}
