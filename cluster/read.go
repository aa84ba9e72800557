package cluster

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/raft"

	"github.com/gpuplane/gpuplane/fsm"
)

// Read calls fn with the state under the read lock. With stale it reads the
// local state at once. Otherwise the read is linearizable: it reflects every
// write acknowledged before Read was called, on any node. This node obtains a
// read index from the leader (itself or, forwarded, another server) and waits
// until its own state has applied it. fn must not keep the *fsm.FSM or call
// into the Cluster.
func (c *Cluster) Read(ctx context.Context, stale bool, fn func(*fsm.FSM) error) error {
	if c.raft == nil {
		return c.readViaServer(ctx, stale, fn)
	}
	if !stale {
		ctx, cancel := withDefaultTimeout(ctx)
		defer cancel()
		idx, err := onLeader(ctx, c,
			func() (uint64, error) { return c.ReadIndex(ctx) },
			func(f Forwarder, leader string) (uint64, error) { return f.ReadIndex(ctx, leader) })
		if err != nil && retryable(err) {
			if why := c.store.Refusing(); why != nil {
				return fmt.Errorf("%w: this server's raft log refuses writes (%v), and a linearizable read needs the leader to commit an entry of its own first; read with --stale for this server's state", err, why)
			}
		}
		if err != nil {
			return err
		}
		if err := c.WaitApplied(ctx, idx); err != nil {
			return err
		}
	}
	var err error
	c.View(func(f *fsm.FSM) { err = fn(f) })
	return err
}

// ReadIndex is the leader's half of a linearizable read (Raft thesis §6.4):
// its commit index, once it has committed an entry in its current term and
// has confirmed with a quorum that it still leads. Any state that has applied
// the returned index reflects every write committed before the call. It
// returns ErrNotLeader on a follower.
//
// VerifyLeader costs one heartbeat round and writes nothing, so reads do not
// grow the never-compacted log. The once-per-term barrier is needed because a
// new leader's commit index can trail entries its predecessor committed until
// it commits one of its own.
func (c *Cluster) ReadIndex(ctx context.Context) (uint64, error) {
	if !c.IsLeader() {
		return 0, ErrNotLeader
	}
	if term := c.raft.CurrentTerm(); c.barrierTerm.Load() != term {
		timeout := time.Until(deadline(ctx))
		if err := wait(ctx, c.raft.Barrier(timeout)); err != nil {
			return 0, c.raftError(err)
		}
		c.barrierTerm.Store(term)
	}
	idx := c.raft.CommitIndex()
	if err := wait(ctx, c.raft.VerifyLeader()); err != nil {
		return 0, c.raftError(err)
	}
	return idx, nil
}

// WaitApplied blocks until the local state reflects every log entry up to
// index, or ctx ends. Entries that do not change the state (the no-op each
// new leader writes, barriers) count as applied once raft has passed them.
func (c *Cluster) WaitApplied(ctx context.Context, index uint64) error {
	if c.raft == nil {
		// A client never applies anything; waiting out ctx keeps a caller's
		// wait-for-the-next-entry loop from spinning.
		<-ctx.Done()
		return errClientNoState
	}
	// The state machine wakes waiters when it applies an entry; entries it
	// never sees (no-ops, barriers) are noticed by polling.
	poll := time.NewTicker(5 * time.Millisecond)
	defer poll.Stop()
	for {
		applied, advanced := c.fsm.progress()
		if applied >= index || c.caughtUp(applied, index) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for index %d (applied %d): %w", index, applied, ctx.Err())
		case <-advanced:
		case <-poll.C:
			if c.raft.State() == raft.Shutdown {
				return ErrShutdown
			}
		}
	}
}

// caughtUp reports whether every entry in (applied, index] that the state
// machine would see has been applied, although the state machine's own index
// stops at applied: raft has dispatched them all, and none is a command or a
// configuration change. It then records index as applied.
func (c *Cluster) caughtUp(applied, index uint64) bool {
	if c.raft.AppliedIndex() < index {
		return false
	}
	var l raft.Log
	for i := applied + 1; i <= index; i++ {
		err := c.store.GetLog(i, &l)
		if errors.Is(err, raft.ErrLogNotFound) {
			continue // covered by a snapshot this node restored
		}
		if err != nil || l.Type == raft.LogCommand || l.Type == raft.LogConfiguration {
			return false
		}
	}
	c.fsm.advance(index)
	return true
}

// Progress returns the applied index and a channel closed when it next
// changes: what event streams wait on.
func (c *Cluster) Progress() (uint64, <-chan struct{}) { return c.fsm.progress() }
