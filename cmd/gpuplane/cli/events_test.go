package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/cluster"
	"github.com/gpuplane/gpuplane/cluster/audit"
	"github.com/gpuplane/gpuplane/internal/testutil"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
	"github.com/gpuplane/gpuplane/rpc"
)

// server is one Raft server with its API, as an agent wires them.
type server struct {
	c   *cluster.Cluster
	api *rpc.Server
	url string
}

func (s *server) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s.api.Shutdown(ctx)
	s.c.Shutdown()
}

// startServers starts three servers bootstrapped together, each serving
// the API, and registers each as a node so that its API address is known.
func startServers(t *testing.T) []*server {
	t.Helper()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	var peers []cluster.Peer
	for i := range 3 {
		peers = append(peers, cluster.Peer{ID: fmt.Sprintf("s%d", i+1), Address: net.JoinHostPort("127.0.0.1", strconv.Itoa(freePort(t)))})
	}
	servers := make([]*server, 3)
	for i, p := range peers {
		c, err := cluster.New(cluster.Config{NodeName: p.ID, DataDir: t.TempDir(), RaftBind: p.Address, Server: true,
			Bootstrap: true, BootstrapPeers: peers, Logger: logger, RaftLogLevel: slog.LevelError + 4})
		if err != nil {
			t.Fatal(err)
		}
		c.SetForwarder(&rpc.Forwarder{Resolve: c.APIAddress, HTTP: rpc.HTTPClient()})
		api, err := rpc.Listen("127.0.0.1:0", rpc.Config{Backend: c, Logger: logger})
		if err != nil {
			t.Fatal(err)
		}
		go api.Serve()
		servers[i] = &server{c: c, api: api, url: "http://" + api.Addr().String()}
		t.Cleanup(servers[i].stop)
	}
	lead := waitLeaderOf(t, servers)
	for _, s := range servers {
		applyOK(t, lead.c, &pb.Envelope{Actor: "node/" + s.c.NodeName(), Command: &pb.Envelope_RegisterNode{RegisterNode: &pb.RegisterNode{Node: &pb.Node{
			Name: s.c.NodeName(), Address: strings.TrimPrefix(s.url, "http://"), Role: pb.NodeRole_NODE_ROLE_SERVER, Status: pb.NodeStatus_NODE_STATUS_ALIVE}}}})
	}
	return servers
}

func waitLeaderOf(t *testing.T, servers []*server) *server {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		for _, s := range servers {
			if s != nil && s.c.IsLeader() {
				return s
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal("no leader")
	return nil
}

func applyOK(t *testing.T, c *cluster.Cluster, env *pb.Envelope) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	res, err := c.Apply(ctx, env)
	if err != nil {
		t.Fatalf("apply on %s: %v", c.NodeName(), err)
	}
	return res.GetIndex()
}

// syncBuffer is a bytes.Buffer safe for the CLI goroutine and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// TestEventsFollowAcrossLeaderChange follows the event stream from the
// leader of three servers, stops that leader mid-stream while writes keep
// coming, and checks that the CLI resumed on another server and printed
// every event of the surviving log exactly once, in index order. Before the
// leader stops, `audit verify` must pass on all three servers.
func TestEventsFollowAcrossLeaderChange(t *testing.T) {
	servers := startServers(t)
	lead := waitLeaderOf(t, servers)

	var before uint64
	for i := range 20 {
		before = applyOK(t, lead.c, createAcc(fmt.Sprintf("a%d", i)))
	}
	if r := run(t, "", nil, "--addr", servers[1].url, "audit", "verify"); r.code != 0 || !strings.Contains(r.stdout, "ok: 3 server(s) agree") {
		t.Fatalf("audit verify on three servers: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	ctx, cancel := context.WithCancel(context.Background())
	var stdout, stderr syncBuffer
	done := make(chan int)
	go func() {
		g := &globals{stdin: strings.NewReader(""), stdout: &stdout, stderr: &stderr, getenv: func(string) string { return "" }}
		done <- g.run(ctx, []string{"--addr", lead.url, "-o", "json", "events", "--follow"})
	}()
	// The stream is on the leader (and the CLI knows the other servers to
	// resume on) before the leader stops: on a loaded machine the CLI may
	// not even have connected within the writes' head start below.
	testutil.Until(t, 20*time.Second, "events --follow printed the entries before the writes", func() bool {
		return strings.Contains(stdout.String(), fmt.Sprintf(`"index":%d,`, before))
	})

	// Writes keep flowing from a follower while the leader goes away.
	var survivor *server
	for _, s := range servers {
		if s != lead {
			survivor = s
		}
	}
	writes := make(chan error, 1)
	go func() {
		for i := range 40 {
			c, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			_, err := survivor.c.Apply(c, createAcc(fmt.Sprintf("b%d", i)))
			cancel()
			if err != nil {
				writes <- err
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
		writes <- nil
	}()
	time.Sleep(150 * time.Millisecond)
	lead.stop()
	if err := <-writes; err != nil {
		t.Fatalf("writes across the leader change: %v", err)
	}
	last := applyOK(t, survivor.c, createAcc("last"))

	// Wait until the stream has printed the last entry.
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(stdout.String(), fmt.Sprintf(`"index":%d,`, last)) {
		if time.Now().After(deadline) {
			t.Fatalf("events --follow never printed index %d\nstderr: %s", last, stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("events --follow: exit %d: %s", code, stderr.String())
	}
	if !strings.Contains(stderr.String(), "resuming from index") {
		t.Errorf("the stream was never interrupted, so the test proved nothing; stderr: %s", stderr.String())
	}

	var got []uint64
	for _, line := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
		var ev struct{ Index uint64 }
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("not a JSON line: %q: %v", line, err)
		}
		got = append(got, ev.Index)
	}
	hist, err := audit.Live(survivor.c)
	if err != nil {
		t.Fatal(err)
	}
	var want []uint64
	if err := hist.Cursor(1, nil).Advance(last, func(ev *pb.Event) error {
		want = append(want, ev.GetIndex())
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("events across the leader change:\n got %v\nwant %v", got, want)
	}
}

func createAcc(name string) *pb.Envelope {
	return &pb.Envelope{Actor: "alice", Command: &pb.Envelope_CreateAccelerator{CreateAccelerator: &pb.CreateAccelerator{
		Name: name, Spec: &pb.AcceleratorSpec{Device: "l4", Tenancy: pb.Tenancy_TENANCY_DEDICATED, DevicesPerReplica: 1}}}}
}
