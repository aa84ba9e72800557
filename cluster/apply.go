package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/gpuplane/gpuplane/fsm"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// ErrNoLeader is returned when no leader was elected within the time a
// request may wait for one (a few seconds, or less if its context ends
// sooner); the cluster has probably lost its quorum.
var ErrNoLeader = errors.New("no cluster leader")

// ErrNotLeader is returned when a request that only the leader can serve
// reached a node that is not, or no longer, the leader. Apply, DryRun and Read
// retry it against the new leader; a Forwarder wraps it to ask for that.
var ErrNotLeader = errors.New("node is not the cluster leader")

// ErrShutdown is returned for requests made after Shutdown, or cut short by it.
var ErrShutdown = errors.New("cluster is shut down")

// maxLeaderWait bounds how long a request waits, in total, for a leader to be
// elected or for one that is unreachable to be replaced. Elections on a LAN
// take about a second.
const maxLeaderWait = 5 * time.Second

// defaultTimeout bounds a request whose context has no deadline.
const defaultTimeout = 30 * time.Second

// Forwarder sends requests to the leader. The rpc layer implements it with
// the Connect ClusterService client, dialling the API address that node
// leaderID registered (Cluster.APIAddress); on the leader the handlers call
// Apply, DryRun and ReadIndex.
//
// Errors that wrap ErrNotLeader or ErrNoLeader are retried (bounded by the
// request's context and by a few seconds of leader wait); the rpc layer should
// wrap ErrNotLeader when the leader cannot be reached (Connect Unavailable)
// or answers that it is no longer the leader. Other errors end the request.
type Forwarder interface {
	// Forward has the leader apply, check or propose env (mode) and returns
	// the leader's result.
	Forward(ctx context.Context, leaderID string, env *pb.Envelope, mode ForwardMode) (*pb.Result, error)
	// ReadIndex returns the leader's ReadIndex: an index such that a state
	// that has applied it reflects every write committed before the call.
	ReadIndex(ctx context.Context, leaderID string) (uint64, error)
	// ReadState returns server serverID's whole state (fsm snapshot bytes),
	// read linearizably unless stale. Client nodes read this way.
	ReadState(ctx context.Context, serverID string, stale bool) ([]byte, error)
	// Status returns node id's Status.
	Status(ctx context.Context, id string) (*pb.StatusResponse, error)
	// RemovePeer asks the leader to remove server name from Raft.
	RemovePeer(ctx context.Context, leaderID, name string) error
	// LocalNode returns node id's description of itself, inventory included;
	// the leader registers nodes that gossip announced with it.
	LocalNode(ctx context.Context, id string) (*pb.Node, error)
}

// ForwardMode is what the leader does with a write a node forwards to it.
type ForwardMode int

const (
	// ForwardApply appends it (Apply).
	ForwardApply ForwardMode = iota
	// ForwardDryRun checks it and changes nothing (DryRun).
	ForwardDryRun
	// ForwardPropose checks it and appends it only when it passes and
	// changes something (Propose).
	ForwardPropose
)

// Apply proposes env to the replicated log and returns the state machine's
// result, with the entry's index. It fills the request id (random) and actor
// ("system") when empty; the leader stamps proposed_at with its clock. A
// follower forwards the request to the leader; while there is no leader it
// waits for one, up to a few seconds. A retry of a request id that was
// applied before returns the first result with duplicate set, so Apply may be
// retried safely after an error. env is not modified.
func (c *Cluster) Apply(ctx context.Context, env *pb.Envelope) (*pb.Result, error) {
	return c.write(ctx, env, ForwardApply)
}

// DryRun checks env against the leader's current state, as Apply would, and
// changes nothing.
func (c *Cluster) DryRun(ctx context.Context, env *pb.Envelope) (*pb.Result, error) {
	return c.write(ctx, env, ForwardDryRun)
}

// Propose is how a user's or a node's change reaches the log: env is checked
// first (DryRun: on the leader, and a refusal or a no-op on a state at least
// as new as a linearizable read's), and only a change that passes and changes
// something is applied. A refusal or a no-op is answered from the check with
// Index 0, and the log gets no entry for it: a rejected request changes
// nothing, and repeating a request that is already in effect (re-applying a
// descriptor, a node restarting with the same cards) adds nothing. The
// state machine checks the entry again when it is applied, so a change that
// raced in between is still decided in log order. A follower forwards the
// whole of it to the leader in one request (ForwardPropose).
func (c *Cluster) Propose(ctx context.Context, env *pb.Envelope) (*pb.Result, error) {
	return c.write(ctx, env, ForwardPropose)
}

// proposeLocal is Propose on this node, which believes it is the leader.
func (c *Cluster) proposeLocal(ctx context.Context, env *pb.Envelope) (*pb.Result, error) {
	res, err := c.dryRunLocal(ctx, env)
	if err != nil {
		return nil, err
	}
	if !worthAnEntry(res) {
		res.Index = 0
		return res, nil
	}
	return c.applyLocal(ctx, env)
}

// worthAnEntry reports whether a check's result calls for a log entry: it
// passed and it changes something.
func worthAnEntry(check *pb.Result) bool {
	return check.GetCode() == pb.Code_CODE_OK && check.GetOutcome() != pb.Outcome_OUTCOME_UNCHANGED
}

// prepare returns the caller's envelope as it is proposed: a copy, with a
// request id and actor; or, for an envelope that must not reach the log, the
// result that rejects it.
func prepare(env *pb.Envelope) (*pb.Envelope, *pb.Result) {
	if env.GetCommand() == nil {
		// Reject before it costs a log entry. A command unknown to this version
		// decodes as no command at all.
		return nil, &pb.Result{Code: pb.Code_CODE_INVALID_ARGUMENT,
			Message: "envelope has no command this server knows: is the client newer than the server?"}
	}
	// A new envelope, since propose sets its time, that shares the command:
	// nothing on the write path changes a command. Unknown fields are left
	// out: this server could not say what they mean.
	out := &pb.Envelope{RequestId: env.RequestId, Actor: env.Actor, ProposedAt: env.ProposedAt, Command: env.Command}
	if out.RequestId == "" {
		out.RequestId = NewRequestID()
	}
	if out.Actor == "" {
		out.Actor = "system"
	}
	return out, nil
}

func (c *Cluster) write(ctx context.Context, env *pb.Envelope, mode ForwardMode) (*pb.Result, error) {
	env, rejected := prepare(env)
	if rejected != nil {
		return rejected, nil
	}
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	return c.writePrepared(ctx, env, mode)
}

// writePrepared is write for an envelope prepare returned, under a context
// with a deadline.
func (c *Cluster) writePrepared(ctx context.Context, env *pb.Envelope, mode ForwardMode) (*pb.Result, error) {
	return onLeader(ctx, c,
		func() (*pb.Result, error) {
			switch mode {
			case ForwardDryRun:
				return c.dryRunLocal(ctx, env)
			case ForwardPropose:
				return c.proposeLocal(ctx, env)
			}
			return c.applyLocal(ctx, env)
		},
		func(f Forwarder, leader string) (*pb.Result, error) { return f.Forward(ctx, leader, env, mode) })
}

// applyLocal proposes env on this node, which believes it is the leader.
func (c *Cluster) applyLocal(ctx context.Context, env *pb.Envelope) (*pb.Result, error) {
	f, err := c.propose(ctx, env)
	if err != nil {
		return nil, err
	}
	if err := wait(ctx, f); err != nil {
		return nil, c.raftError(err)
	}
	return futureResult(f)
}

// propose stamps env with this leader's clock and hands it to Raft. Raft
// gathers what is proposed while it writes the previous batch into one log
// append (BatchApplyCh).
func (c *Cluster) propose(ctx context.Context, env *pb.Envelope) (raft.ApplyFuture, error) {
	env.ProposedAt = timestamppb.Now()
	// The window this server is configured with reaches the state machine
	// through the log (Config.RequestWindow): on its first proposal of a
	// term (a new leader's state machine may not have applied the entries
	// before it yet, so the window it holds says nothing), and whenever the
	// state machine's differs. The entries in flight until one is applied
	// all carry it, which is harmless.
	env.RequestWindow = nil
	w := c.cfg.RequestWindow
	if term := c.raft.CurrentTerm(); c.windowTerm.Swap(term) != term || w != c.fsm.requestWindow() {
		env.RequestWindow = durationpb.New(w)
	}
	data, err := fsm.Marshal(env)
	if err != nil {
		return nil, fmt.Errorf("encode %s: %w", env.RequestId, err)
	}
	// A write the log would refuse (the disk is full) is refused here:
	// in the log, the failed append would make Raft step this leader down.
	// Another server may have room: leadership goes to it, and the write
	// is retried there.
	if err := c.store.Admit(len(data)); err != nil {
		if c.handOver(err) {
			return nil, fmt.Errorf("%w: %v", ErrNotLeader, err)
		}
		return nil, err
	}
	timeout := time.Until(deadline(ctx))
	if timeout <= 0 {
		return nil, context.DeadlineExceeded
	}
	return c.raft.Apply(data, timeout), nil
}

// handOver asks Raft to hand this leader's leadership to another voter,
// because its log refuses writes (why), and reports whether there is one.
// A single server keeps leading: it still serves reads.
func (c *Cluster) handOver(why error) bool {
	f := c.raft.GetConfiguration()
	if f.Error() != nil {
		return false
	}
	others := 0
	for _, s := range f.Configuration().Servers {
		if s.Suffrage == raft.Voter && string(s.ID) != c.cfg.NodeName {
			others++
		}
	}
	if others == 0 {
		return false
	}
	now := time.Now().UnixNano()
	if last := c.handedOver.Load(); now-last > int64(time.Second) && c.handedOver.CompareAndSwap(last, now) {
		c.log.Warn("this server's raft log refuses writes; handing leadership to another server", "error", why)
		c.raft.LeadershipTransfer() // its outcome shows as a new leader, or this one again
	}
	return true
}

// futureResult is the state machine's result for a committed entry.
func futureResult(f raft.ApplyFuture) (*pb.Result, error) {
	res, err := result(f.Response())
	if err != nil {
		return nil, err
	}
	if res.Index == 0 {
		res.Index = f.Index()
	}
	return res, nil
}

// ApplyBatch applies each of envs as Apply would and returns, in order, a
// result or an error for each (one of the two is set). It serves the writes
// a follower forwards in one call: on the leader they are all proposed
// before any is waited for, so that Raft appends them together (one fsync,
// one AppendEntries per follower). An entry whose proposal fails for a
// leadership change, like every entry on a node that is not the leader, goes
// through Apply, which forwards it and retries as for a single write.
func (c *Cluster) ApplyBatch(ctx context.Context, envs []*pb.Envelope) ([]*pb.Result, []error) {
	results := make([]*pb.Result, len(envs))
	errs := make([]error, len(envs))
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	prepared := make([]*pb.Envelope, len(envs))
	for i, env := range envs {
		prepared[i], results[i] = prepare(env)
	}
	var slow []int // entries written one by one, through onLeader
	if c.IsLeader() {
		futures := make([]raft.ApplyFuture, len(envs))
		for i, env := range prepared {
			if env == nil {
				continue
			}
			if futures[i], errs[i] = c.propose(ctx, env); errs[i] != nil {
				futures[i] = nil
			}
		}
		n := len(futures)
		w := waitAll(futures)
		select {
		case <-w.done:
		case <-ctx.Done():
			n = w.resolved()
		}
		for i, f := range futures[:n] {
			if f == nil {
				continue
			}
			if err := f.Error(); err != nil {
				if err = c.raftError(err); retryable(err) {
					slow = append(slow, i)
				} else {
					errs[i] = err
				}
				continue
			}
			results[i], errs[i] = futureResult(f)
		}
		if n < len(futures) {
			for i, f := range futures {
				if f != nil && results[i] == nil && errs[i] == nil {
					errs[i] = ctx.Err()
				}
			}
			return results, errs
		}
	} else {
		for i, env := range prepared {
			if env != nil {
				slow = append(slow, i)
			}
		}
	}
	var wg sync.WaitGroup
	for _, i := range slow {
		wg.Go(func() { results[i], errs[i] = c.writePrepared(ctx, prepared[i], ForwardApply) })
	}
	wg.Wait()
	return results, errs
}

// futuresWait is waitAll's progress.
type futuresWait struct {
	done chan struct{} // closed once every future is resolved
	n    atomic.Int64  // the futures before this position are resolved
}

// resolved returns how many futures, from the first, are resolved.
func (w *futuresWait) resolved() int { return int(w.n.Load()) }

// waitAll waits for futures (nil ones are skipped) from one goroutine, in
// order, and wakes the caller once, when all are resolved: raft resolves
// a batch's futures one by one as it applies them, and handing each to the
// caller as it came woke the two goroutines in turn once per entry.
func waitAll(futures []raft.ApplyFuture) *futuresWait {
	w := &futuresWait{done: make(chan struct{})}
	go func() {
		for i, f := range futures {
			if f != nil {
				_ = f.Error()
			}
			w.n.Store(int64(i + 1))
		}
		close(w.done)
	}()
	return w
}

// dryRunLocal checks env against the leader's state. A check that passes is
// answered from the applied state at once: the entry goes to the log next,
// and the state machine checks it again when it is applied, so a stale
// answer there costs nothing. A rejection or a no-op, though, is the final
// answer the caller gets, and a stale one breaks linearizability: a new
// leader that has not yet applied what its predecessor acknowledged would
// answer "not found" for a deployment a client has just created (jepsen seed
// 585091768 caught exactly that). Those answers are therefore checked again
// on a state at least as new as a linearizable read's (ReadIndex: one
// heartbeat round, and a barrier once per term).
func (c *Cluster) dryRunLocal(ctx context.Context, env *pb.Envelope) (*pb.Result, error) {
	var res *pb.Result
	c.View(func(f *fsm.FSM) { res = f.DryRun(env) })
	if worthAnEntry(res) {
		return res, nil
	}
	idx, err := c.ReadIndex(ctx)
	if err != nil {
		return nil, err
	}
	if err := c.WaitApplied(ctx, idx); err != nil {
		return nil, err
	}
	c.View(func(f *fsm.FSM) { res = f.DryRun(env) })
	return res, nil
}

// onLeader runs local when this node leads, or forward to the leader, and
// retries while leadership is moving. Retrying a write is safe: its request
// id makes a second application a no-op that returns the first result.
func onLeader[T any](ctx context.Context, c *Cluster, local func() (T, error), forward func(Forwarder, string) (T, error)) (T, error) {
	var zero T
	start := time.Now()
	// Not backoff.Retry: the wait between attempts ends early when the
	// leader changes (waitLeaderChange), which a timer-driven retry cannot do.
	wait := &backoff.ExponentialBackOff{InitialInterval: 10 * time.Millisecond, Multiplier: 2, MaxInterval: 200 * time.Millisecond}
	wait.Reset()
	var lastErr error
	for {
		var (
			v   T
			err error
		)
		leader, _ := c.Leader()
		switch {
		case c.raft == nil && c.mem.isStopped():
			return zero, ErrShutdown
		case c.raft == nil:
			// A client node runs no Raft: any server takes the request and
			// forwards it to the leader.
			if leader = c.pickServer(); leader == "" {
				err = ErrNoLeader
			} else if c.getForwarder() == nil {
				return zero, fmt.Errorf("%w: this client node has no forwarder", ErrNotLeader)
			} else if v, err = forward(c.getForwarder(), leader); err != nil {
				if !retryable(err) {
					return zero, fmt.Errorf("forward to server %s: %w", leader, err)
				}
				c.mem.unreachable(leader)
			}
		case c.raft.State() == raft.Shutdown:
			return zero, ErrShutdown
		case c.IsLeader():
			v, err = local()
		case leader == "":
			err = ErrNoLeader
		case c.getForwarder() == nil:
			return zero, fmt.Errorf("%w: %s is the leader and this node has no forwarder", ErrNotLeader, leader)
		default:
			v, err = forward(c.getForwarder(), leader)
			if err != nil && !retryable(err) {
				return zero, fmt.Errorf("forward to leader %s: %w", leader, err)
			}
		}
		if err == nil {
			return v, nil
		}
		if !retryable(err) {
			return zero, err
		}
		lastErr = err
		if ctx.Err() != nil || time.Since(start) > maxLeaderWait {
			return zero, c.noLeader(ctx, lastErr)
		}
		if !waitLeaderChange(ctx, c, leader, wait.NextBackOff()) {
			return zero, c.noLeader(ctx, lastErr)
		}
	}
}

// leaderPoll is how often a request waiting out a backoff checks whether
// the leader changed: a retry then goes at once to the new leader instead of
// sleeping out the rest of the backoff (up to 200ms, a fifth of a failover).
const leaderPoll = 5 * time.Millisecond

// waitLeaderChange waits for d, or until the leader this node knows differs
// from failed (elected, or a new one known), whichever comes first. It
// returns false when ctx ended.
func waitLeaderChange(ctx context.Context, c *Cluster, failed string, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	poll := time.NewTicker(leaderPoll)
	defer poll.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			return true
		case <-poll.C:
			if c.raft == nil {
				continue // a client node picks a server; nothing to watch
			}
			if now, _ := c.Leader(); now != "" && now != failed {
				return true
			}
		}
	}
}

func (c *Cluster) noLeader(ctx context.Context, last error) error {
	if errors.Is(last, ErrNoLeader) {
		last = nil
	}
	return errors.Join(fmt.Errorf("%w after waiting for one%s", ErrNoLeader, c.unformedHint()), last, ctx.Err())
}

// unformedHint says how to form the cluster when this node is a server that
// is in none yet (its Raft configuration names no server): without it a
// server started with neither --dev, --bootstrap-expect nor --join answers
// every request with a bare "no cluster leader".
func (c *Cluster) unformedHint() string {
	if c.raft == nil {
		return ""
	}
	f := c.raft.GetConfiguration()
	if f.Error() != nil || len(f.Configuration().Servers) > 0 {
		return ""
	}
	if n := c.cfg.BootstrapExpect; n > 0 {
		return fmt.Sprintf(": this server has formed no cluster yet: it waits for %d servers (--bootstrap-expect) to find each other; join the others with 'gpuplane cluster join ADDR' or --join", n)
	}
	return ": this server has formed no cluster yet: join one with 'gpuplane cluster join ADDR' (or --join), or start the servers with --bootstrap-expect N (--bootstrap-expect 1 or --dev for a single server)"
}

func retryable(err error) bool {
	return errors.Is(err, ErrNotLeader) || errors.Is(err, ErrNoLeader)
}

// raftError maps raft's errors to this package's. Leadership errors become
// ErrNotLeader so that onLeader retries them; ErrLeadershipLost means the
// entry may or may not commit, which the request id makes safe to retry.
func (c *Cluster) raftError(err error) error {
	switch {
	case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipLost),
		errors.Is(err, raft.ErrLeadershipTransferInProgress), errors.Is(err, raft.ErrAbortedByRestore):
		return fmt.Errorf("%w: %w", ErrNotLeader, err)
	case errors.Is(err, raft.ErrRaftShutdown):
		return ErrShutdown
	case errors.Is(err, raft.ErrEnqueueTimeout):
		return fmt.Errorf("raft apply queue: %w", context.DeadlineExceeded)
	}
	return err
}

// wait waits for a raft future, or for ctx. Raft futures cannot be
// cancelled: an entry proposed before ctx ended may still commit.
func wait(ctx context.Context, f raft.Future) error {
	done := make(chan error, 1)
	go func() { done <- f.Error() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func deadline(ctx context.Context) time.Time {
	if d, ok := ctx.Deadline(); ok {
		return d
	}
	return time.Now().Add(defaultTimeout)
}

// withDefaultTimeout bounds ctx by defaultTimeout unless it has a deadline
// already: then it is returned as it is (every caller waits for what it
// starts, so there is nothing to cancel; a derived context would cost every
// API write an allocation and a registration with its parent).
func withDefaultTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, defaultTimeout)
}

// NewRequestID returns a random 128-bit request id in hex.
func NewRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b[:])
}
