package cluster

import (
	"context"
	"iter"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/gpuplane/gpuplane/cluster/raftstore/logtamper"
	"github.com/gpuplane/gpuplane/fsm"
	"github.com/gpuplane/gpuplane/internal/porttest"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// testLogger keeps test output readable: raft's warnings about peers that
// the tests stop on purpose are expected.
func testLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
}

// freeAddr returns a loopback address no other test, in this binary or
// another running beside it, is given (see porttest).
func freeAddr(t testing.TB) string {
	t.Helper()
	return porttest.Addr(t)
}

type nodeOpts struct {
	name, dir, addr string
	bootstrap       bool
	peers           []Peer
	recover         bool
	requestWindow   time.Duration
	segSize         int // the log's segment size (0: the default)
}

// start opens a node and shuts it down when the test ends.
func start(t testing.TB, o nodeOpts) *Cluster {
	t.Helper()
	c, err := New(Config{
		NodeName: o.name, DataDir: o.dir, RaftBind: o.addr, Server: true,
		Bootstrap: o.bootstrap, BootstrapPeers: o.peers, Recover: o.recover, Logger: testLogger(),
		RequestWindow: o.requestWindow, logSegmentSize: o.segSize,
		// The tests stop peers on purpose; raft logs each failed RPC to them.
		RaftLogLevel: slog.LevelError + 4,
	})
	if err != nil {
		t.Fatalf("start %s: %v", o.name, err)
	}
	t.Cleanup(func() { c.Shutdown() })
	return c
}

// startDev starts a single node that bootstraps itself and waits until it leads.
func startDev(t testing.TB) (*Cluster, nodeOpts) {
	t.Helper()
	o := nodeOpts{name: "n1", dir: t.TempDir(), addr: freeAddr(t), bootstrap: true}
	c := start(t, o)
	waitLeader(t, c)
	return c, o
}

func waitLeader(t testing.TB, c *Cluster) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.WaitForLeader(ctx); err != nil {
		t.Fatalf("%s: %v", c.NodeName(), err)
	}
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func registerNode(name string) *pb.Envelope {
	return &pb.Envelope{Command: &pb.Envelope_RegisterNode{RegisterNode: &pb.RegisterNode{Node: &pb.Node{
		Name: name, Address: "127.0.0.1:7410", Role: pb.NodeRole_NODE_ROLE_SERVER,
		Cards: []*pb.Card{{Index: 0, Uuid: "GPU-" + name, Device: "l4", MemoryMib: 23034, Healthy: true}},
	}}}}
}

func createAccelerator(name string) *pb.Envelope {
	return &pb.Envelope{Command: &pb.Envelope_CreateAccelerator{CreateAccelerator: &pb.CreateAccelerator{
		Name: name, Spec: &pb.AcceleratorSpec{Device: "l4", Tenancy: pb.Tenancy_TENANCY_DEDICATED},
	}}}
}

// mustApply applies env through c and fails the test unless the state
// machine accepted it.
func mustApply(t testing.TB, c *Cluster, env *pb.Envelope) *pb.Result {
	t.Helper()
	res, err := c.Apply(testCtx(t), env)
	if err != nil {
		t.Fatalf("apply on %s: %v", c.NodeName(), err)
	}
	if res.Code != pb.Code_CODE_OK || res.Index == 0 {
		t.Fatalf("apply on %s: got %v", c.NodeName(), res)
	}
	return res
}

// replayHash is the hash of the state c's log gives applied from index 1 to
// an empty state machine.
func replayHash(t testing.TB, c *Cluster) string {
	f := fsm.New()
	for index, data := range commands(t, c) {
		f.ApplyBytes(index, data)
	}
	return f.Hash()
}

// commands iterates the command entries of c's log from index 1.
func commands(t testing.TB, c *Cluster) iter.Seq2[uint64, []byte] {
	return func(yield func(uint64, []byte) bool) {
		last, err := c.store.LastIndex()
		if err != nil {
			t.Fatal(err)
		}
		for i := uint64(1); i <= last; i++ {
			var l raft.Log
			if err := c.store.GetLog(i, &l); err != nil {
				t.Fatalf("log entry %d: %v", i, err)
			}
			if l.Type == raft.LogCommand && !yield(l.Index, l.Data) {
				return
			}
		}
	}
}

func hashOf(c *Cluster) string {
	st := c.Status()
	return st.StateHash
}

// localForwarder forwards between in-process nodes the way the rpc layer
// does between agents: to the named node, which must be the leader.
type localForwarder struct {
	mu    sync.Mutex
	nodes map[string]*Cluster
}

func (f *localForwarder) set(c *Cluster) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nodes[c.NodeName()] = c
	c.SetForwarder(f)
}

func (f *localForwarder) leader(id string) (*Cluster, error) {
	f.mu.Lock()
	c := f.nodes[id]
	f.mu.Unlock()
	if c == nil || !c.IsLeader() {
		return nil, ErrNotLeader // unreachable or deposed, as Connect Unavailable would say
	}
	return c, nil
}

func (f *localForwarder) Forward(ctx context.Context, leaderID string, env *pb.Envelope, mode ForwardMode) (*pb.Result, error) {
	c, err := f.leader(leaderID)
	if err != nil {
		return nil, err
	}
	switch mode {
	case ForwardDryRun:
		return c.DryRun(ctx, env)
	case ForwardPropose:
		return c.Propose(ctx, env)
	}
	return c.Apply(ctx, env)
}

func (f *localForwarder) ReadIndex(ctx context.Context, leaderID string) (uint64, error) {
	c, err := f.leader(leaderID)
	if err != nil {
		return 0, err
	}
	return c.ReadIndex(ctx)
}

func (f *localForwarder) node(id string) (*Cluster, error) {
	f.mu.Lock()
	c := f.nodes[id]
	f.mu.Unlock()
	if c == nil {
		return nil, ErrNotLeader
	}
	return c, nil
}

func (f *localForwarder) ReadState(ctx context.Context, serverID string, stale bool) ([]byte, error) {
	c, err := f.node(serverID)
	if err != nil {
		return nil, err
	}
	data, _, err := c.ReadState(ctx, stale)
	return data, err
}

func (f *localForwarder) Status(ctx context.Context, id string) (*pb.StatusResponse, error) {
	c, err := f.node(id)
	if err != nil {
		return nil, err
	}
	return c.ClusterStatus(ctx)
}

func (f *localForwarder) RemovePeer(ctx context.Context, leaderID, name string) error {
	c, err := f.leader(leaderID)
	if err != nil {
		return err
	}
	return c.RemovePeer(ctx, name)
}

func (f *localForwarder) LocalNode(ctx context.Context, id string) (*pb.Node, error) {
	c, err := f.node(id)
	if err != nil {
		return nil, err
	}
	return c.LocalNode(), nil
}

// renameInLog alters a stopped node's log behind its back: the entry that
// creates accelerator from (a one-letter name) is rewritten to create to
// instead. It returns the entry's index.
func renameInLog(t testing.TB, dir, from, to string) uint64 {
	t.Helper()
	return rewriteLog(t, dir, func(l *raft.Log) bool {
		if l.Type != raft.LogCommand || !strings.Contains(string(l.Data), "\n\x01"+from) {
			return false
		}
		var err error
		if l.Data, err = fsm.Marshal(createAccelerator(to)); err != nil {
			t.Fatal(err)
		}
		return true
	})
}

// rewriteLog rewrites a stopped node's log through the store, as someone
// with write access to the data dir could: every entry is read, the first
// that change alters is replaced, and the log is written again (raft-wal
// keeps its checksums right, so only the hash chain can tell). It returns
// the altered entry's index.
func rewriteLog(t testing.TB, dir string, change func(*raft.Log) bool) uint64 {
	t.Helper()
	altered, err := logtamper.Rewrite(LogDir(dir), change)
	if err != nil {
		t.Fatal(err)
	}
	return altered
}
