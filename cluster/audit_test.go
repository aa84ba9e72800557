package cluster

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/raft"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// TestVerifyOfflineAgainstSnapshot checks the offline verifier against the
// snapshot alone: with the per-entry hashes gone, an entry altered before
// the snapshot's index still fails verification, at the snapshot's index,
// with the range that holds the altered entry; an intact log passes.
func TestVerifyOfflineAgainstSnapshot(t *testing.T) {
	c, o := startDev(t)
	for _, name := range []string{"a", "b", "c", "d"} {
		mustApply(t, c, createAccelerator(name))
	}
	if err := c.raft.Snapshot().Error(); err != nil {
		t.Fatal(err)
	}
	snapAt := c.AppliedIndex()
	mustApply(t, c, createAccelerator("e"))
	if err := c.Shutdown(); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(o.dir, raftDir, hashesFile)); err != nil {
		t.Fatal(err)
	}

	verify := func() *pb.ServerVerification {
		t.Helper()
		off, _, v := verifyOffline(t, o.dir)
		off.Close()
		return v
	}
	if v := verify(); !v.Ok || len(v.Problems) > 0 {
		t.Fatalf("intact log: %v", v)
	}

	// Rename accelerator "b" in its entry.
	altered := renameInLog(t, o.dir, "b", "x")

	v := verify()
	if v.Ok || v.FirstDivergence != snapAt {
		t.Fatalf("altered entry %d before the snapshot at %d: ok=%v first divergence %d, problems %q", altered, snapAt, v.Ok, v.FirstDivergence, v.Problems)
	}
	if !strings.Contains(strings.Join(v.Problems, "\n"), "an entry in 1..") {
		t.Errorf("problems do not give the range: %q", v.Problems)
	}
}

// TestMembershipEvents checks that configuration entries appear as
// membership events with what changed.
func TestMembershipEvents(t *testing.T) {
	prev := raft.Configuration{Servers: []raft.Server{
		{ID: "s1", Address: "a1", Suffrage: raft.Voter},
		{ID: "s2", Address: "a2", Suffrage: raft.Nonvoter},
		{ID: "s3", Address: "a3", Suffrage: raft.Voter},
	}}
	next := raft.Configuration{Servers: []raft.Server{
		{ID: "s1", Address: "a1", Suffrage: raft.Voter},
		{ID: "s2", Address: "a2", Suffrage: raft.Voter},
		{ID: "s4", Address: "a4", Suffrage: raft.Voter},
	}}
	m, changed := membershipChange(prev, next)
	if got, want := strings.Join(m.Changes, ", "), "s2 became voter, s4 joined as voter, s3 removed"; got != want {
		t.Errorf("changes: got %q, want %q", got, want)
	}
	if got := strings.Join(changed, ","); got != "s2,s4,s3" {
		t.Errorf("changed servers: %q", got)
	}
}
