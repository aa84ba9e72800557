package cluster_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuplane/gpuplane/cluster"
	"github.com/gpuplane/gpuplane/cluster/audit"
	"github.com/gpuplane/gpuplane/cluster/auditrec"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// TestVerifyOfflineAgainstSnapshot checks the offline verifier against the
// snapshot alone: with the per-entry hashes gone, an entry altered before
// the snapshot's index still fails verification, at the snapshot's index,
// with the range that holds the altered entry; an intact log passes.
func TestVerifyOfflineAgainstSnapshot(t *testing.T) {
	c, o := cluster.StartDev(t)
	for _, name := range []string{"a", "b", "c", "d"} {
		cluster.MustApply(t, c, cluster.CreateAccelerator(name))
	}
	if err := cluster.TakeSnapshot(c); err != nil {
		t.Fatal(err)
	}
	snapAt := c.AppliedIndex()
	cluster.MustApply(t, c, cluster.CreateAccelerator("e"))
	if err := c.Shutdown(); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(cluster.RaftDir(o.Dir()), auditrec.HashesFile)); err != nil {
		t.Fatal(err)
	}

	verify := func() *pb.ServerVerification {
		t.Helper()
		off, _, v := verifyOffline(t, o.Dir())
		off.Close()
		return v
	}
	if v := verify(); !v.Ok || len(v.Problems) > 0 {
		t.Fatalf("intact log: %v", v)
	}

	// Rename accelerator "b" in its entry.
	altered := cluster.RenameInLog(t, o.Dir(), "b", "x")

	v := verify()
	if v.Ok || v.FirstDivergence != snapAt {
		t.Fatalf("altered entry %d before the snapshot at %d: ok=%v first divergence %d, problems %q", altered, snapAt, v.Ok, v.FirstDivergence, v.Problems)
	}
	if !strings.Contains(strings.Join(v.Problems, "\n"), "an entry in 1..") {
		t.Errorf("problems do not give the range: %q", v.Problems)
	}
}

// TestVerifyNamesAlteredEntry checks that audit verify, with the per-entry
// hash records, names the first entry altered after it was applied and
// describes it.
func TestVerifyNamesAlteredEntry(t *testing.T) {
	c, o := cluster.StartDev(t)
	for _, name := range []string{"a", "b", "c"} {
		cluster.MustApply(t, c, cluster.CreateAccelerator(name))
	}
	if err := c.Shutdown(); err != nil {
		t.Fatal(err)
	}
	altered := cluster.RenameInLog(t, o.Dir(), "b", "x")
	off, last, v := verifyOffline(t, o.Dir())
	defer off.Close()
	events := 0
	if err := off.Cursor(1, nil).Advance(last, func(*pb.Event) error { events++; return nil }); err != nil {
		t.Fatal(err)
	}
	problems := strings.Join(v.Problems, "\n")
	if v.Ok || v.FirstDivergence != altered || v.Entries != uint64(events) ||
		!strings.Contains(problems, fmt.Sprintf("entry %d (CreateAccelerator x", altered)) || !strings.Contains(problems, "altered after it was applied") {
		t.Fatalf("altered entry %d: ok=%v first divergence %d, %d entries of %d events, problems %q", altered, v.Ok, v.FirstDivergence, v.Entries, events, v.Problems)
	}
}

// verifyOffline opens dir's log offline and verifies it to its last entry,
// as `audit verify --data-dir` does. The caller closes the store.
func verifyOffline(t testing.TB, dir string) (*audit.Offline, uint64, *pb.ServerVerification) {
	t.Helper()
	off, err := audit.OpenOffline(dir)
	if err != nil {
		t.Fatal(err)
	}
	last, err := off.LastIndex()
	if err != nil {
		off.Close()
		t.Fatal(err)
	}
	v, err := off.Verify(last, nil)
	if err != nil {
		off.Close()
		t.Fatal(err)
	}
	return off, last, v
}
