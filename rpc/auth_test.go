package rpc

import (
	"testing"

	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	_ "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
	"github.com/gpuplane/gpuplane/proto/gpuplane/v1/gpuplanev1connect"
)

// TestEveryProcedureHasAccess keeps the access table complete: a new RPC
// falls back to admin, which is safe but rarely what was meant.
func TestEveryProcedureHasAccess(t *testing.T) {
	for _, name := range services {
		d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(name))
		if err != nil {
			t.Fatal(err)
		}
		methods := d.(protoreflect.ServiceDescriptor).Methods()
		for i := range methods.Len() {
			proc := "/" + name + "/" + string(methods.Get(i).Name())
			if _, ok := procedureAccess[proc]; !ok {
				t.Errorf("%s is missing from procedureAccess", proc)
			}
		}
	}
	if ProcedureAccess("/gpuplane.v1.NewService/Method") != AccessAdmin {
		t.Error("an unknown procedure must need admin")
	}
}

// Residency decisions, plans and profiles are reads: any token may see them
// (they name models and cards, no secrets), as the rest of the cluster's state.
func TestResidencyNeedsRead(t *testing.T) {
	for _, proc := range []string{
		gpuplanev1connect.ResidencyServiceListDecisionsProcedure,
		gpuplanev1connect.ResidencyServiceGetPlanProcedure,
		gpuplanev1connect.ResidencyServiceListProfilesProcedure,
	} {
		if got := ProcedureAccess(proc); got != AccessRead {
			t.Errorf("%s needs %s, want read", proc, got)
		}
	}
}

// The dashboard's summary shows what the separate reads show: any token
// may call it.
func TestDashboardSummaryNeedsRead(t *testing.T) {
	if got := ProcedureAccess(gpuplanev1connect.DashboardServiceSummaryProcedure); got != AccessRead {
		t.Errorf("%s needs %s, want read", gpuplanev1connect.DashboardServiceSummaryProcedure, got)
	}
}
