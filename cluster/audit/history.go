package audit

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/gpuplane/gpuplane/cluster/auditrec"
	"github.com/gpuplane/gpuplane/cluster/events"
	"github.com/gpuplane/gpuplane/fsm"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// History is a node's Raft log read for audit (docs/audit.md): its events, the
// state as of any entry, and verification of the log against what the state
// machine recorded when it applied it. A live node's History reads its store
// while it runs (Live); a stopped node's is OpenOffline's. Every replay goes
// through an events.Cursor, so through fsm.ApplyBytes: nothing about applying
// entries is implemented twice.
type History struct {
	files events.LogFiles
}

// Server is what audit reads of a running server (*cluster.Cluster): its
// log and records, and its live state.
type Server interface {
	NodeName() string
	// LogFiles is the server's log and audit records; cluster.ErrNoLog on
	// a client node.
	LogFiles() (events.LogFiles, error)
	// View calls fn with the live state, under the state machine's lock.
	View(fn func(*fsm.FSM))
	AppliedIndex() uint64
}

// Live returns a running server's log for audit. Callers bound what they
// read by the applied index: entries after it may not be committed yet.
func Live(s Server) (*History, error) {
	files, err := s.LogFiles()
	if err != nil {
		return nil, err
	}
	return &History{files: files}, nil
}

// head returns s's applied index and the hash chain head there, read
// together.
func head(s Server) (uint64, string) {
	var (
		index uint64
		hash  string
	)
	s.View(func(f *fsm.FSM) { index, hash = f.AppliedIndex(), f.Hash() })
	return index, hash
}

// LastIndex is the index of the last entry in the log.
func (h *History) LastIndex() (uint64, error) { return h.files.Log.LastIndex() }

// Cursor returns a cursor over the log; see Cursor.
func (h *History) Cursor(from uint64, filter *pb.EventFilter) *events.Cursor {
	return h.files.Cursor(from, filter)
}

// StateAt replays the log from index 1 through index and returns the state
// as it was after that entry (index 0: the empty state).
func (h *History) StateAt(index uint64) (*fsm.FSM, error) { return h.files.StateAt(index) }

// IndexAt returns the index of the last entry, up to upTo, that precedes the
// first entry proposed after t; 0 when the first entry already was. Leaders'
// clocks may differ a little, so this cuts the log where time first passes t
// rather than picking entries out of order: the state as of the result is
// one the cluster really was in.
//
// On a log compacted after an archive the search starts at the audit base;
// a time before the first entry after it is ErrCompacted: the archive has
// the answer (Archive.IndexAt).
func (h *History) IndexAt(t time.Time, upTo uint64) (uint64, error) {
	cur := h.Cursor(1, nil)
	base, err := cur.StartAtBase()
	if err != nil {
		return 0, err
	}
	at := base
	err = cur.Advance(upTo, func(ev *pb.Event) error {
		if ev.ProposedAt != nil && ev.ProposedAt.AsTime().After(t) {
			return errStop
		}
		at = ev.Index
		return nil
	})
	if err != nil && err != errStop {
		return 0, err
	}
	if base > 0 && at == base {
		return 0, fmt.Errorf("%w: %s is before the first entry this server holds after its compaction at %d: replay it from the archive (--archive DIR)", events.ErrCompacted, t.Format(time.RFC3339), base)
	}
	return at, nil
}

var errStop = fmt.Errorf("stop")

// liveHead is a running server's state as of one index, read atomically.
type liveHead struct {
	index uint64
	hash  string
	state *pb.State
}

// verifyReport collects what Verify finds.
type verifyReport struct {
	*pb.ServerVerification
}

func (r *verifyReport) fail(index uint64, format string, args ...any) {
	r.Ok = false
	r.Problems = append(r.Problems, fmt.Sprintf(format, args...))
	if index != 0 && (r.FirstDivergence == 0 || index < r.FirstDivergence) {
		r.FirstDivergence = index
	}
}

// Verify replays the log from index 1 through upTo into a fresh state
// machine and checks it against everything recorded about it:
//
//   - every entry's replayed hash head against the head the live state
//     machine recorded when it applied that entry (the hashes file), which
//     names the first entry altered after it was applied;
//   - the hash and the whole state stored in each snapshot at its index;
//   - with live, the running server's hash and state at live.index.
//
// A snapshot or live mismatch without a per-entry record to narrow it is
// reported at the snapshot's (or live) index: the log parts from it there
// or before.
func (h *History) Verify(upTo uint64, live *liveHead) (*pb.ServerVerification, error) {
	r := &verifyReport{&pb.ServerVerification{Ok: true}}
	snaps, err := auditrec.ReadSnapshots(h.files.SnapshotDir)
	if err != nil {
		return nil, err
	}
	type checkpoint struct {
		index uint64
		what  string
		hash  string
		state *pb.State
	}
	var checks []checkpoint
	for _, s := range snaps {
		if s.Err != nil {
			r.fail(0, "%v", s.Err)
			continue
		}
		if s.State.AppliedIndex > upTo {
			r.fail(0, "snapshot %s is at index %d, beyond the log's last entry %d: log entries are missing", s.ID, s.State.AppliedIndex, upTo)
			continue
		}
		checks = append(checks, checkpoint{s.State.AppliedIndex, "snapshot " + s.ID, s.State.Hash, s.State})
	}
	if live != nil {
		checks = append(checks, checkpoint{live.index, "the live state", live.hash, live.state})
	}
	slices.SortStableFunc(checks, func(a, b checkpoint) int { return int(a.index) - int(b.index) })

	cur := h.Cursor(1, nil)
	recorded := h.files.Hashes.Reader()
	// Entries were only recorded while the node ran; a record is checked
	// when present.
	lastGood := uint64(0)
	// A log compacted after an archive replays from its audit base, which
	// must hash as the entry it follows did when it was applied; what
	// precedes it is the archive's to verify (audit verify --archive).
	base, err := cur.StartAtBase()
	if err != nil {
		r.fail(1, "%v", err)
		return r.ServerVerification, nil
	}
	if base > 0 {
		var got string
		cur.View(func(f *fsm.FSM) { got = f.Hash() })
		if want, err := h.files.Hashes.At(base); err == nil && want != "" && want != got {
			r.fail(base, "the audit base at index %d has hash %s, but entry %d hashed to %s when it was applied: the base was altered", base, auditrec.Short(got), base, auditrec.Short(want))
			return r.ServerVerification, nil
		}
		r.BaseIndex = base
		lastGood = base
		checks = slices.DeleteFunc(checks, func(cp checkpoint) bool { return cp.index < base })
	}
	check := func(cp checkpoint) {
		var (
			hash  string
			state *pb.State
		)
		cur.View(func(f *fsm.FSM) {
			hash = f.Hash()
			if cp.state != nil {
				state = f.State()
			}
		})
		switch {
		case hash != cp.hash:
			r.fail(cp.index, "%s at index %d has hash %s, the replay %s: an entry in %d..%d differs from what was applied",
				cp.what, cp.index, auditrec.Short(cp.hash), auditrec.Short(hash), lastGood+1, cp.index)
		case cp.state != nil && !proto.Equal(state, cp.state):
			r.fail(cp.index, "%s at index %d: the replayed state differs although the hashes agree", cp.what, cp.index)
		default:
			lastGood = cp.index
		}
	}
	// Only hash heads are needed per entry, not events (AdvanceHeads): an
	// entry is described only when it is reported.
	perEntry := func(index uint64, command bool, hash string, describe func() string) error {
		r.Entries++
		if !command || r.FirstDivergence != 0 {
			return nil
		}
		want, err := recorded.At(index)
		if err != nil {
			return err
		}
		if want != "" && want != hash {
			r.fail(index, "entry %d (%s) replays to hash %s, but hashed to %s when it was applied: it was altered after it was applied",
				index, describe(), auditrec.Short(hash), auditrec.Short(want))
		}
		return nil
	}
	// Advance to each checkpoint in turn, so that it is checked against the
	// state right after its entry.
	for _, cp := range checks {
		if err := cur.AdvanceHeads(cp.index, perEntry); err != nil {
			r.fail(cur.Next(), "%v", err)
			return r.ServerVerification, nil
		}
		check(cp)
	}
	if err := cur.AdvanceHeads(upTo, perEntry); err != nil {
		r.fail(cur.Next(), "%v", err)
		return r.ServerVerification, nil
	}
	cur.View(func(f *fsm.FSM) {
		r.AppliedIndex, r.ReplayedHash = f.AppliedIndex(), f.Hash()
		r.Hash = r.ReplayedHash
	})
	if live != nil {
		r.AppliedIndex, r.Hash = live.index, live.hash
	}
	return r.ServerVerification, nil
}

// VerifyLocal verifies a running server: it reads its applied index, hash
// and state together, then replays its own log up to that index (see
// History.Verify).
func VerifyLocal(ctx context.Context, s Server) (*pb.ServerVerification, error) {
	h, err := Live(s)
	if err != nil {
		return nil, err
	}
	live := &liveHead{}
	s.View(func(f *fsm.FSM) {
		live.index, live.hash, live.state = f.AppliedIndex(), f.Hash(), f.State()
	})
	v, err := h.Verify(live.index, live)
	if err != nil {
		return nil, err
	}
	v.Server = s.NodeName()
	return v, ctx.Err()
}

// HashAt returns the hash chain head as of index: the head a running
// server's state machine recorded after the last command entry at or
// before index, "" when it has no record. Index 0 gives the live head.
func HashAt(s Server, index uint64) (uint64, string, error) {
	files, err := s.LogFiles()
	if err != nil {
		return 0, "", err
	}
	if index == 0 {
		i, h := head(s)
		return i, h, nil
	}
	if applied := s.AppliedIndex(); index > applied {
		return 0, "", fmt.Errorf("index %d is beyond this server's applied index %d", index, applied)
	}
	for i := index; i > 0; i-- {
		h, err := files.Hashes.At(i)
		if err != nil || h != "" {
			return index, h, err
		}
		var l raft.Log
		if err := files.Log.GetLog(i, &l); err == nil && l.Type == raft.LogCommand {
			return index, "", nil // a command entry without a record: unknown
		}
	}
	return index, genesisHash(), nil
}

// genesisHash is the hash head of an empty state machine.
func genesisHash() string { return fsm.New().Hash() }

// Log calls yield with the events req selects, up to upTo (req.ToIndex when
// lower).
func (h *History) Log(req *pb.LogRequest, upTo uint64, yield func(*pb.Event) error) error {
	if req.GetToIndex() != 0 {
		upTo = min(upTo, req.GetToIndex())
	}
	return h.Cursor(req.GetFromIndex(), req.GetFilter()).Advance(upTo, yield)
}

// Replay rebuilds the state req asks for, as of an index or a time, from the
// entries up to upTo (index 0 and no time: upTo itself).
func (h *History) Replay(req *pb.ReplayRequest, upTo uint64) (*pb.ReplayResponse, error) {
	index := req.GetIndex()
	switch {
	case req.GetTime() != nil:
		var err error
		if index, err = h.IndexAt(req.GetTime().AsTime(), upTo); err != nil {
			return nil, err
		}
	case index == 0:
		index = upTo
	case index > upTo:
		return nil, fmt.Errorf("%w: index %d is beyond the last applied entry, %d", ErrBeyondLog, index, upTo)
	}
	f, err := h.StateAt(index)
	if err != nil {
		return nil, err
	}
	return replayResponse(index, f), nil
}

// replayResponse is state f, as of index, in the shapes of the listings.
func replayResponse(index uint64, f *fsm.FSM) *pb.ReplayResponse {
	return &pb.ReplayResponse{
		Index: index, Hash: f.Hash(),
		Nodes: f.Nodes(), Devices: f.Devices(), Accelerators: f.Accelerators(),
		Models: f.Models(), Replicas: f.Replicas("", ""),
	}
}

// ErrBeyondLog is returned for an index after the last applied entry.
var ErrBeyondLog = errors.New("no such entry")
