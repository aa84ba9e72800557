package rpc

import (
	"strings"
	"testing"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// TestEnumCheckFindsNestedUndefined: the enum check, which visits only
// the fields that can lead to an enum, still finds an undefined number in
// a list of messages, inside the member of a oneof, and names the field;
// defined values and messages without enums pass.
func TestEnumCheckFindsNestedUndefined(t *testing.T) {
	status := func(r pb.ReplicaResidency) *pb.Envelope {
		return &pb.Envelope{RequestId: "r", Command: &pb.Envelope_ReplicaStatus{ReplicaStatus: &pb.ReplicaStatus{Model: "m", Node: "n1", Residency: r}}}
	}
	create := &pb.Envelope{RequestId: "c", Command: &pb.Envelope_CreateAccelerator{CreateAccelerator: &pb.CreateAccelerator{Name: "a", Spec: &pb.AcceleratorSpec{Device: "l4", Tenancy: pb.Tenancy(2)}}}}
	bad := &pb.ForwardRequest{Envelopes: []*pb.Envelope{create, status(pb.ReplicaResidency(1)), status(pb.ReplicaResidency(42))}}
	err := checkEnums(bad)
	if err == nil || !strings.Contains(err.Error(), "envelopes[2].replicaStatus.residency") {
		t.Fatalf("undefined residency in the third envelope: %v; want an error naming envelopes[2].replicaStatus.residency", err)
	}
	badTenancy := &pb.ApplyRequest{Envelope: &pb.Envelope{Command: &pb.Envelope_CreateAccelerator{CreateAccelerator: &pb.CreateAccelerator{Name: "a", Spec: &pb.AcceleratorSpec{Device: "l4", Tenancy: pb.Tenancy(99)}}}}}
	if err := checkEnums(badTenancy); err == nil || !strings.Contains(err.Error(), "envelope.createAccelerator.spec.tenancy") {
		t.Fatalf("undefined tenancy: %v; want an error naming envelope.createAccelerator.spec.tenancy", err)
	}
	for _, ok := range []any{
		&pb.ForwardRequest{Envelopes: []*pb.Envelope{create, status(pb.ReplicaResidency(1))}},
		&pb.StatusRequest{},
	} {
		if err := checkEnums(ok); err != nil {
			t.Errorf("%T with defined enums: %v", ok, err)
		}
	}
}
