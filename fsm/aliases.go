package fsm

import (
	"fmt"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// MaxAliases bounds spec.aliases: names for one set of replicas, not a
// directory.
const MaxAliases = 64

// ValidateAliases checks spec.aliases, the other names a deployment served
// as served is served under (SPEC §8.1 variants: endpoints that share a
// base share one resident copy). An alias is a name the gateway resolves,
// so it is written as an adapter name is (no ':', which separates
// NAME:ADAPTER), and must tell the deployment's endpoints apart: not its
// served name, not one of its adapters, not listed twice. Descriptors and
// the state machine share it.
func ValidateAliases(served string, aliases []string, ads []*pb.Adapter) []*pb.Violation {
	var v violations
	if len(aliases) > MaxAliases {
		v.add("spec.aliases", "must list at most %d names, got %d", MaxAliases, len(aliases))
		return v
	}
	adapter := make(map[string]bool, len(ads))
	for _, a := range ads {
		adapter[a.GetName()] = true
	}
	seen := make(map[string]int, len(aliases))
	for i, a := range aliases {
		f := fmt.Sprintf("spec.aliases[%d]", i)
		switch {
		case a == "":
			v.add(f, "must not be empty")
		case len(a) > maxAdapterNameLen:
			v.add(f, "must be at most %d characters, got %d", maxAdapterNameLen, len(a))
		case !adapterName.MatchString(a):
			v.add(f, "%q must be letters, digits, '.', '_' or '-', starting with a letter or digit (requests name it as model ALIAS or ALIAS:ADAPTER)", a)
		case a == served:
			v.add(f, "%q is the deployment's served model name already", a)
		case adapter[a]:
			v.add(f, "%q is the name of one of the deployment's adapters: requests could not tell the alias from the adapter", a)
		default:
			if j, dup := seen[a]; dup {
				v.add(f, "%q is already spec.aliases[%d]: aliases are unique per deployment", a, j)
			}
			seen[a] = i
		}
	}
	return v
}
