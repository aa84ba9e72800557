package agent_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/internal/testutil"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// failedReports is a slog.Handler that tells when the executor logs a
// failed report of a replica state.
type failedReports struct {
	state pb.ReplicaState
	once  *sync.Once
	seen  chan struct{}
}

func (h failedReports) Enabled(context.Context, slog.Level) bool { return true }

func (h failedReports) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "report replica status" {
		return nil
	}
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "state" && a.Value.Any() == h.state {
			h.once.Do(func() { close(h.seen) })
			return false
		}
		return true
	})
	return nil
}

func (h failedReports) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h failedReports) WithGroup(string) slog.Handler      { return h }

// TestLostReportIsSentAgain loses a client node's report that its replica
// runs (its only server is down when the engine becomes ready) and checks
// that once the server is back, the cluster records the replica Running
// although nothing changes on the node any more: the executor sends again
// what did not get through.
func TestLostReportIsSentAgain(t *testing.T) {
	srv := newNode(t, "server", true, "")
	srv.cfg.BootstrapExpect, srv.cfg.Dev = 0, true
	srv.start(t)

	lost := failedReports{state: pb.ReplicaState_REPLICA_STATE_RUNNING, once: new(sync.Once), seen: make(chan struct{})}
	client := newNode(t, "client", false, "h100=1")
	client.cfg.Join = []string{srv.gossip()}
	client.cfg.Logger = slog.New(lost)
	client.start(t)
	testutil.Eventually(t, 30*time.Second, "the client registered alive", func() error {
		return nodeStatus(srv, "client", "alive")
	})

	// Only the client has an H100. The engine loads for a few seconds
	// after it is reported Starting: the server is stopped in between.
	gpuplane(t, srv, "accelerators", "create", "big", "--device", "h100")
	spec := `resource: ModelDeployment
resourceVersion: v1
metadata: {name: m}
spec:
  model: /models/m
  placement: {accelerator: big}
  engine: {kind: sim, args: ["--load-seconds", "4"]}
`
	path := filepath.Join(t.TempDir(), "m.yaml")
	if err := os.WriteFile(path, []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	gpuplane(t, srv, "apply", "-f", path)
	replicaIs := func(want string) func() error {
		return func() error {
			rs, err := replicasOn(srv)
			if err != nil {
				return err
			}
			if len(rs) != 1 || rs[0].Node != "client" || rs[0].State != want {
				return fmt.Errorf("replicas %+v, want one %s on client", rs, want)
			}
			return nil
		}
	}
	testutil.Eventually(t, 30*time.Second, "the replica starting on the client", replicaIs("starting"))
	srv.stop(t)
	select {
	case <-lost.seen:
	case <-time.After(30 * time.Second):
		t.Fatal("the client never failed to report its replica Running while the server was down")
	}
	srv.start(t)
	testutil.Eventually(t, 30*time.Second, "the replica recorded Running", replicaIs("running"))
}
