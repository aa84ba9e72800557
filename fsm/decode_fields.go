package fsm

import (
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// fields is how the Decoder reads one message kind: by field number, the
// reader of that field. A field with no reader (one this file does not
// expect, a map among them), or a reader that fails (a value of another
// wire type, bad UTF-8, a message given twice, which protobuf would merge),
// sends the whole entry to proto.Unmarshal. A scalar given twice keeps the
// last value, as in protobuf.
type fields[T any] []fieldReader[T]

// fieldReader reads one field of m: v for a varint, b for bytes.
type fieldReader[T any] func(d *Decoder, m *T, typ protowire.Type, v uint64, b []byte) bool

// decode reads b into m.
func (fs fields[T]) decode(d *Decoder, m *T, b []byte) bool {
	for len(b) > 0 {
		num, typ, v, s, rest, ok := field(b)
		if !ok || int(num) >= len(fs) || fs[num] == nil || !fs[num](d, m, typ, v, s) {
			return false
		}
		b = rest
	}
	return true
}

// The readers of each kind of field; get returns the field in m.

// delimited reads a length-delimited field: read decodes its bytes, put
// stores the value in m (false: it cannot, as for a message given twice).
func delimited[T, V any](read func(d *Decoder, b []byte) (V, bool), put func(m *T, v V) bool) fieldReader[T] {
	return func(d *Decoder, m *T, typ protowire.Type, _ uint64, b []byte) bool {
		if typ != protowire.BytesType {
			return false
		}
		v, ok := read(d, b)
		return ok && put(m, v)
	}
}

func str[T any](get func(m *T) *string) fieldReader[T] {
	return delimited((*Decoder).str, func(m *T, s string) bool { *get(m) = s; return true })
}

// strs reads a repeated string, one value per occurrence.
func strs[T any](get func(m *T) *[]string) fieldReader[T] {
	return delimited((*Decoder).str, func(m *T, s string) bool { *get(m) = append(*get(m), s); return true })
}

// varint reads an integer, enum or bool field: conv turns the wire value
// into the field's type as protobuf does (truncating to 32 bits, v != 0).
func varint[T, V any](get func(m *T) *V, conv func(uint64) V) fieldReader[T] {
	return func(_ *Decoder, m *T, typ protowire.Type, v uint64, _ []byte) bool {
		if typ != protowire.VarintType {
			return false
		}
		*get(m) = conv(v)
		return true
	}
}

func u32[T any](get func(m *T) *uint32) fieldReader[T] {
	return varint(get, func(v uint64) uint32 { return uint32(v) })
}

func u64[T any](get func(m *T) *uint64) fieldReader[T] {
	return varint(get, func(v uint64) uint64 { return v })
}

func enum[T any, E ~int32](get func(m *T) *E) fieldReader[T] {
	return varint(get, func(v uint64) E { return E(int32(v)) })
}

// sub decodes a message of fields fs into one new allocates.
func sub[M any](fs fields[M], new func(d *Decoder) *M) func(d *Decoder, b []byte) (*M, bool) {
	return func(d *Decoder, b []byte) (*M, bool) {
		m := new(d)
		return m, fs.decode(d, m, b)
	}
}

// message reads a message field given once, into a message new allocates.
func message[T, M any](get func(m *T) **M, fs fields[M], new func(d *Decoder) *M) fieldReader[T] {
	return delimited(sub(fs, new), func(m *T, v *M) bool {
		if *get(m) != nil {
			return false
		}
		*get(m) = v
		return true
	})
}

// messages reads a repeated message field, one message per occurrence.
func messages[T, M any](get func(m *T) *[]*M, fs fields[M], new func(d *Decoder) *M) fieldReader[T] {
	return delimited(sub(fs, new), func(m *T, v *M) bool { *get(m) = append(*get(m), v); return true })
}

// alloc allocates a message on its own: for messages the state keeps (an
// ApplyModel's spec), which must not come from the recycled slabs.
func alloc[M any](*Decoder) *M { return new(M) }

var timestampFields = fields[timestamppb.Timestamp]{
	1: varint(func(m *timestamppb.Timestamp) *int64 { return &m.Seconds }, func(v uint64) int64 { return int64(v) }),
	2: varint(func(m *timestamppb.Timestamp) *int32 { return &m.Nanos }, func(v uint64) int32 { return int32(v) }),
}

var deleteModelFields = fields[pb.DeleteModel]{
	1: str(func(m *pb.DeleteModel) *string { return &m.Name }),
}

var setNodeStatusFields = fields[pb.SetNodeStatus]{
	1: str(func(m *pb.SetNodeStatus) *string { return &m.Node }),
	2: enum(func(m *pb.SetNodeStatus) *pb.NodeStatus { return &m.Status }),
}

var unplaceReplicaFields = fields[pb.UnplaceReplica]{
	1: str(func(m *pb.UnplaceReplica) *string { return &m.Model }),
	2: u32(func(m *pb.UnplaceReplica) *uint32 { return &m.Replica }),
	3: str(func(m *pb.UnplaceReplica) *string { return &m.Reason }),
}

var replicaStatusFields = fields[pb.ReplicaStatus]{
	1:  str(func(m *pb.ReplicaStatus) *string { return &m.Model }),
	2:  u32(func(m *pb.ReplicaStatus) *uint32 { return &m.Replica }),
	3:  u64(func(m *pb.ReplicaStatus) *uint64 { return &m.Generation }),
	4:  str(func(m *pb.ReplicaStatus) *string { return &m.Node }),
	5:  enum(func(m *pb.ReplicaStatus) *pb.ReplicaState { return &m.State }),
	6:  str(func(m *pb.ReplicaStatus) *string { return &m.Reason }),
	7:  u32(func(m *pb.ReplicaStatus) *uint32 { return &m.Restarts }),
	8:  str(func(m *pb.ReplicaStatus) *string { return &m.Endpoint }),
	9:  enum(func(m *pb.ReplicaStatus) *pb.ReplicaResidency { return &m.Residency }),
	10: str(func(m *pb.ReplicaStatus) *string { return &m.ResidencyReason }),
	11: message(func(m *pb.ReplicaStatus) **pb.ReplicaAdapters { return &m.Adapters }, replicaAdaptersFields, alloc[pb.ReplicaAdapters]),
	12: u64(func(m *pb.ReplicaStatus) *uint64 { return &m.ResidualMib }),
}

var replicaAdaptersFields = fields[pb.ReplicaAdapters]{
	1: messages(func(m *pb.ReplicaAdapters) *[]*pb.AdapterStatus { return &m.Adapters }, adapterStatusFields, alloc[pb.AdapterStatus]),
}

var adapterStatusFields = fields[pb.AdapterStatus]{
	1: str(func(m *pb.AdapterStatus) *string { return &m.Name }),
	2: enum(func(m *pb.AdapterStatus) *pb.AdapterTier { return &m.Tier }),
}

var placementFields = fields[pb.Placement]{
	1: str(func(m *pb.Placement) *string { return &m.Model }),
	2: u32(func(m *pb.Placement) *uint32 { return &m.Replica }),
	3: u64(func(m *pb.Placement) *uint64 { return &m.Generation }),
	4: str(func(m *pb.Placement) *string { return &m.Node }),
	// Packed, in one piece: unpacked or split cards are left to protobuf.
	5: func(d *Decoder, m *pb.Placement, typ protowire.Type, _ uint64, b []byte) (ok bool) {
		if typ != protowire.BytesType || m.Cards != nil {
			return false
		}
		m.Cards, ok = d.packedUint32s(b)
		return ok
	},
	6: u32(func(m *pb.Placement) *uint32 { return &m.LegacyShareMilli }),
}

var pendingReasonFields = fields[pb.PendingReason]{
	1: str(func(m *pb.PendingReason) *string { return &m.Model }),
	2: u32(func(m *pb.PendingReason) *uint32 { return &m.Replica }),
	3: str(func(m *pb.PendingReason) *string { return &m.Reason }),
}

var createAcceleratorFields = fields[pb.CreateAccelerator]{
	1: str(func(m *pb.CreateAccelerator) *string { return &m.Name }),
	2: message(func(m *pb.CreateAccelerator) **pb.AcceleratorSpec { return &m.Spec }, acceleratorSpecFields,
		func(d *Decoder) *pb.AcceleratorSpec { return d.accSpecs.one(d.Slab) }),
	3: varint(func(m *pb.CreateAccelerator) *bool { return &m.Upsert }, func(v uint64) bool { return v != 0 }),
}

var acceleratorSpecFields = fields[pb.AcceleratorSpec]{
	1: str(func(m *pb.AcceleratorSpec) *string { return &m.Device }),
	2: enum(func(m *pb.AcceleratorSpec) *pb.Tenancy { return &m.Tenancy }),
	3: u32(func(m *pb.AcceleratorSpec) *uint32 { return &m.MaxModels }),
	4: u32(func(m *pb.AcceleratorSpec) *uint32 { return &m.DevicesPerReplica }),
}

// An ApplyModel's messages are allocated one by one: the state keeps its
// spec (normalized in place, prepareDecodedModel).
var applyModelFields = fields[pb.ApplyModel]{
	1: str(func(m *pb.ApplyModel) *string { return &m.Name }),
	2: message(func(m *pb.ApplyModel) **pb.ModelSpec { return &m.Spec }, modelSpecFields, alloc[pb.ModelSpec]),
}

var modelSpecFields = fields[pb.ModelSpec]{
	1:  str(func(m *pb.ModelSpec) *string { return &m.Model }),
	2:  str(func(m *pb.ModelSpec) *string { return &m.ServedModelName }),
	3:  u32(func(m *pb.ModelSpec) *uint32 { return &m.Replicas }),
	4:  message(func(m *pb.ModelSpec) **pb.PlacementSpec { return &m.Placement }, placementSpecFields, alloc[pb.PlacementSpec]),
	5:  message(func(m *pb.ModelSpec) **pb.EngineSpec { return &m.Engine }, engineSpecFields, alloc[pb.EngineSpec]),
	6:  message(func(m *pb.ModelSpec) **pb.HostResources { return &m.Resources }, hostResourcesFields, alloc[pb.HostResources]),
	7:  enum(func(m *pb.ModelSpec) *pb.Residency { return &m.Residency }),
	8:  enum(func(m *pb.ModelSpec) *pb.Priority { return &m.Priority }),
	9:  message(func(m *pb.ModelSpec) **pb.SLO { return &m.Slo }, sloFields, alloc[pb.SLO]),
	10: messages(func(m *pb.ModelSpec) *[]*pb.Adapter { return &m.Adapters }, adapterFields, alloc[pb.Adapter]),
	11: strs(func(m *pb.ModelSpec) *[]string { return &m.Aliases }),
	12: message(func(m *pb.ModelSpec) **pb.IdleTimeouts { return &m.Idle }, idleFields, alloc[pb.IdleTimeouts]),
}

// The node selector (a map) has no reader.
var placementSpecFields = fields[pb.PlacementSpec]{
	1: str(func(m *pb.PlacementSpec) *string { return &m.Accelerator }),
}

// The environment (a map) has no reader.
var engineSpecFields = fields[pb.EngineSpec]{
	1:  str(func(m *pb.EngineSpec) *string { return &m.Kind }),
	2:  u32(func(m *pb.EngineSpec) *uint32 { return &m.MemoryPercent }),
	3:  u64(func(m *pb.EngineSpec) *uint64 { return &m.MemoryMib }),
	4:  u32(func(m *pb.EngineSpec) *uint32 { return &m.ComputePercent }),
	5:  u32(func(m *pb.EngineSpec) *uint32 { return &m.MaxModelLen }),
	6:  u32(func(m *pb.EngineSpec) *uint32 { return &m.TensorParallel }),
	7:  u32(func(m *pb.EngineSpec) *uint32 { return &m.PipelineParallel }),
	8:  strs(func(m *pb.EngineSpec) *[]string { return &m.Args }),
	10: u32(func(m *pb.EngineSpec) *uint32 { return &m.StartTimeoutSeconds }),
	11: str(func(m *pb.EngineSpec) *string { return &m.Quantization }),
	12: u32(func(m *pb.EngineSpec) *uint32 { return &m.MaxAdapters }),
	13: u32(func(m *pb.EngineSpec) *uint32 { return &m.MaxInFlight }),
	14: u32(func(m *pb.EngineSpec) *uint32 { return &m.SleepLevel }),
	15: str(func(m *pb.EngineSpec) *string { return &m.Dialect }),
}

var hostResourcesFields = fields[pb.HostResources]{
	1: u32(func(m *pb.HostResources) *uint32 { return &m.CpuMilli }),
	2: u64(func(m *pb.HostResources) *uint64 { return &m.MemoryMib }),
}

var adapterFields = fields[pb.Adapter]{
	1: str(func(m *pb.Adapter) *string { return &m.Name }),
	2: str(func(m *pb.Adapter) *string { return &m.Source }),
	3: u32(func(m *pb.Adapter) *uint32 { return &m.Rank }),
	4: strs(func(m *pb.Adapter) *[]string { return &m.Tenants }),
}

var idleFields = fields[pb.IdleTimeouts]{
	1: u32(func(m *pb.IdleTimeouts) *uint32 { return &m.SleepAfterSeconds }),
	2: u32(func(m *pb.IdleTimeouts) *uint32 { return &m.UnloadAfterSeconds }),
}

var sloFields = fields[pb.SLO]{
	1: u32(func(m *pb.SLO) *uint32 { return &m.TtftMs }),
}
