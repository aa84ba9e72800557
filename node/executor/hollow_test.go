package executor

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/internal/testutil"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// refusingReporter refuses the first n reports, as a cluster without a
// leader (or one too loaded to commit within the report's timeout) does,
// then records them as reporter does.
type refusingReporter struct {
	reporter
	mu      sync.Mutex
	refuse  int
	refused int
}

func (r *refusingReporter) Report(ctx context.Context, st *pb.ReplicaStatus) error {
	r.mu.Lock()
	if r.refused < r.refuse {
		r.refused++
		r.mu.Unlock()
		return errors.New("no leader")
	}
	r.mu.Unlock()
	return r.reporter.Report(ctx, st)
}

// TestHollowReportsAgainAfterAFailedReport: a hollow node whose report of
// a placed replica fails reports it again, without another snapshot (the
// node's stream sends none until something about the node changes), until
// the report is taken.
func TestHollowReportsAgainAfterAFailedReport(t *testing.T) {
	src := &source{ch: make(chan Snapshot, 1)}
	rep := &refusingReporter{refuse: 2}
	h := NewHollow(src, rep, node, "127.0.0.1", nil)
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
	src.ch <- Snapshot{Index: 3, Replicas: []Desired{sim("chat", 1)}}
	testutil.Eventually(t, 20*time.Second, "chat/0 reported Running", func() error {
		if st := rep.last("chat"); st == nil || st.State != pb.ReplicaState_REPLICA_STATE_RUNNING || st.Generation != 1 {
			rep.mu.Lock()
			defer rep.mu.Unlock()
			return fmt.Errorf("reports taken: %v, refused %d", rep.of("chat"), rep.refused)
		}
		return nil
	})
}
