package fsm

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/gpuplane/gpuplane/internal/engines"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// LoRA adapters on a base model (docs/residency.md): the node pages them between
// disk, host RAM and the card; the deployment only names them.

// Bounds of spec.adapters and spec.engine.maxAdapters.
const (
	// MaxAdapterRank is vLLM's largest --max-lora-rank.
	MaxAdapterRank = 512
	// MaxAdaptersPerDeployment bounds one deployment's list (a few
	// thousand fine-tunes on one base; the log entry stays well under a
	// megabyte).
	MaxAdaptersPerDeployment = 4096
	// MaxAdaptersOnCard bounds engine.maxAdapters (vLLM --max-loras).
	MaxAdaptersOnCard = 256
	// MaxInFlight bounds engine.maxInFlight (the most concurrent
	// sequences any engine is run with is far below it).
	MaxInFlight = 1 << 16
	// DefaultMaxAdapters is engine.maxAdapters when unset.
	DefaultMaxAdapters = 4
	maxAdapterNameLen  = 128
	maxAdapterSource   = 4096
)

// adapterName is what a request may name as model ADAPTER or NAME:ADAPTER:
// no ':' (it separates the two), no '/', no spaces.
var adapterName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

// AdapterEngine says why the engine e describes cannot serve adapters, or
// "" (engines.Engine.Adapters): vLLM (runtime LoRA API) and the sim engine
// load them at run time, llama.cpp at start (--lora, picked per request);
// the others cannot, nor can a sim speaking one of them.
func AdapterEngine(e *pb.EngineSpec) string {
	if e.GetKind() == "" {
		return ""
	}
	r, ok := engines.Speaks(e)
	switch {
	case !ok:
		return fmt.Sprintf("engine %s cannot load LoRA adapters", e.GetKind())
	case r.Adapters != engines.AdaptersNone:
		return ""
	case e.GetKind() != r.Kind:
		return fmt.Sprintf("a %s engine speaking %s cannot serve LoRA adapters, as %s cannot: use another dialect, or no adapters", e.GetKind(), r.Kind, r.Name)
	case r.NoAdapters != "":
		return r.NoAdapters
	}
	return fmt.Sprintf("engine %s cannot load LoRA adapters", r.Kind)
}

// CheckAdapterName says why name is not an acceptable adapter name, or "".
func CheckAdapterName(name string) string {
	switch {
	case name == "":
		return "is required"
	case len(name) > maxAdapterNameLen:
		return fmt.Sprintf("must be at most %d characters, got %d", maxAdapterNameLen, len(name))
	case !adapterName.MatchString(name):
		return fmt.Sprintf("%q must be letters, digits, '.', '_' or '-', starting with a letter or digit (requests name it as model NAME:ADAPTER)", name)
	}
	return ""
}

// validateAdapters checks spec.adapters and spec.engine.maxAdapters.
func validateAdapters(v *violations, spec *pb.ModelSpec) {
	*v = append(*v, ValidateAdapters(spec.GetServedModelName(), spec.GetEngine(), spec.GetAdapters())...)
}

// servedNameClash refuses an adapter named as the model it is served on:
// requests could not tell the base from the adapter.
func servedNameClash(served string, ads []*pb.Adapter) []*pb.Violation {
	var v violations
	for i, a := range ads {
		if a.GetName() != "" && a.GetName() == served {
			v.add(fmt.Sprintf("spec.adapters[%d].name", i), "%q is the deployment's served model name: requests could not tell the base from the adapter", a.GetName())
		}
	}
	return v
}

// ValidateAdapters checks a deployment's adapters and engine.maxAdapters
// (0: the default) for a base served as served; descriptors and the state
// machine share it.
func ValidateAdapters(served string, e *pb.EngineSpec, ads []*pb.Adapter) []*pb.Violation {
	var v violations
	if n := e.GetMaxInFlight(); n > MaxInFlight {
		v.add("spec.engine.maxInFlight", "must be between 1 and %d, got %d", MaxInFlight, n)
	}
	if n := e.GetMaxAdapters(); n > MaxAdaptersOnCard {
		v.add("spec.engine.maxAdapters", "must be between 1 and %d, got %d", MaxAdaptersOnCard, n)
	}
	if len(ads) == 0 {
		return v
	}
	if why := AdapterEngine(e); why != "" {
		v.add("spec.adapters", "%s", why)
	}
	if len(ads) > MaxAdaptersPerDeployment {
		v.add("spec.adapters", "must list at most %d adapters, got %d", MaxAdaptersPerDeployment, len(ads))
		return v
	}
	if served != "" {
		v = append(v, servedNameClash(served, ads)...)
	}
	seen := make(map[string]int, len(ads))
	for i, a := range ads {
		f := fmt.Sprintf("spec.adapters[%d]", i)
		if msg := CheckAdapterName(a.GetName()); msg != "" {
			v.add(f+".name", "%s", msg)
		} else if j, dup := seen[a.GetName()]; dup {
			v.add(f+".name", "%q is already the name of spec.adapters[%d]: adapter names are unique per deployment", a.GetName(), j)
		} else {
			seen[a.GetName()] = i
		}
		switch src := a.GetSource(); {
		case src == "":
			v.add(f+".source", "is required: the path or URI of the adapter's weights")
		case len(src) > maxAdapterSource:
			v.add(f+".source", "must be at most %d characters, got %d", maxAdapterSource, len(src))
		case strings.ContainsRune(src, 0):
			v.add(f+".source", "must not contain NUL")
		}
		if r := a.GetRank(); r == 0 || r > MaxAdapterRank {
			v.add(f+".rank", "must be between 1 and %d, got %d", MaxAdapterRank, r)
		}
		tseen := map[string]bool{}
		for j, t := range a.GetTenants() {
			tf := fmt.Sprintf("%s.tenants[%d]", f, j)
			// Tenants are named as tokens' tenants are (ValidateTenant).
			if bad := ValidateName(tf, t); len(bad) > 0 {
				v = append(v, bad...)
			} else if tseen[t] {
				v.add(tf, "%q is listed twice", t)
			}
			tseen[t] = true
		}
	}
	return v
}

// MaxAdaptersOf is how many adapters an engine keeps on the card at once.
func MaxAdaptersOf(e *pb.EngineSpec) uint32 {
	if n := e.GetMaxAdapters(); n > 0 {
		return n
	}
	return DefaultMaxAdapters
}

// AdapterTierName is the name users see for an adapter tier.
func AdapterTierName(t pb.AdapterTier) string {
	switch t {
	case pb.AdapterTier_ADAPTER_TIER_UNSPECIFIED, pb.AdapterTier_ADAPTER_TIER_DISK:
		return "disk"
	case pb.AdapterTier_ADAPTER_TIER_HOST:
		return "host"
	case pb.AdapterTier_ADAPTER_TIER_LOADING:
		return "loading"
	case pb.AdapterTier_ADAPTER_TIER_CARD:
		return "card"
	}
	return "unknown"
}

// checkReplicaAdapters checks a node's report of a replica's adapters.
func checkReplicaAdapters(ra *pb.ReplicaAdapters) []*pb.Violation {
	var v violations
	for i, a := range ra.GetAdapters() {
		if t := a.GetTier(); t < pb.AdapterTier_ADAPTER_TIER_DISK || t > pb.AdapterTier_ADAPTER_TIER_CARD {
			v.add(fmt.Sprintf("adapters[%d].tier", i), "must be disk, host, loading or card, got %d", int32(t))
		}
		if a.GetName() == "" {
			v.add(fmt.Sprintf("adapters[%d].name", i), "is required")
		}
	}
	return v
}

func sameAdapters(a, b []*pb.AdapterStatus) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].GetName() != b[i].GetName() || a[i].GetTier() != b[i].GetTier() {
			return false
		}
	}
	return true
}

// cloneAdapters copies a report's list: the state never shares a command's
// messages.
func cloneAdapters(in []*pb.AdapterStatus) []*pb.AdapterStatus {
	if len(in) == 0 {
		return nil
	}
	out := make([]*pb.AdapterStatus, len(in))
	for i, a := range in {
		out[i] = &pb.AdapterStatus{Name: a.GetName(), Tier: a.GetTier()}
	}
	return out
}
