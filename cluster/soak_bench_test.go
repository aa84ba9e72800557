package cluster

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/procfs"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/gpuplane/gpuplane/cluster/auditrec"
	"github.com/gpuplane/gpuplane/cluster/replaylog"
	"github.com/gpuplane/gpuplane/fsm"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// soakEntries is how many entries BenchmarkSoak applies;
// GPUPLANE_SOAK_ENTRIES overrides it.
const soakEntries = 10_000_000

// soakWindow is the request window of the soak: a few minutes of log time
// (the workload's entries are 10 ms of log time apart, so 30,000 entries).
const soakWindow = 5 * time.Minute

// BenchmarkSoak applies a long log through the apply path Raft drives
// (raftFSM.ApplyBatch in batches of raft's MaxAppendEntries: the state
// machine, the per-entry hash records on disk) with the request window
// shortened to a few minutes of log time, and samples as it goes: the
// request table (ids held, ids within the window, bytes), the process's
// resident memory, the Go heap, and the snapshot's size against the live
// objects. It prints the samples and the slope of each figure per million
// entries before the window first fills and over the last half of the run:
// what is bounded stays flat once ids start to expire. The workload is the
// replay benchmark's busy cluster (deployments coming and going on 64
// nodes), every command with its own request id. Run with `make bench-soak`.
func BenchmarkSoak(b *testing.B) {
	n := uint64(soakEntries)
	if s := os.Getenv("GPUPLANE_SOAK_ENTRIES"); s != "" {
		if _, err := fmt.Sscan(s, &n); err != nil {
			b.Fatalf("GPUPLANE_SOAK_ENTRIES=%q: %v", s, err)
		}
	}
	proc, err := procfs.Self()
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		dir := b.TempDir()
		hashes, err := auditrec.OpenHashes(filepath.Join(dir, auditrec.HashesFile), false, nil)
		if err != nil {
			b.Fatal(err)
		}
		w := newRaftFSM()
		w.hashes = hashes
		gen := replaylog.New(false, NewRequestID)
		windowEntries := uint64(soakWindow / (10 * time.Millisecond))

		type sample struct {
			index                 uint64
			held, live            int
			tableBytes, rss, heap int64
			snapshot, objects     int64
		}
		var samples []sample
		take := func(index uint64) {
			runtime.GC()
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			s := sample{index: index, heap: int64(ms.HeapInuse)}
			if st, err := proc.Stat(); err == nil {
				s.rss = int64(st.ResidentMemory())
			}
			w.view(func(f *fsm.FSM) {
				rs := f.RequestStats()
				s.held, s.live, s.tableBytes = rs.Entries, rs.Live, rs.Bytes
				data, err := f.Snapshot()
				if err != nil {
					b.Fatal(err)
				}
				s.snapshot = int64(len(data))
				s.objects = int64(len(f.Nodes()) + len(f.Accelerators()) + len(f.Models()) + len(f.Replicas("", "")) + rs.Live)
			})
			samples = append(samples, s)
		}
		take(0) // the baseline: the process before any entry
		every := max(n/40, 1)
		start := time.Now()
		const batch = 64 // raft's MaxAppendEntries
		logs := make([]*raft.Log, 0, batch)
		windowSet := false
		for i := uint64(1); i <= n; i++ {
			l := gen.Entry(i)
			if !windowSet && l.Type == raft.LogCommand {
				// The leader's first proposal carries its window.
				l, windowSet = withWindow(l, soakWindow), true
			}
			logs = append(logs, l)
			if len(logs) == batch || i == n {
				for _, r := range w.ApplyBatch(logs) {
					if res, ok := r.(*pb.Result); ok && res.GetCode() != pb.Code_CODE_OK && !strings.Contains(res.GetMessage(), "not found") {
						b.Fatalf("entry %d: %v %s", res.GetIndex(), res.GetCode(), res.GetMessage())
					}
				}
				logs = logs[:0]
			}
			if i%every == 0 || i == windowEntries {
				take(i)
			}
		}
		elapsed := time.Since(start)
		hashes.Close()
		debug.FreeOSMemory()

		fmt.Printf("%d entries applied in %v (%.0f/s), window %v of log time (%d entries)\n", n, elapsed.Round(time.Second), float64(n)/elapsed.Seconds(), soakWindow, windowEntries)
		fmt.Printf("%12s %10s %10s %12s %10s %10s %12s %10s\n", "ENTRIES", "IDS HELD", "IDS LIVE", "TABLE", "RSS", "HEAP", "SNAPSHOT", "OBJECTS")
		for _, s := range samples {
			fmt.Printf("%12d %10d %10d %12s %10s %10s %12s %10d\n", s.index, s.held, s.live, mib(s.tableBytes), mib(s.rss), mib(s.heap), mib(s.snapshot), s.objects)
		}
		// Slopes per million entries: from the baseline to the window
		// (growth while nothing can expire), and over the last half.
		slope := func(a, z sample, v func(sample) int64) float64 {
			if z.index == a.index {
				return 0
			}
			return float64(v(z)-v(a)) / float64(z.index-a.index) * 1e6
		}
		var atWindow sample
		for _, s := range samples {
			if s.index == windowEntries {
				atWindow = s
			}
		}
		mid, last := samples[len(samples)/2], samples[len(samples)-1]
		if atWindow.index == 0 {
			atWindow = samples[0]
		}
		before := samples[0]
		for _, f := range []struct {
			name string
			v    func(sample) int64
			unit float64
			u    string
		}{
			{"request ids held", func(s sample) int64 { return int64(s.held) }, 1, ""},
			{"request table", func(s sample) int64 { return s.tableBytes }, 1 << 20, " MiB"},
			{"RSS", func(s sample) int64 { return s.rss }, 1 << 20, " MiB"},
			{"Go heap in use", func(s sample) int64 { return s.heap }, 1 << 20, " MiB"},
			{"snapshot", func(s sample) int64 { return s.snapshot }, 1 << 20, " MiB"},
		} {
			fmt.Printf("%-17s per million entries: %+.1f%s before the window fills (0..%d), %+.2f%s over the last half (%d..%d)\n",
				f.name, slope(before, atWindow, f.v)/f.unit, f.u, atWindow.index, slope(mid, last, f.v)/f.unit, f.u, mid.index, last.index)
		}
		fmt.Printf("snapshot at the end: %s for %d live objects (%d live request ids), %.0f bytes per object\n",
			mib(last.snapshot), last.objects, last.live, float64(last.snapshot)/float64(max(last.objects, 1)))
		b.ReportMetric(float64(last.held), "ids-held")
		b.ReportMetric(float64(last.rss)/(1<<20), "MiB-rss")
		b.ReportMetric(float64(last.snapshot)/(1<<20), "MiB-snapshot")
	}
}

// withWindow returns l with its envelope's request window set, as the
// leader's first proposal of a term carries it.
func withWindow(l *raft.Log, window time.Duration) *raft.Log {
	if l.Type != raft.LogCommand {
		return l
	}
	env := &pb.Envelope{}
	if err := proto.Unmarshal(l.Data, env); err != nil {
		panic(err)
	}
	env.RequestWindow = durationpb.New(window)
	data, err := fsm.Marshal(env)
	if err != nil {
		panic(err)
	}
	out := *l
	out.Data = data
	return &out
}

func mib(n int64) string { return fmt.Sprintf("%.1fMiB", float64(n)/(1<<20)) }
