package fsm_test

import (
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/gpuplane/gpuplane/fsm"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// TestNormalizeAcceleratorSpecCopiesEveryField: NormalizeAcceleratorSpec
// copies the spec field by field; a field added to AcceleratorSpec that it
// misses would silently vanish from every accelerator created.
func TestNormalizeAcceleratorSpecCopiesEveryField(t *testing.T) {
	spec := &pb.AcceleratorSpec{}
	m := spec.ProtoReflect()
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		switch fd.Kind() {
		case protoreflect.StringKind:
			m.Set(fd, protoreflect.ValueOfString("x"+string(fd.Name())))
		case protoreflect.EnumKind:
			m.Set(fd, protoreflect.ValueOfEnum(1))
		case protoreflect.Uint32Kind:
			m.Set(fd, protoreflect.ValueOfUint32(uint32(7+i)))
		default:
			t.Fatalf("field %s of kind %s: teach this test (and NormalizeAcceleratorSpec) about it", fd.Name(), fd.Kind())
		}
	}
	got := fsm.NormalizeAcceleratorSpec(spec)
	if !proto.Equal(got, spec) {
		t.Fatalf("normalized %v, want every field kept: %v", got, spec)
	}
	if got == spec {
		t.Fatal("returned the caller's spec, not a copy")
	}
	if d := fsm.NormalizeAcceleratorSpec(nil); d.GetTenancy() != pb.Tenancy_TENANCY_DEDICATED || d.GetDevicesPerReplica() != 1 {
		t.Fatalf("nil spec normalized to %v", d)
	}
}
