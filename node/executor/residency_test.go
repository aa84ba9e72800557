package executor

import (
	"context"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/internal/testutil"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// TestResidencyReports: a real sim engine's transitions carry the residency
// they imply (Loading while it starts, Resident once it runs, Cold when it
// dies), and a controller's transition (ReportResidency) is reported with
// its reason and the engine's state unchanged, once.
func TestResidencyReports(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	ctx := context.Background()
	if err := h.exec.ReportResidency(ctx, "alpha", 0, pb.ReplicaResidency_REPLICA_RESIDENCY_SLEEPING, "idle", 0); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("ReportResidency before the replica is here: %v, want ErrNotRunning", err)
	}
	h.want(10, sim("alpha", 1))
	run := h.waitState("alpha", pb.ReplicaState_REPLICA_STATE_RUNNING, 30*time.Second)
	if run.Residency != pb.ReplicaResidency_REPLICA_RESIDENCY_RESIDENT || run.ResidencyReason != "engine running: loaded when placed" {
		t.Fatalf("running report %v: want Resident, loaded when placed", run)
	}
	if start := h.rep.of("alpha")[0]; start.Residency != pb.ReplicaResidency_REPLICA_RESIDENCY_LOADING {
		t.Fatalf("starting report %v: want Loading", start)
	}

	const why = "sleep alpha: idle 300s > 120s; frees 9213Mi"
	for range 2 {
		if err := h.exec.ReportResidency(ctx, "alpha", 0, pb.ReplicaResidency_REPLICA_RESIDENCY_SLEEPING, why, 100); err != nil {
			t.Fatal(err)
		}
	}
	all := h.rep.of("alpha")
	if n := len(all); n != 3 {
		t.Fatalf("%d reports (%v), want starting, running and one sleeping", n, states(all))
	}
	if got := all[2]; got.State != pb.ReplicaState_REPLICA_STATE_RUNNING || got.Endpoint != run.Endpoint ||
		got.Residency != pb.ReplicaResidency_REPLICA_RESIDENCY_SLEEPING || got.ResidencyReason != why {
		t.Fatalf("residency report %v: want Running at %s, Sleeping: %s", got, run.Endpoint, why)
	}
	if err := h.exec.ReportResidency(ctx, "alpha", 0, pb.ReplicaResidency_REPLICA_RESIDENCY_UNSPECIFIED, "", 0); err == nil {
		t.Fatal("ReportResidency of no residency: no error")
	}

	// A crashed engine holds nothing, whatever the controller said.
	if err := syscall.Kill(onePID(t, "alpha"), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var failed *pb.ReplicaStatus
	testutil.Until(t, 30*time.Second, "alpha not reported failed", func() bool {
		for _, st := range h.rep.of("alpha") {
			if st.State == pb.ReplicaState_REPLICA_STATE_FAILED {
				failed = st
			}
		}
		return failed != nil
	})
	if failed.Residency != pb.ReplicaResidency_REPLICA_RESIDENCY_COLD || failed.ResidencyReason != "engine failed: engine killed by signal killed" {
		t.Fatalf("failure report %v: want Cold", failed)
	}
}
