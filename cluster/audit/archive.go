package audit

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/encoding/protodelim"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/gpuplane/gpuplane/cluster/auditrec"
	"github.com/gpuplane/gpuplane/fsm"
	"github.com/gpuplane/gpuplane/internal/atomicfile"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// An archive holds sealed stretches of a Raft log outside the servers, so
// that they may drop those entries (Cluster.Compact) while `audit verify`
// and `audit replay` keep working over the whole history (docs/audit.md). Its
// format is docs/archive.md:
//
//	DIR/MANIFEST.json                  what the archive holds (archiveManifest)
//	DIR/segments/<first>-<last>.entries  entries first..last, each a
//	                                   varint-length-prefixed ArchivedEntry
//	DIR/snapshots/<index>.state        the state (fsm.Snapshot) after the last
//	                                   archived entry: the cut
//
// Every segment is sealed: it is written once, whole, and never changed;
// extending an archive adds segments after the last and replaces the
// snapshot. The manifest records each segment's SHA-256 and the hash chain
// head after its last entry, so that verification names an altered
// segment, and the replay of the segments must reach the snapshot's state.
const (
	archiveManifest = "MANIFEST.json"
	archiveFormat   = "gpuplane-archive/1"
	// DefaultSegmentEntries is how many entries an archive segment holds
	// unless told otherwise.
	DefaultSegmentEntries = 1 << 16
)

// ArchiveManifest is MANIFEST.json.
type ArchiveManifest struct {
	Format   string           `json:"format"`
	Segments []ArchiveSegment `json:"segments"`
	// Cut is the last archived index (0: none yet).
	Cut      uint64           `json:"cut"`
	Snapshot *ArchiveSnapshot `json:"snapshot,omitempty"`
}

// ArchiveSegment is one sealed segment.
type ArchiveSegment struct {
	File  string `json:"file"`
	First uint64 `json:"first"`
	Last  uint64 `json:"last"`
	// SHA256 is the file's digest, hex.
	SHA256 string `json:"sha256"`
	// Head is the hash chain head after entry Last.
	Head string `json:"head"`
}

// ArchiveSnapshot is the state at the cut.
type ArchiveSnapshot struct {
	File   string `json:"file"`
	Index  uint64 `json:"index"`
	SHA256 string `json:"sha256"`
	Hash   string `json:"hash"`
}

// EntrySource reads log entries from..to in order, as stored: a server's log
// (History.Entries) or one streamed by the AuditService.
type EntrySource func(from, to uint64, fn func(*pb.ArchivedEntry) error) error

// Archive is an archive directory.
type Archive struct {
	Dir string
	ArchiveManifest
}

// OpenArchive reads dir's manifest. With create, a missing or empty dir is
// an empty archive; otherwise it is an error.
func OpenArchive(dir string, create bool) (*Archive, error) {
	a := &Archive{Dir: dir, ArchiveManifest: ArchiveManifest{Format: archiveFormat}}
	b, err := os.ReadFile(filepath.Join(dir, archiveManifest))
	if errors.Is(err, fs.ErrNotExist) && create {
		return a, nil
	}
	if err != nil {
		return nil, fmt.Errorf("archive %s: %w", dir, err)
	}
	if err := json.Unmarshal(b, &a.ArchiveManifest); err != nil {
		return nil, fmt.Errorf("archive %s: %s: %w", dir, archiveManifest, err)
	}
	if a.Format != archiveFormat {
		return nil, fmt.Errorf("archive %s: format %q, this gpuplane reads %q", dir, a.Format, archiveFormat)
	}
	return a, nil
}

// Extend archives the entries after the archive's cut in whole segments of
// perSegment entries, up to upTo: a stretch shorter than a segment stays in
// the log for a later run. It replays what it archives (starting from the
// snapshot at the current cut) to record each segment's hash head and to
// write the snapshot at the new cut. It returns the number of segments
// added.
func (a *Archive) Extend(src EntrySource, upTo, perSegment uint64) (int, error) {
	if perSegment == 0 {
		perSegment = DefaultSegmentEntries
	}
	state, err := a.stateAtCut()
	if err != nil {
		return 0, err
	}
	for _, sub := range []string{"segments", "snapshots"} {
		if err := os.MkdirAll(filepath.Join(a.Dir, sub), 0o755); err != nil {
			return 0, err
		}
	}
	added := 0
	for first := a.Cut + 1; first+perSegment-1 <= upTo; first += perSegment {
		seg, err := a.writeSegment(src, state, first, first+perSegment-1)
		if err != nil {
			return added, err
		}
		a.Segments = append(a.Segments, seg)
		a.Cut = seg.Last
		added++
	}
	if added == 0 {
		return 0, nil
	}
	data, err := state.Snapshot()
	if err != nil {
		return added, err
	}
	old := a.Snapshot
	name := filepath.Join("snapshots", fmt.Sprintf("%020d.state", a.Cut))
	if err := atomicfile.Write(filepath.Join(a.Dir, name), data); err != nil {
		return added, err
	}
	sum := sha256.Sum256(data)
	a.Snapshot = &ArchiveSnapshot{File: name, Index: a.Cut, SHA256: hex.EncodeToString(sum[:]), Hash: state.Hash()}
	b, err := json.MarshalIndent(a.ArchiveManifest, "", "  ")
	if err != nil {
		return added, err
	}
	if err := atomicfile.Write(filepath.Join(a.Dir, archiveManifest), append(b, '\n')); err != nil {
		return added, err
	}
	if old != nil && old.File != name {
		os.Remove(filepath.Join(a.Dir, old.File))
	}
	return added, nil
}

// stateAtCut restores the snapshot at the cut (an empty state for an empty
// archive), checking it against its digest.
func (a *Archive) stateAtCut() (*fsm.FSM, error) {
	f := fsm.New()
	if a.Snapshot == nil {
		if a.Cut != 0 {
			return nil, fmt.Errorf("archive %s: the manifest has entries up to %d but no snapshot", a.Dir, a.Cut)
		}
		return f, nil
	}
	data, err := os.ReadFile(filepath.Join(a.Dir, a.Snapshot.File))
	if err != nil {
		return nil, fmt.Errorf("archive %s: %w", a.Dir, err)
	}
	if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) != a.Snapshot.SHA256 {
		return nil, fmt.Errorf("archive %s: snapshot %s does not match its SHA-256 in the manifest: altered", a.Dir, a.Snapshot.File)
	}
	if err := f.Restore(data); err != nil {
		return nil, fmt.Errorf("archive %s: snapshot %s: %w", a.Dir, a.Snapshot.File, err)
	}
	return f, nil
}

// writeSegment writes entries first..last from src into a new segment file,
// applying them to state.
func (a *Archive) writeSegment(src EntrySource, state *fsm.FSM, first, last uint64) (ArchiveSegment, error) {
	name := filepath.Join("segments", fmt.Sprintf("%020d-%020d.entries", first, last))
	path := filepath.Join(a.Dir, name)
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return ArchiveSegment{}, err
	}
	defer os.Remove(tmp)
	defer f.Close()
	h := sha256.New()
	w := bufio.NewWriterSize(io.MultiWriter(f, h), 1<<20)
	next := first
	err = src(first, last, func(e *pb.ArchivedEntry) error {
		if e.GetIndex() != next {
			return fmt.Errorf("archive: the log sent entry %d where %d was due", e.GetIndex(), next)
		}
		next++
		if _, err := protodelim.MarshalTo(w, e); err != nil {
			return err
		}
		if raft.LogType(e.GetType()) == raft.LogCommand {
			state.ApplyBytes(e.GetIndex(), e.GetData())
		}
		return nil
	})
	if err == nil && next != last+1 {
		err = fmt.Errorf("archive: the log ended at entry %d, before %d", next-1, last)
	}
	if err == nil {
		err = w.Flush()
	}
	if err == nil {
		err = f.Sync()
	}
	if err == nil {
		err = f.Close()
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		return ArchiveSegment{}, fmt.Errorf("archive entries %d..%d: %w", first, last, err)
	}
	return ArchiveSegment{File: name, First: first, Last: last, SHA256: hex.EncodeToString(h.Sum(nil)), Head: state.Hash()}, nil
}

// readSegment calls fn with each entry of segment s, in order, after
// checking the file against its digest (altered: an error naming it).
func (a *Archive) readSegment(i int, fn func(*pb.ArchivedEntry) error) error {
	s := a.Segments[i]
	data, err := os.ReadFile(filepath.Join(a.Dir, s.File))
	if err != nil {
		return fmt.Errorf("segment %d (entries %d..%d): %w", i+1, s.First, s.Last, err)
	}
	if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) != s.SHA256 {
		return &SegmentError{Segment: i + 1, First: s.First, Last: s.Last,
			Problem: fmt.Sprintf("file %s does not match its SHA-256 in the manifest: altered", s.File)}
	}
	r := bufio.NewReader(&byteReader{data})
	next := s.First
	for {
		e := &pb.ArchivedEntry{}
		err := protodelim.UnmarshalFrom(r, e)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return &SegmentError{Segment: i + 1, First: s.First, Last: s.Last, Problem: fmt.Sprintf("entry %d: %v", next, err)}
		}
		if e.GetIndex() != next {
			return &SegmentError{Segment: i + 1, First: s.First, Last: s.Last, Problem: fmt.Sprintf("holds entry %d where %d is due", e.GetIndex(), next)}
		}
		next++
		if err := fn(e); err != nil {
			return err
		}
	}
	if next != s.Last+1 {
		return &SegmentError{Segment: i + 1, First: s.First, Last: s.Last, Problem: fmt.Sprintf("ends at entry %d", next-1)}
	}
	return nil
}

type byteReader struct{ b []byte }

func (r *byteReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p, r.b)
	r.b = r.b[n:]
	return n, nil
}

// SegmentError names an archived segment that fails verification, by its
// number (from 1) and its entries.
type SegmentError struct {
	Segment     int
	First, Last uint64
	Problem     string
}

func (e *SegmentError) Error() string {
	return fmt.Sprintf("archived segment %d (entries %d..%d): %s", e.Segment, e.First, e.Last, e.Problem)
}

// ArchiveReport is what VerifyArchive found.
type ArchiveReport struct {
	OK       bool
	Problems []string
	// FirstBad is the first segment (from 1) that failed; 0: none.
	FirstBad int
	Entries  uint64
	Cut      uint64
	Head     string
}

// Verify replays the archive from index 1 and checks every segment's file
// against its digest and its hash head, the snapshot against the replayed
// state at the cut, and, when recorded is not nil, every command entry's
// head against the head a server recorded when it applied that entry
// (which names the altered entry exactly). It reports the first segment
// that fails; later heads follow from it and are not reported again.
func (a *Archive) Verify(recorded func(index uint64) (string, error)) *ArchiveReport {
	r := &ArchiveReport{OK: true, Cut: a.Cut}
	bad := func(seg int, format string, args ...any) {
		r.OK = false
		r.Problems = append(r.Problems, fmt.Sprintf(format, args...))
		if r.FirstBad == 0 && seg > 0 {
			r.FirstBad = seg
		}
	}
	state := fsm.New()
	for i, s := range a.Segments {
		if i > 0 && s.First != a.Segments[i-1].Last+1 || i == 0 && s.First != 1 {
			bad(i+1, "archived segment %d starts at entry %d, not after the previous segment", i+1, s.First)
			break
		}
		var entryProblem string
		err := a.readSegment(i, func(e *pb.ArchivedEntry) error {
			r.Entries++
			if raft.LogType(e.GetType()) != raft.LogCommand {
				return nil
			}
			state.ApplyBytes(e.GetIndex(), e.GetData())
			if recorded != nil && entryProblem == "" {
				want, err := recorded(e.GetIndex())
				if err == nil && want != "" && want != state.Hash() {
					entryProblem = fmt.Sprintf("entry %d replays to hash %s, but the server recorded %s when it applied it: altered",
						e.GetIndex(), auditrec.Short(state.Hash()), auditrec.Short(want))
				}
			}
			return nil
		})
		var se *SegmentError
		switch {
		case errors.As(err, &se):
			bad(se.Segment, "%v", se)
		case err != nil:
			bad(i+1, "%v", err)
		case entryProblem != "":
			bad(i+1, "archived segment %d (entries %d..%d): %s", i+1, s.First, s.Last, entryProblem)
		case state.Hash() != s.Head:
			bad(i+1, "archived segment %d (entries %d..%d): replays to hash %s, the manifest says %s: an entry in it was altered",
				i+1, s.First, s.Last, auditrec.Short(state.Hash()), auditrec.Short(s.Head))
		}
		if !r.OK {
			return r
		}
	}
	r.Head = state.Hash()
	if a.Cut == 0 {
		return r
	}
	snap, err := a.stateAtCut()
	switch {
	case err != nil:
		bad(0, "%v", err)
	case a.Snapshot.Index != a.Cut:
		bad(0, "the archive's snapshot is at index %d, its cut at %d", a.Snapshot.Index, a.Cut)
	case snap.Hash() != state.Hash() || a.Snapshot.Hash != state.Hash():
		bad(0, "the archive's snapshot at %d has hash %s, the replay of its segments %s", a.Cut, auditrec.Short(snap.Hash()), auditrec.Short(state.Hash()))
	case !proto.Equal(snap.State(), state.State()):
		bad(0, "the archive's snapshot at %d differs from the replay of its segments although the hashes agree", a.Cut)
	}
	return r
}

// StateAt replays the archive up to index (at most its cut).
func (a *Archive) StateAt(index uint64) (*fsm.FSM, error) {
	if index > a.Cut {
		return nil, fmt.Errorf("%w: index %d is after the archive's last entry, %d", ErrBeyondLog, index, a.Cut)
	}
	state := fsm.New()
	errDone := errors.New("done")
	for i, s := range a.Segments {
		if s.First > index {
			break
		}
		err := a.readSegment(i, func(e *pb.ArchivedEntry) error {
			if e.GetIndex() > index {
				return errDone
			}
			if raft.LogType(e.GetType()) == raft.LogCommand {
				state.ApplyBytes(e.GetIndex(), e.GetData())
			}
			return nil
		})
		if err != nil && err != errDone {
			return nil, err
		}
	}
	return state, nil
}

// IndexAt is History.IndexAt over the archive: the last archived entry
// before the first one proposed after t (0: none).
func (a *Archive) IndexAt(t time.Time) (uint64, error) {
	at := uint64(0)
	for i := range a.Segments {
		err := a.readSegment(i, func(e *pb.ArchivedEntry) error {
			if raft.LogType(e.GetType()) == raft.LogCommand {
				env := &pb.Envelope{}
				if proto.Unmarshal(e.GetData(), env) == nil && env.GetProposedAt() != nil && env.GetProposedAt().AsTime().After(t) {
					return errStop
				}
			}
			at = e.GetIndex()
			return nil
		})
		if err == errStop {
			break
		}
		if err != nil {
			return 0, err
		}
	}
	return at, nil
}

// Replay is History.Replay over the archive (index only).
func (a *Archive) Replay(index uint64) (*pb.ReplayResponse, error) {
	f, err := a.StateAt(index)
	if err != nil {
		return nil, err
	}
	return replayResponse(index, f), nil
}

// Entries reads the entries from..to of a node's log, as stored: what an
// archive is made of.
func (h *History) Entries(from, to uint64, fn func(*pb.ArchivedEntry) error) error {
	var l raft.Log
	for i := from; i <= to; i++ {
		if err := h.files.Log.GetLog(i, &l); err != nil {
			return fmt.Errorf("read log entry %d: %w", i, err)
		}
		e := &pb.ArchivedEntry{Index: l.Index, Term: l.Term, Type: uint32(l.Type), Data: slices.Clone(l.Data)}
		if !l.AppendedAt.IsZero() {
			e.AppendedAt = timestamppb.New(l.AppendedAt)
		}
		if err := fn(e); err != nil {
			return err
		}
	}
	return nil
}

// RecordedHash is the hash head this node recorded after entry index when
// it applied it, "" when none: what an archive is checked against.
func (h *History) RecordedHash(index uint64) (string, error) { return h.files.Hashes.At(index) }
