package cluster_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/gpuplane/gpuplane/cluster"
	"github.com/gpuplane/gpuplane/cluster/audit"
	"github.com/gpuplane/gpuplane/cluster/raftstore"
	"github.com/gpuplane/gpuplane/cluster/replaylog"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// BenchmarkArchiveCompact archives and compacts a log of a million
// entries (GPUPLANE_ARCHIVE_ENTRIES overrides it): a single server
// applies the replay benchmark's busy-cluster log through Raft, then the
// log is archived in sealed segments, the server's log compacted behind
// the archive, and it checks that verify passes across both (the archive
// against the server's per-entry records, the compacted log from its
// audit base), that a replay at an archived index equals the replay before
// compaction, and that an archived segment altered afterwards is named.
// It reports how long each step takes. Run with `make bench-archive`.
func BenchmarkArchiveCompact(b *testing.B) {
	n := uint64(1_000_000)
	if s := os.Getenv("GPUPLANE_ARCHIVE_ENTRIES"); s != "" {
		if _, err := fmt.Sscan(s, &n); err != nil {
			b.Fatalf("GPUPLANE_ARCHIVE_ENTRIES=%q: %v", s, err)
		}
	}
	for b.Loop() {
		o := cluster.NewNodeOpts(b, "n1")
		if err := buildServerLog(o, n); err != nil {
			b.Fatal(err)
		}
		t0 := time.Now()
		c := cluster.Start(b, o)
		cluster.WaitLeader(b, c)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
		defer cancel()
		if err := c.WaitApplied(ctx, n); err != nil {
			b.Fatal(err)
		}
		b.Logf("%d entries applied through Raft in %v", c.AppliedIndex(), time.Since(t0).Round(time.Millisecond))
		h, err := audit.Live(c)
		if err != nil {
			b.Fatal(err)
		}
		last := c.AppliedIndex()
		at := n / 3
		t0 = time.Now()
		want, err := h.Replay(&pb.ReplayRequest{Index: at}, last)
		if err != nil {
			b.Fatal(err)
		}
		b.Logf("replay at %d before compaction: %v", at, time.Since(t0).Round(time.Millisecond))

		t0 = time.Now()
		a, err := audit.OpenArchive(b.TempDir(), true)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := a.Extend(h.Entries, last, min(audit.DefaultSegmentEntries, max(n/16, 1))); err != nil {
			b.Fatal(err)
		}
		b.Logf("archived 1..%d in %d segments in %v", a.Cut, len(a.Segments), time.Since(t0).Round(time.Millisecond))

		t0 = time.Now()
		first, err := c.Compact(ctx, a.Cut+1, a.Snapshot.Hash)
		if err != nil {
			b.Fatal(err)
		}
		b.Logf("compacted: the server's log starts at %d (%v)", first, time.Since(t0).Round(time.Millisecond))

		t0 = time.Now()
		if rep := a.Verify(h.RecordedHash); !rep.OK {
			b.Fatalf("archive verify: %v", rep.Problems)
		}
		b.Logf("archive verified against the server's per-entry records in %v", time.Since(t0).Round(time.Millisecond))
		t0 = time.Now()
		if v, err := audit.VerifyLocal(ctx, c); err != nil || !v.Ok || v.BaseIndex != a.Cut {
			b.Fatalf("verify of the compacted log: %v %v (base %d)", err, v.GetProblems(), v.GetBaseIndex())
		}
		b.Logf("compacted log verified from its audit base at %d in %v", a.Cut, time.Since(t0).Round(time.Millisecond))
		t0 = time.Now()
		got, err := a.Replay(at)
		if err != nil {
			b.Fatal(err)
		}
		if !proto.Equal(got, want) {
			b.Fatalf("replay at %d from the archive differs from the replay before compaction", at)
		}
		b.Logf("replay at %d from the archive equals the replay before compaction (%v)", at, time.Since(t0).Round(time.Millisecond))

		seg := len(a.Segments) / 2
		changed := false
		tamperB(b, a, seg, func(e *pb.ArchivedEntry) bool {
			if !changed && raft.LogType(e.GetType()) == raft.LogCommand && strings.Contains(string(e.Data), "model-") {
				e.Data = []byte(strings.Replace(string(e.Data), "model-", "mode1-", 1))
				changed = true
				return true
			}
			return false
		})
		rep := a.Verify(nil)
		name := fmt.Sprintf("archived segment %d (entries %d..%d)", seg+1, a.Segments[seg].First, a.Segments[seg].Last)
		if rep.OK || rep.FirstBad != seg+1 || !strings.Contains(strings.Join(rep.Problems, "\n"), name) {
			b.Fatalf("tampered archive: ok %v, first bad %d, %q; want %s named", rep.OK, rep.FirstBad, rep.Problems, name)
		}
		b.Logf("tampered archive: %s", rep.Problems[0])
		c.Shutdown()
	}
}

// tamperB is tamper for a benchmark.
func tamperB(b *testing.B, a *audit.Archive, i int, change func(*pb.ArchivedEntry) bool) {
	t := &testing.T{}
	tamper(t, a, i, change)
	if t.Failed() {
		b.Fatalf("tamper with segment %d failed", i+1)
	}
}

// buildServerLog writes a data dir for server o whose log holds n entries of
// the replay workload and whose configuration is o alone, so that the
// server, started on it, elects itself and applies them all.
func buildServerLog(o cluster.NodeOpts, n uint64) error {
	store, err := raftstore.Open(cluster.LogDir(o.Dir()), raftstore.Options{})
	if err != nil {
		return err
	}
	defer store.Close()
	gen := replaylog.New(false, cluster.NewRequestID)
	const batch = 10_000
	logs := make([]*raft.Log, 0, batch)
	for i := uint64(1); i <= n; i++ {
		l := gen.Entry(i)
		if i == 1 {
			conf := raft.Configuration{Servers: []raft.Server{{Suffrage: raft.Voter, ID: raft.ServerID(o.Name()), Address: raft.ServerAddress(o.Addr())}}}
			l.Data = raft.EncodeConfiguration(conf)
		}
		logs = append(logs, l)
		if len(logs) == batch || i == n {
			if err := store.StoreLogs(logs); err != nil {
				return err
			}
			logs = logs[:0]
		}
	}
	return store.SetUint64([]byte("CurrentTerm"), 2)
}
