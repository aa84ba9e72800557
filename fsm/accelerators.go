package fsm

import (
	"fmt"
	"sort"
	"strings"

	"github.com/gpuplane/gpuplane/internal/catalog"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// DefaultMaxModels is the models per card of a shared accelerator that does
// not say.
const DefaultMaxModels = 2

// MaxMaxModels bounds a shared accelerator's models per card: past it each
// model's share of a card (MEMORY/MODEL) is too small to hold any weights.
const MaxMaxModels = 64

// NormalizeAcceleratorSpec returns spec with the defaults of docs/descriptors.md filled in:
// dedicated tenancy, one device per replica, two models per shared card.
func NormalizeAcceleratorSpec(spec *pb.AcceleratorSpec) *pb.AcceleratorSpec {
	// A copy (a decoded command's messages are recycled), by hand: this
	// runs for every accelerator created, on every server.
	// TestNormalizeAcceleratorSpecCopiesEveryField fails when the spec
	// gains a field this misses.
	out := &pb.AcceleratorSpec{}
	if spec != nil {
		out = &pb.AcceleratorSpec{Device: spec.Device, Tenancy: spec.Tenancy, MaxModels: spec.MaxModels, DevicesPerReplica: spec.DevicesPerReplica}
	}
	if out.Tenancy == pb.Tenancy_TENANCY_UNSPECIFIED {
		out.Tenancy = pb.Tenancy_TENANCY_DEDICATED
	}
	if out.DevicesPerReplica == 0 {
		out.DevicesPerReplica = 1
	}
	if out.Tenancy == pb.Tenancy_TENANCY_SHARED && out.MaxModels == 0 {
		out.MaxModels = DefaultMaxModels
	}
	return out
}

// ValidateAccelerator checks what can be known about an accelerator without
// the cluster's state: its name and the rules of docs/descriptors.md that concern the
// spec alone (1, 3, 4's maxModels part). It reports every problem.
func ValidateAccelerator(name string, spec *pb.AcceleratorSpec) []*pb.Violation {
	return append(ValidateName("metadata.name", name), ValidateAcceleratorSpec(spec)...)
}

// ValidateAcceleratorSpec is ValidateAccelerator without the name. The CLI's
// offline checks (fsm/descriptor) call it too, so that a rule reads
// the same whether the CLI or the server refuses.
func ValidateAcceleratorSpec(spec *pb.AcceleratorSpec) []*pb.Violation {
	var v violations
	if spec.GetDevice() == "" {
		v.add("spec.device", "is required: the device kind this accelerator places on (see `gpuplane devices list`)")
	}
	switch spec.GetTenancy() {
	case pb.Tenancy_TENANCY_UNSPECIFIED, pb.Tenancy_TENANCY_DEDICATED:
		if spec.GetMaxModels() != 0 {
			v.add("spec.maxModels", "is for shared accelerators only (rule 4); a dedicated replica gets whole cards")
		}
	case pb.Tenancy_TENANCY_SHARED:
		if spec.GetDevicesPerReplica() > 1 {
			v.add("spec.devicesPerReplica", "a shared accelerator splits a single device: must be 1, got %d (rule 3)", spec.GetDevicesPerReplica())
		}
		if m := spec.GetMaxModels(); m > MaxMaxModels {
			v.add("spec.maxModels", "%s", MaxModelsRange(int64(m)))
		}
	default:
		v.add("spec.tenancy", "must be dedicated or shared")
	}
	return v
}

// MaxModelsRange is rule 4's bound on maxModels, refusing got.
func MaxModelsRange(got int64) string {
	return fmt.Sprintf("must be between 1 and %d models per card, got %d (rule 4)", MaxMaxModels, got)
}

// TenancyName is the capitalised tenancy users see (Dedicated, Shared).
func TenancyName(t pb.Tenancy) string {
	switch t {
	case pb.Tenancy_TENANCY_SHARED:
		return "Shared"
	case pb.Tenancy_TENANCY_DEDICATED, pb.Tenancy_TENANCY_UNSPECIFIED:
		return "Dedicated"
	}
	return "Unknown"
}

func (f *FSM) createAccelerator(c *pb.CreateAccelerator, index uint64, dry bool) *pb.Result {
	v := violations(ValidateAccelerator(c.GetName(), c.GetSpec()))
	if len(v) > 0 {
		return invalid(fmt.Sprintf("accelerator %q", c.GetName()), v)
	}
	spec := NormalizeAcceleratorSpec(c.GetSpec())

	if prev, exists := f.accelerators[c.GetName()]; exists {
		if !c.GetUpsert() {
			return reject(pb.Code_CODE_ALREADY_EXISTS, "accelerator %q already exists", c.GetName())
		}
		res := accept(pb.Outcome_OUTCOME_UNCHANGED, "accelerator %q unchanged", c.GetName())
		if diff := specDiff(prev.GetSpec(), spec); len(diff) > 0 {
			res.Warnings = append(res.Warnings, fmt.Sprintf(
				"accelerator %q is immutable (rule 5): left unchanged although %s differ; delete and re-create it to change them",
				c.GetName(), strings.Join(diff, ", ")))
		}
		return res
	}

	var warnings []string
	switch inv, reported := f.devices[spec.Device]; {
	case reported:
		if inv.maxPerNode > 0 && spec.DevicesPerReplica > inv.maxPerNode {
			v.add("spec.devicesPerReplica", "%d exceeds MAX/NODE of %s: no node has more than %d %s cards (rule 4)",
				spec.DevicesPerReplica, spec.Device, inv.maxPerNode, spec.Device)
		}
	default:
		if _, known := catalog.BySlug(spec.Device); known {
			warnings = append(warnings, fmt.Sprintf("no node has reported a %s card yet; accelerator %q cannot place replicas until one does", spec.Device, c.GetName()))
		} else {
			v.add("spec.device", "unknown device kind %q (rule 2): known kinds are %s", spec.Device, strings.Join(f.knownDevices(), ", "))
		}
	}
	if len(v) > 0 {
		return invalid(fmt.Sprintf("accelerator %q", c.GetName()), v)
	}
	res := accept(pb.Outcome_OUTCOME_CREATED, "accelerator %q created", c.GetName())
	res.Warnings = warnings
	if !dry {
		f.accelerators[c.GetName()] = &pb.StoredAccelerator{Name: c.GetName(), Spec: spec, CreatedIndex: index}
	}
	return res
}

// specDiff names the fields whose values differ, with both values.
func specDiff(have, want *pb.AcceleratorSpec) []string {
	var d []string
	if have.GetDevice() != want.GetDevice() {
		d = append(d, fmt.Sprintf("spec.device (is %s, file says %s)", have.GetDevice(), want.GetDevice()))
	}
	if have.GetTenancy() != want.GetTenancy() {
		d = append(d, fmt.Sprintf("spec.tenancy (is %s, file says %s)", TenancyName(have.GetTenancy()), TenancyName(want.GetTenancy())))
	}
	if have.GetTenancy() != want.GetTenancy() {
		return d // the other fields follow from tenancy
	}
	if have.GetMaxModels() != want.GetMaxModels() {
		d = append(d, fmt.Sprintf("spec.maxModels (is %d, file says %d)", have.GetMaxModels(), want.GetMaxModels()))
	}
	if have.GetDevicesPerReplica() != want.GetDevicesPerReplica() {
		d = append(d, fmt.Sprintf("spec.devicesPerReplica (is %d, file says %d)", have.GetDevicesPerReplica(), want.GetDevicesPerReplica()))
	}
	return d
}

// knownDevices lists every device kind the cluster accepts: those in the
// inventory and those in the catalog.
func (f *FSM) knownDevices() []string {
	set := map[string]bool{}
	for _, s := range catalog.Slugs() {
		set[s] = true
	}
	for _, n := range f.nodes {
		for _, c := range n.Cards {
			set[c.Device] = true
		}
	}
	out := make([]string, 0, len(set))
	for s := range set {
		out = append(out, s)
	}
	sort.Strings(out)
	return out
}

func (f *FSM) deleteAccelerator(c *pb.DeleteAccelerator, dry bool) *pb.Result {
	name := c.GetName()
	if _, exists := f.accelerators[name]; !exists {
		return reject(pb.Code_CODE_NOT_FOUND, "accelerator %q not found", name)
	}
	users := f.modelsOn(name)
	if len(users) > 0 && !c.GetForce() {
		return reject(pb.Code_CODE_FAILED_PRECONDITION,
			"accelerator %q is used by deployments %s: delete them first, or use --force to leave them pending",
			name, strings.Join(users, ", "))
	}
	res := accept(pb.Outcome_OUTCOME_DELETED, "accelerator %q deleted", name)
	if len(users) > 0 {
		res.Warnings = append(res.Warnings, fmt.Sprintf("deployments %s stay pending: accelerator %s was deleted", strings.Join(users, ", "), name))
	}
	if !dry {
		reason := fmt.Sprintf("accelerator %s was deleted", name)
		f.unplaceWhere(func(r *pb.Replica) bool { return r.Accelerator == name }, reason)
		delete(f.accelerators, name)
	}
	return res
}
