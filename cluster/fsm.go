package cluster

import (
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/gpuplane/gpuplane/cluster/auditrec"
	"github.com/gpuplane/gpuplane/fsm"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// raftFSM feeds committed log entries to the pure state machine. It decodes
// nothing itself: fsm.ApplyBytes owns the entry format, so live apply, restore
// and offline replay run the same code.
//
// It also keeps the applied index waiters need: the index of the last entry
// raft handed to the FSM (commands and configuration changes). Raft's own
// AppliedIndex is advanced when an entry is dispatched, before the FSM has
// applied it, so it cannot tell a reader that the state is current.
type raftFSM struct {
	mu    sync.RWMutex // guards state; fsm.FSM is not safe for concurrent use
	state *fsm.FSM
	// hashes records the hash head after each applied command entry, for
	// audit verify (package auditrec); nil records nothing.
	hashes *auditrec.Hashes
	// window is the state machine's request window after the last batch,
	// read without the lock by the leader when it proposes (propose).
	window atomic.Int64

	// applied, guarded by amu, only grows, except on Restore. advanced is
	// closed and replaced whenever it changes.
	amu      sync.Mutex
	applied  uint64
	advanced chan struct{}
}

var _ raft.BatchingFSM = (*raftFSM)(nil)

func newRaftFSM() *raftFSM {
	w := &raftFSM{state: fsm.New(), advanced: make(chan struct{})}
	w.window.Store(int64(fsm.DefaultRequestWindow))
	return w
}

// requestWindow is the state machine's request window as of the last batch.
func (w *raftFSM) requestWindow() time.Duration { return time.Duration(w.window.Load()) }

// ApplyBatch applies a batch of committed entries under one write lock; raft
// hands it up to MaxAppendEntries entries at a time.
func (w *raftFSM) ApplyBatch(logs []*raft.Log) []any {
	out := make([]any, len(logs))
	if len(logs) == 0 {
		return out
	}
	w.mu.Lock()
	for i, l := range logs {
		if l.Type == raft.LogCommand {
			out[i] = w.state.ApplyBytes(l.Index, l.Data)
			w.hashes.Add(l.Index, w.state.Head())
		}
	}
	// Under the lock, so that a reader that sees the state at an index also
	// finds its record (audit verify compares the two).
	w.hashes.Flush()
	w.window.Store(int64(w.state.RequestWindow()))
	w.mu.Unlock()
	w.advance(logs[len(logs)-1].Index)
	return out
}

// Apply applies one committed entry.
func (w *raftFSM) Apply(l *raft.Log) any { return w.ApplyBatch([]*raft.Log{l})[0] }

// Snapshot captures the state's bytes under the read lock. The state is small
// (nodes, accelerators, placements), so encoding it here is cheaper than the
// copy-on-write bookkeeping needed to encode it later in Persist.
func (w *raftFSM) Snapshot() (raft.FSMSnapshot, error) {
	w.mu.RLock()
	defer w.mu.RUnlock()
	data, err := w.state.Snapshot()
	if err != nil {
		return nil, fmt.Errorf("snapshot state at %d: %w", w.state.AppliedIndex(), err)
	}
	return fsmSnapshot(data), nil
}

// Restore replaces the state with a snapshot: at start-up from the latest
// local snapshot, or when the leader installs one on a follower.
func (w *raftFSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	// Decoded as it is read: a snapshot is mostly applied requests, and
	// reading tens of megabytes into one buffer first costs as much again.
	next := fsm.New()
	if err := next.RestoreFrom(rc); err != nil {
		return err
	}
	w.mu.Lock()
	w.state = next
	w.window.Store(int64(next.RequestWindow()))
	w.mu.Unlock()
	w.set(next.AppliedIndex())
	return nil
}

func (w *raftFSM) advance(index uint64) {
	w.amu.Lock()
	defer w.amu.Unlock()
	if index > w.applied {
		w.applied = index
		close(w.advanced)
		w.advanced = make(chan struct{})
	}
}

func (w *raftFSM) set(index uint64) {
	w.amu.Lock()
	defer w.amu.Unlock()
	w.applied = index
	close(w.advanced)
	w.advanced = make(chan struct{})
}

// progress returns the applied index and a channel closed when it changes.
func (w *raftFSM) progress() (uint64, <-chan struct{}) {
	w.amu.Lock()
	defer w.amu.Unlock()
	return w.applied, w.advanced
}

func (w *raftFSM) view(fn func(*fsm.FSM)) {
	w.mu.RLock()
	defer w.mu.RUnlock()
	fn(w.state)
}

type fsmSnapshot []byte

func (s fsmSnapshot) Persist(sink raft.SnapshotSink) error {
	if _, err := sink.Write(s); err != nil {
		sink.Cancel()
		return fmt.Errorf("write snapshot: %w", err)
	}
	return sink.Close()
}

func (fsmSnapshot) Release() {}

// result turns an FSM response into the caller's copy.
func result(resp any) (*pb.Result, error) {
	res, ok := resp.(*pb.Result)
	if !ok || res == nil {
		return nil, fmt.Errorf("state machine returned %T, want *Result", resp)
	}
	return res, nil
}
