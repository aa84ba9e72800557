package executor

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/internal/testutil"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// outage is a reporter whose first fail reports do not get through, as
// while no server can be reached.
type outage struct {
	reporter
	fail atomic.Int32
}

func (o *outage) Report(ctx context.Context, st *pb.ReplicaStatus) error {
	if o.fail.Add(-1) >= 0 {
		return errors.New("no server reached")
	}
	return o.reporter.Report(ctx, st)
}

// TestHollowResendsLostReports gives a hollow executor one snapshot and
// loses its first reports: with no other snapshot to come, the replica must
// still be reported Running.
func TestHollowResendsLostReports(t *testing.T) {
	src := &source{ch: make(chan Snapshot, 1)}
	rep := &outage{}
	rep.fail.Store(2)
	h := NewHollow(src, rep, node, "", nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.Run(ctx)
	}()
	defer func() {
		cancel()
		<-done
	}()
	src.ch <- Snapshot{Index: 5, Replicas: []Desired{{
		Replica: &pb.Replica{Model: "m", Index: 0, Node: node, Cards: []uint32{0}, Generation: 1,
			State: pb.ReplicaState_REPLICA_STATE_PLACED},
		Spec: &pb.ModelSpec{},
	}}}
	testutil.Eventually(t, 30*time.Second, "m/0 reported Running", func() error {
		if st := rep.last("m"); st.GetState() != pb.ReplicaState_REPLICA_STATE_RUNNING || st.GetGeneration() != 1 {
			return fmt.Errorf("last report %v", st)
		}
		return nil
	})
	if n := rep.fail.Load(); n >= 0 {
		t.Errorf("%d reports still to fail: the outage never happened", n+1)
	}
}
