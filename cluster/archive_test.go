package cluster_test

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protodelim"
	"google.golang.org/protobuf/proto"

	"github.com/gpuplane/gpuplane/cluster"
	"github.com/gpuplane/gpuplane/cluster/audit"
	"github.com/gpuplane/gpuplane/cluster/events"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// TestArchiveThenCompact archives a server's log in sealed segments,
// compacts the server's log before the cut, and checks that the audit trail
// is whole: the archive verifies (against the server's own per-entry
// records too), the compacted log verifies from its audit base, the state
// replayed at an archived index equals the replay before compaction, so do
// later indexes from the live log, a restarted server and an offline one
// agree, and an archived segment altered afterwards is named by number and
// entries.
func TestArchiveThenCompact(t *testing.T) {
	o := cluster.NewNodeOpts(t, "n1")
	c := cluster.Start(t, o)
	cluster.WaitLeader(t, c)
	ctx := cluster.TestCtx(t)
	cluster.MustApply(t, c, cluster.RegisterNode("n1"))
	for i := range 350 {
		cluster.MustApply(t, c, cluster.CreateAccelerator(fmt.Sprintf("a%d", i)))
		if i%3 == 0 {
			cluster.MustApply(t, c, &pb.Envelope{Command: &pb.Envelope_DeleteAccelerator{DeleteAccelerator: &pb.DeleteAccelerator{Name: fmt.Sprintf("a%d", i)}}})
		}
	}
	last := c.AppliedIndex()
	h, err := audit.Live(c)
	if err != nil {
		t.Fatal(err)
	}
	const archived, later = 150, 420
	wantOld, err := h.Replay(&pb.ReplayRequest{Index: archived}, last)
	if err != nil {
		t.Fatal(err)
	}
	wantLater, err := h.Replay(&pb.ReplayRequest{Index: later}, last)
	if err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	a, err := audit.OpenArchive(dir, true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Extend(h.Entries, 250, 100); err != nil {
		t.Fatal(err)
	}
	// A second run extends the archive from its snapshot.
	if n, err := a.Extend(h.Entries, last, 100); err != nil || n == 0 {
		t.Fatalf("extend: %d segments, %v", n, err)
	}
	if a.Cut != last/100*100 || len(a.Segments) != int(a.Cut/100) {
		t.Fatalf("archive cut %d with %d segments, want whole segments of 100 up to %d", a.Cut, len(a.Segments), last)
	}
	if rep := a.Verify(h.RecordedHash); !rep.OK {
		t.Fatalf("archive verify: %v", rep.Problems)
	}
	cut := a.Cut

	// An archive of another log is refused.
	if _, err := c.Compact(ctx, cut+1, strings.Repeat("0", 64)); err == nil {
		t.Fatal("compact accepted an archive whose hash head is not this log's")
	}
	first, err := c.Compact(ctx, cut+1, a.Snapshot.Hash)
	if err != nil {
		t.Fatal(err)
	}
	if first > cut+1 || first < 2 {
		t.Fatalf("after compaction the log starts at %d, want 2..%d", first, cut+1)
	}
	if r := c.Resources(); r.GetFirstIndex() != first {
		t.Errorf("resources show first index %d, want %d", r.GetFirstIndex(), first)
	}
	cluster.MustApply(t, c, cluster.CreateAccelerator("after"))

	v, err := audit.VerifyLocal(ctx, c)
	if err != nil || !v.Ok || v.BaseIndex != cut {
		t.Fatalf("verify the compacted log: %v, %v (base %d, want %d)", err, v.GetProblems(), v.GetBaseIndex(), cut)
	}
	if _, err := h.Replay(&pb.ReplayRequest{Index: archived}, c.AppliedIndex()); !errors.Is(err, events.ErrCompacted) && (err == nil || !strings.Contains(err.Error(), "archive")) {
		t.Errorf("replay of an archived index from the compacted log: %v, want an error pointing at the archive", err)
	}
	gotOld, err := a.Replay(archived)
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(gotOld, wantOld) {
		t.Errorf("replay at %d from the archive differs from the replay before compaction", archived)
	}
	gotLater, err := h.Replay(&pb.ReplayRequest{Index: later}, c.AppliedIndex())
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(gotLater, wantLater) {
		t.Errorf("replay at %d from the compacted log differs from the replay before compaction", later)
	}

	// Restarted, the server starts from its snapshot over the compacted log
	// and still verifies; so does the stopped data dir, offline.
	if err := c.Shutdown(); err != nil {
		t.Fatal(err)
	}
	c = cluster.Start(t, o)
	cluster.WaitLeader(t, c)
	cluster.MustApply(t, c, cluster.CreateAccelerator("restarted"))
	if v, err := audit.VerifyLocal(ctx, c); err != nil || !v.Ok {
		t.Fatalf("verify after restart: %v %v", err, v.GetProblems())
	}
	c.Shutdown()
	off, _, ov := verifyOffline(t, o.Dir())
	if !ov.Ok || ov.BaseIndex != cut {
		t.Errorf("offline verify of the compacted log: %v (base %d)", ov.Problems, ov.BaseIndex)
	}
	rec := off.History.RecordedHash

	// An entry altered in segment 3, digest updated to match: the replay
	// names the segment (and, with the server's records, the entry).
	tamper(t, a, 2, func(e *pb.ArchivedEntry) bool {
		if e.GetIndex() == 250 && len(e.Data) > 0 {
			e.Data = bytes.Replace(e.Data, []byte("a"), []byte("b"), 1)
			return true
		}
		return false
	})
	for _, records := range []func(uint64) (string, error){nil, rec} {
		rep := a.Verify(records)
		if rep.OK || rep.FirstBad != 3 || !strings.Contains(strings.Join(rep.Problems, "\n"), "archived segment 3 (entries 201..300)") {
			t.Errorf("verify of an altered archive: ok %v, first bad %d, %q; want segment 3 (entries 201..300) named", rep.OK, rep.FirstBad, rep.Problems)
		}
		if records != nil && !strings.Contains(strings.Join(rep.Problems, "\n"), "entry 250") {
			t.Errorf("with the server's records the altered entry is not named: %q", rep.Problems)
		}
	}
	off.Close()
	// A byte flipped in a file is caught by its digest.
	seg := filepath.Join(dir, a.Segments[0].File)
	b, _ := os.ReadFile(seg)
	b[len(b)/2] ^= 0xff
	os.WriteFile(seg, b, 0o644)
	if rep := a.Verify(nil); rep.OK || rep.FirstBad != 1 || !strings.Contains(rep.Problems[0], "SHA-256") {
		t.Errorf("verify of a flipped byte: ok %v, first bad %d, %q", rep.OK, rep.FirstBad, rep.Problems)
	}
}

// tamper rewrites archived segment i, changing entries with change, and
// updates its digest in the manifest, as someone covering their tracks
// would.
func tamper(t *testing.T, a *audit.Archive, i int, change func(*pb.ArchivedEntry) bool) {
	t.Helper()
	var out bytes.Buffer
	changed := false
	data, err := os.ReadFile(filepath.Join(a.Dir, a.Segments[i].File))
	if err != nil {
		t.Fatal(err)
	}
	for r := bufio.NewReader(bytes.NewReader(data)); ; {
		e := &pb.ArchivedEntry{}
		if err = protodelim.UnmarshalFrom(r, e); err != nil {
			if errors.Is(err, io.EOF) {
				err = nil
			}
			break
		}
		changed = change(e) || changed
		if _, err = protodelim.MarshalTo(&out, e); err != nil {
			break
		}
	}
	if err != nil || !changed {
		t.Fatalf("tamper with segment %d: %v (changed %v)", i+1, err, changed)
	}
	if err := os.WriteFile(filepath.Join(a.Dir, a.Segments[i].File), out.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(out.Bytes())
	a.Segments[i].SHA256 = hex.EncodeToString(sum[:])
	m, _ := json.Marshal(a.ArchiveManifest)
	if err := os.WriteFile(filepath.Join(a.Dir, "MANIFEST.json"), m, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestCompactedClusterCatchesUp compacts all three servers' logs behind an
// archive, then wipes a follower: the leader can no longer send it the old
// entries and sends a snapshot instead. The new follower holds neither the
// early entries nor an audit base of its own, yet verifies its log from the
// snapshot it was sent.
func TestCompactedClusterCatchesUp(t *testing.T) {
	tr := cluster.StartTrio(t)
	_, l := tr.Leader()
	for i := range 120 {
		cluster.MustApply(t, l, cluster.CreateAccelerator(fmt.Sprintf("a%d", i)))
	}
	tr.Converge()
	h, err := audit.Live(l)
	if err != nil {
		t.Fatal(err)
	}
	a, err := audit.OpenArchive(t.TempDir(), true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Extend(h.Entries, l.AppliedIndex(), 50); err != nil {
		t.Fatal(err)
	}
	ctx := cluster.TestCtx(t)
	for j := range tr.Len() {
		c := tr.Node(j)
		if _, err := c.Compact(ctx, a.Cut+1, a.Snapshot.Hash); err != nil {
			t.Fatalf("compact %s: %v", c.NodeName(), err)
		}
	}
	i, _ := tr.Follower()
	tr.Stop(i)
	if err := tr.Wipe(i); err != nil {
		t.Fatal(err)
	}
	// Restarted, the others no longer hold the old entries in Raft's
	// in-memory log cache either.
	for j := range tr.Len() {
		if j != i {
			tr.Stop(j)
			tr.Restart(j)
		}
	}
	tr.Restart(i)
	_, l = tr.Leader()
	cluster.MustApply(t, l, cluster.CreateAccelerator("after"))
	tr.Converge()
	v, err := audit.VerifyLocal(ctx, tr.Node(i))
	if err != nil || !v.Ok {
		t.Fatalf("verify on the server that was sent a snapshot: %v %v", err, v.GetProblems())
	}
	if v.BaseIndex <= a.Cut-1 {
		t.Errorf("the new server replayed from index %d, want from the snapshot it was sent (at or after %d)", v.BaseIndex, a.Cut)
	}
}
