package rpc_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/gpuplane/gpuplane/cluster"
	"github.com/gpuplane/gpuplane/cluster/audit"
	"github.com/gpuplane/gpuplane/fsm"
	"github.com/gpuplane/gpuplane/internal/porttest"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
	"github.com/gpuplane/gpuplane/proto/gpuplane/v1/gpuplanev1connect"
	"github.com/gpuplane/gpuplane/rpc"
)

// calls counts the procedures a server was called with.
type calls struct {
	mu sync.Mutex
	n  map[string]int
	// refuse, when set, answers Forward with Unimplemented, as a server
	// from before Forward would.
	refuse atomic.Bool
}

func (c *calls) get(proc string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[proc]
}

func (c *calls) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		proc := req.Spec().Procedure
		c.mu.Lock()
		c.n[proc]++
		c.mu.Unlock()
		return next(ctx, req)
	}
}

func (c *calls) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

// batchesProc counts the batches received on Forward streams.
const batchesProc = "forwarded batches"

func (c *calls) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		proc := conn.Spec().Procedure
		c.mu.Lock()
		c.n[proc]++
		c.mu.Unlock()
		if proc == gpuplanev1connect.ClusterServiceForwardProcedure && c.refuse.Load() {
			return connect.NewError(connect.CodeUnimplemented, errors.New("unknown procedure"))
		}
		return next(ctx, &countingConn{StreamingHandlerConn: conn, c: c})
	}
}

// inFlightProc is the most batches one Forward stream had received and not
// yet answered.
const inFlightProc = "most batches in flight"

type countingConn struct {
	connect.StreamingHandlerConn
	c        *calls
	inFlight int // guarded by c.mu
}

func (cc *countingConn) Receive(msg any) error {
	err := cc.StreamingHandlerConn.Receive(msg)
	if err == nil {
		cc.c.mu.Lock()
		cc.c.n[batchesProc]++
		cc.inFlight++
		cc.c.n[inFlightProc] = max(cc.c.n[inFlightProc], cc.inFlight)
		cc.c.mu.Unlock()
	}
	return err
}

func (cc *countingConn) Send(msg any) error {
	cc.c.mu.Lock()
	cc.inFlight--
	cc.c.mu.Unlock()
	return cc.StreamingHandlerConn.Send(msg)
}

// server is one cluster node with its API, as an agent runs them.
type server struct {
	name  string
	c     *cluster.Cluster
	srv   *rpc.Server
	api   string // host:port
	calls *calls
}

// stop stops the server as an agent stops: its API, then its Raft.
func (s *server) stop() {
	shutdown(s.srv)
	s.c.Shutdown()
}

const agentToken = "agent-secret"

// startServers starts n servers bootstrapped together, each serving the API
// (with ACLs when acl is set) and forwarding through rpc.Forwarder; each
// of configure may change the API's configuration.
func startServers(t *testing.T, n int, acl bool, configure ...func(*rpc.Config)) []*server {
	t.Helper()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	var peers []cluster.Peer
	var servers []*server
	for i := range n {
		s := &server{name: fmt.Sprintf("s%d", i+1), calls: &calls{n: map[string]int{}}}
		peers = append(peers, cluster.Peer{ID: s.name, Address: freeAddr(t)})
		servers = append(servers, s)
	}
	apis := map[string]string{}
	var apisMu sync.Mutex
	for i, s := range servers {
		c, err := cluster.New(cluster.Config{NodeName: s.name, DataDir: t.TempDir(), RaftBind: peers[i].Address,
			Server: true, Bootstrap: true, BootstrapPeers: peers, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Shutdown() })
		s.c = c
		cfg := rpc.Config{Backend: c, Logger: quiet, ACL: acl, AgentToken: agentToken,
			NodeName: s.name, Interceptors: []connect.Interceptor{s.calls}}
		for _, f := range configure {
			f(&cfg)
		}
		srv, err := rpc.Listen("127.0.0.1:0", cfg)
		if err != nil {
			t.Fatal(err)
		}
		go srv.Serve()
		t.Cleanup(func() { shutdown(srv) })
		s.srv, s.api = srv, srv.Addr().String()
		apisMu.Lock()
		apis[s.name] = s.api
		apisMu.Unlock()
		token := ""
		if acl {
			token = agentToken
		}
		c.SetForwarder(&rpc.Forwarder{HTTP: rpc.PeerHTTPClient(nil, s.name, token), Resolve: func(id string) (string, bool) {
			apisMu.Lock()
			defer apisMu.Unlock()
			a, ok := apis[id]
			return a, ok
		}})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, s := range servers {
		if err := s.c.WaitForLeader(ctx); err != nil {
			t.Fatal(err)
		}
	}
	return servers
}

// shutdown stops srv, cutting off connections that clients keep open.
func shutdown(srv *rpc.Server) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	srv.Shutdown(ctx)
}

func leaderOf(t *testing.T, servers []*server) (leader *server, followers []*server) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		leader, followers = nil, nil
		for _, s := range servers {
			if s.c.IsLeader() {
				leader = s
			} else {
				followers = append(followers, s)
			}
		}
		if leader != nil {
			return leader, followers
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("no leader")
	return nil, nil
}

func freeAddr(t *testing.T) string {
	t.Helper()
	return porttest.Addr(t)
}

func accelerator(name string) *pb.Envelope {
	return &pb.Envelope{Command: &pb.Envelope_CreateAccelerator{CreateAccelerator: &pb.CreateAccelerator{
		Name: name, Spec: &pb.AcceleratorSpec{Device: "l4"}}}}
}

// TestForwardBatches writes concurrently through followers: every write
// gets its own result (its own index; a retried request id its first
// result; a rejected command its rejection), and the followers reach the
// leader with fewer ApplyBatch calls than writes, and no single Apply.
func TestForwardBatches(t *testing.T) {
	servers := startServers(t, 3, false)
	leader, followers := leaderOf(t, servers)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	const writers = 200
	type outcome struct {
		res *pb.Result
		err error
	}
	out := make([]outcome, writers)
	var wg sync.WaitGroup
	for i := range writers {
		env := accelerator(fmt.Sprintf("acc-%d", i))
		switch {
		case i%50 == 7:
			env = accelerator("Not A Name!") // rejected by the state machine
		case i%2 == 1:
			env.RequestId = fmt.Sprintf("req-%d", i-1) // the same write as i-1: only one of them applies
			env.GetCreateAccelerator().Name = fmt.Sprintf("acc-%d", i-1)
		default:
			env.RequestId = fmt.Sprintf("req-%d", i)
		}
		wg.Go(func() {
			res, err := followers[i%len(followers)].c.Apply(ctx, env)
			out[i] = outcome{res, err}
		})
	}
	wg.Wait()

	indexes := map[uint64]int{}
	for i, o := range out {
		if o.err != nil {
			t.Fatalf("write %d: %v", i, o.err)
		}
		if i%50 == 7 {
			if o.res.Code != pb.Code_CODE_INVALID_ARGUMENT {
				t.Fatalf("write %d of an invalid name: %v", i, o.res)
			}
			continue
		}
		if o.res.Code != pb.Code_CODE_OK || o.res.Index == 0 {
			t.Fatalf("write %d: %v", i, o.res)
		}
		// Both are duplicates when the first to apply was retried (say, a
		// leadership change under the race detector's slowness); neither
		// would mean the request applied twice.
		if i%2 == 1 && !out[i-1].res.GetDuplicate() && !o.res.Duplicate {
			t.Fatalf("writes %d and %d share request id and both applied (%v, %v)", i-1, i, out[i-1].res, o.res)
		}
		if j, ok := indexes[o.res.Index]; ok {
			t.Fatalf("writes %d and %d both at index %d", j, i, o.res.Index)
		}
		indexes[o.res.Index] = i
	}
	batches := leader.calls.get(batchesProc)
	if singles := leader.calls.get(gpuplanev1connect.ClusterServiceApplyProcedure); singles != 0 {
		t.Errorf("leader got %d single Apply calls, want none", singles)
	}
	if batches == 0 || batches >= writers {
		t.Errorf("leader got %d batches for %d forwarded writes", batches, writers)
	}
	// A follower sends a batch while fewer than two await their answers;
	// the writes that come meanwhile wait and go together.
	if n := leader.calls.get(inFlightProc); n < 1 || n > 2 {
		t.Errorf("a stream had %d batches in flight at once, want 1 or 2", n)
	}
	streams := leader.calls.get(gpuplanev1connect.ClusterServiceForwardProcedure)
	if streams == 0 || streams > len(followers) {
		t.Errorf("leader got %d Forward streams from %d followers", streams, len(followers))
	}
	t.Logf("%d forwarded writes in %d batches on %d streams", writers, batches, streams)

	// A stream outlives its writes; a later write uses it, and a server
	// shutting down ends it: the writes still waiting are retried.
	res, err := followers[0].c.Apply(ctx, accelerator("later"))
	if err != nil || res.GetCode() != pb.Code_CODE_OK {
		t.Fatalf("later write: %v, %v", res, err)
	}
	if n := leader.calls.get(gpuplanev1connect.ClusterServiceForwardProcedure); n != streams {
		t.Errorf("a later write opened a new stream (%d, was %d)", n, streams)
	}
}

// TestForwardFailover: the leader stops (its API, then its Raft, as an agent
// stops) while followers forward writes to it over their streams. The
// writes waiting on a stream that ends are retried, with their request ids,
// on the new leader: none fails, and every acknowledged one is in the new
// leader's state.
func TestForwardFailover(t *testing.T) {
	servers := startServers(t, 3, false)
	leader, followers := leaderOf(t, servers)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var mu sync.Mutex
	acked := map[string]bool{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				name := fmt.Sprintf("f%d-%d", w, i)
				res, err := followers[w%len(followers)].c.Apply(ctx, accelerator(name))
				if err == nil && res.GetCode() != pb.Code_CODE_OK {
					err = errors.New(res.GetMessage())
				}
				if err != nil {
					t.Errorf("write %s: %v", name, err)
					return
				}
				mu.Lock()
				acked[name] = true
				mu.Unlock()
			}
		})
	}
	time.Sleep(300 * time.Millisecond)
	leader.stop()
	newLeader, _ := leaderOf(t, followers)
	time.Sleep(300 * time.Millisecond) // writes go on through the new leader
	close(stop)
	wg.Wait()
	if t.Failed() {
		return
	}
	var missing []string
	if err := newLeader.c.Read(ctx, false, func(f *fsm.FSM) error {
		for name := range acked {
			if _, ok := f.Accelerator(name); !ok {
				missing = append(missing, name)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(missing) > 0 {
		t.Fatalf("%d of %d acknowledged writes missing after failover, e.g. %v", len(missing), len(acked), missing[0])
	}
	t.Logf("%d writes acknowledged across the failover", len(acked))
}

// TestForwardToServerWithoutBatch: a leader that answers Unimplemented to
// Forward (a version from before it) still gets every write, one by one.
func TestForwardToServerWithoutBatch(t *testing.T) {
	servers := startServers(t, 3, false)
	leader, followers := leaderOf(t, servers)
	leader.calls.refuse.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, 20)
	for i := range errs {
		wg.Go(func() {
			res, err := followers[0].c.Apply(ctx, accelerator(fmt.Sprintf("old-%d", i)))
			if err == nil && res.GetCode() != pb.Code_CODE_OK {
				err = errors.New(res.GetMessage())
			}
			errs[i] = err
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if n := leader.calls.get(gpuplanev1connect.ClusterServiceApplyProcedure); n < len(errs) {
		t.Fatalf("leader got %d single Apply calls for %d writes", n, len(errs))
	}
}

// TestForwardNeedsNode: with ACLs on, Forward is node traffic, like Apply:
// forwarded entries carry their original actor, which a user must not be
// able to set.
func TestForwardNeedsNode(t *testing.T) {
	if a, b := rpc.ProcedureAccess(gpuplanev1connect.ClusterServiceForwardProcedure),
		rpc.ProcedureAccess(gpuplanev1connect.ClusterServiceApplyProcedure); a != rpc.AccessNode || a != b {
		t.Fatalf("Forward needs %v, Apply %v", a, b)
	}
	servers := startServers(t, 3, true)
	leader, followers := leaderOf(t, servers)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	base := rpc.BaseURL(leader.api)

	boot, err := gpuplanev1connect.NewACLServiceClient(rpc.HTTPClient(), base).Bootstrap(ctx, connect.NewRequest(&pb.BootstrapRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	forge := func(token string) error {
		stream := gpuplanev1connect.NewClusterServiceClient(rpc.HTTPClient(), base).Forward(ctx)
		if token != "" {
			stream.RequestHeader().Set("Authorization", "Bearer "+token)
		}
		if err := stream.Send(&pb.ForwardRequest{Batch: 1, Envelopes: []*pb.Envelope{accelerator("forged")}}); err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		_, err := stream.Receive()
		return err
	}
	if err := forge(""); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("without a token: %v", err)
	}
	if err := forge(boot.Msg.GetSecret()); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("with an admin token: %v", err)
	}
	// Nodes forward with the agent token.
	res, err := followers[0].c.Apply(ctx, accelerator("by-node"))
	if err != nil || res.GetCode() != pb.Code_CODE_OK {
		t.Fatalf("forwarded write: %v, %v", res, err)
	}
	if leader.calls.get(batchesProc) == 0 {
		t.Fatal("the forwarded write did not go over a Forward stream")
	}
	var found bool
	leader.c.View(func(f *fsm.FSM) { _, found = f.Accelerator("forged") })
	if found {
		t.Fatal("a forged forward was applied")
	}
}

// stubBackend answers Apply from a function; everything else is unused.
type stubBackend struct {
	rpc.Backend
	apply func(*pb.Envelope) (*pb.Result, error)
}

func (b stubBackend) Apply(_ context.Context, env *pb.Envelope) (*pb.Result, error) {
	return b.apply(env)
}

// TestForwardErrors: each entry's error travels back to its own writer,
// and a leadership error stays retryable (ErrNotLeader) as with Apply.
func TestForwardErrors(t *testing.T) {
	srv, err := rpc.Listen("127.0.0.1:0", rpc.Config{Backend: stubBackend{apply: func(env *pb.Envelope) (*pb.Result, error) {
		switch env.GetRequestId() {
		case "deposed":
			return nil, fmt.Errorf("%w: stepped down", cluster.ErrNotLeader)
		case "slow":
			return nil, context.DeadlineExceeded
		}
		return &pb.Result{Code: pb.Code_CODE_OK, Index: 7}, nil
	}}})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve()
	defer shutdown(srv)
	fw := &rpc.Forwarder{HTTP: rpc.HTTPClient(), Resolve: func(string) (string, bool) { return srv.Addr().String(), true }}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	var wg sync.WaitGroup
	ids := []string{"ok-1", "deposed", "slow", "ok-2"}
	results := make([]*pb.Result, len(ids))
	errs := make([]error, len(ids))
	for i, id := range ids {
		wg.Go(func() {
			results[i], errs[i] = fw.Forward(ctx, "leader", &pb.Envelope{RequestId: id, Command: accelerator("x").Command}, cluster.ForwardApply)
		})
	}
	wg.Wait()
	for i, id := range ids {
		switch id {
		case "deposed":
			if !errors.Is(errs[i], cluster.ErrNotLeader) {
				t.Errorf("%s: %v, want ErrNotLeader", id, errs[i])
			}
		case "slow":
			if connect.CodeOf(errs[i]) != connect.CodeDeadlineExceeded || errors.Is(errs[i], cluster.ErrNotLeader) {
				t.Errorf("%s: %v, want DeadlineExceeded", id, errs[i])
			}
		default:
			if errs[i] != nil || results[i].GetIndex() != 7 {
				t.Errorf("%s: %v, %v", id, results[i], errs[i])
			}
		}
	}
}

// TestForwardProposeOneHop: a user's write through a follower (check, then
// apply unless refused or unchanged) reaches the leader as one
// ClusterService.Apply call, not a dry run and then a write, and a repeat
// that changes nothing appends nothing.
func TestForwardProposeOneHop(t *testing.T) {
	servers := startServers(t, 3, false)
	leader, followers := leaderOf(t, servers)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	accels := gpuplanev1connect.NewAcceleratorServiceClient(rpc.HTTPClient(), "http://"+followers[0].api)
	before := leader.calls.get(gpuplanev1connect.ClusterServiceApplyProcedure)
	batches := leader.calls.get(batchesProc)
	var outcomes []pb.Outcome
	for range 2 {
		resp, err := accels.CreateAccelerator(ctx, connect.NewRequest(&pb.CreateAcceleratorRequest{
			Name: "one-hop", Spec: &pb.AcceleratorSpec{Device: "l4"}, Upsert: true}))
		if err != nil {
			t.Fatal(err)
		}
		outcomes = append(outcomes, resp.Msg.GetOutcome())
	}
	if outcomes[0] != pb.Outcome_OUTCOME_CREATED || outcomes[1] != pb.Outcome_OUTCOME_UNCHANGED {
		t.Fatalf("outcomes %v, want created then unchanged", outcomes)
	}
	if n := leader.calls.get(gpuplanev1connect.ClusterServiceApplyProcedure) - before; n != 2 {
		t.Fatalf("the leader got %d ClusterService.Apply calls for two writes, want 2 (one each)", n)
	}
	if n := leader.calls.get(batchesProc) - batches; n != 0 {
		t.Fatalf("the leader got %d Forward batches besides: the writes took two hops", n)
	}
	h, err := audit.Live(leader.c)
	if err != nil {
		t.Fatal(err)
	}
	entries := 0
	err = h.Log(&pb.LogRequest{FromIndex: 1, Filter: &pb.EventFilter{Resource: "accelerator/one-hop"}}, leader.c.AppliedIndex(),
		func(*pb.Event) error { entries++; return nil })
	if err != nil {
		t.Fatal(err)
	}
	if entries != 1 {
		t.Fatalf("the log holds %d entries about accelerator/one-hop, want 1 (none for the unchanged repeat)", entries)
	}
}
