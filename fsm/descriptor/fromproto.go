package descriptor

import (
	"time"

	"github.com/gpuplane/gpuplane/fsm"
	"github.com/gpuplane/gpuplane/internal/engines"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// AcceleratorSpecFromProto is the descriptor form of an accelerator's spec
// as the server keeps it: what `accelerators get -o yaml` prints, and what
// `apply -f` turns back into the same spec (Proto), so that re-applying it
// is "unchanged". A dedicated accelerator states devicesPerReplica, a shared
// one maxModels: each is refused on the other tenancy.
func AcceleratorSpecFromProto(p *pb.AcceleratorSpec) AcceleratorSpec {
	p = fsm.NormalizeAcceleratorSpec(p)
	s := AcceleratorSpec{Device: p.GetDevice()}
	if p.GetTenancy() == pb.Tenancy_TENANCY_SHARED {
		s.Tenancy = "shared"
		s.MaxModels = new(int64(p.GetMaxModels()))
		return s
	}
	s.Tenancy = "dedicated"
	s.DevicesPerReplica = new(int64(p.GetDevicesPerReplica()))
	return s
}

// ModelDeploymentSpecFromProto is the descriptor form of a deployment's spec
// as the server keeps it (defaults filled in): what `models get -o yaml`
// prints, and what `apply -f` turns back into the same spec. Numbers the API
// keeps as 0 for "not set" are left out; residency and priority are always
// stated (pinned, standard when the server keeps them as unspecified).
func ModelDeploymentSpecFromProto(p *pb.ModelSpec) ModelDeploymentSpec {
	opt := func(n uint32) *int64 {
		if n == 0 {
			return nil
		}
		return new(int64(n))
	}
	e := p.GetEngine()
	s := ModelDeploymentSpec{
		Model:           p.GetModel(),
		ServedModelName: p.GetServedModelName(),
		Replicas:        new(int64(p.GetReplicas())),
		Placement:       Placement{Accelerator: p.GetPlacement().GetAccelerator(), NodeSelector: p.GetPlacement().GetNodeSelector()},
		Engine: Engine{
			Kind:             e.GetKind(),
			MemoryPercent:    opt(e.GetMemoryPercent()),
			ComputePercent:   opt(e.GetComputePercent()),
			MaxModelLen:      opt(e.GetMaxModelLen()),
			TensorParallel:   opt(e.GetTensorParallel()),
			PipelineParallel: opt(e.GetPipelineParallel()),
			Args:             e.GetArgs(),
			Env:              e.GetEnv(),
			Quantization:     e.GetQuantization(),
		},
		Residency: fsm.ResidencyName(p.GetResidency()),
		Priority:  fsm.PriorityName(p.GetPriority()),
	}
	if m := e.GetMemoryMib(); m > 0 {
		s.Engine.Memory = &Quantity{MiB: m}
	}
	if t := e.GetStartTimeoutSeconds(); t > 0 {
		s.Engine.StartTimeout = &Duration{time.Duration(t) * time.Second}
	}
	if r := p.GetResources(); r.GetCpuMilli() > 0 || r.GetMemoryMib() > 0 {
		s.Resources = &HostResources{}
		if r.GetCpuMilli() > 0 {
			s.Resources.CPU = &CPU{Milli: r.GetCpuMilli()}
		}
		if r.GetMemoryMib() > 0 {
			s.Resources.Memory = &Quantity{MiB: r.GetMemoryMib()}
		}
	}
	if i := p.GetIdle(); i.GetSleepAfterSeconds() > 0 || i.GetUnloadAfterSeconds() > 0 {
		s.Idle = &Idle{}
		if t := i.GetSleepAfterSeconds(); t > 0 {
			s.Idle.SleepAfter = &Duration{time.Duration(t) * time.Second}
		}
		if t := i.GetUnloadAfterSeconds(); t > 0 {
			s.Idle.UnloadAfter = &Duration{time.Duration(t) * time.Second}
		}
	}
	if t := p.GetSlo().GetTtftMs(); t > 0 {
		s.SLO = &SLO{TTFTMs: new(int64(t))}
	}
	s.Engine.MaxAdapters = opt(e.GetMaxAdapters())
	s.Engine.MaxInFlight = opt(e.GetMaxInFlight())
	s.Engine.SleepLevel = opt(e.GetSleepLevel())
	s.Engine.Dialect = e.GetDialect()
	if a := e.GetArgs(); s.Engine.Dialect == "" && e.GetKind() == engines.Sim && len(a) >= 2 && a[0] == "--dialect" {
		// A spec stored before spec.engine.dialect: the descriptor put
		// the dialect first in the sim's arguments.
		s.Engine.Dialect, s.Engine.Args = engines.Dialect(e), a[2:]
		if len(s.Engine.Args) == 0 {
			s.Engine.Args = nil
		}
	}
	for _, a := range p.GetAdapters() {
		s.Adapters = append(s.Adapters, Adapter{Name: a.GetName(), Source: a.GetSource(), Rank: new(int64(a.GetRank())), Tenants: a.GetTenants()})
	}
	s.Aliases = p.GetAliases()
	return s
}
