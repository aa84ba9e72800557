package audit

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/cluster"
	"github.com/gpuplane/gpuplane/cluster/replaylog"
	"github.com/gpuplane/gpuplane/fsm"
)

// replayEntries is the size of the log BenchmarkReplay replays (the goal:
// one million entries in under two seconds). GPUPLANE_REPLAY_ENTRIES
// overrides it for quick runs.
const replayEntries = 1_000_000

// BenchmarkReplay measures audit replay from disk: a data dir whose log
// holds a million realistic entries is opened read-only (OpenOffline, as
// `audit replay --data-dir` does) and History.StateAt replays the whole log
// through the Cursor into a fresh state machine (LogReader, then
// fsm.ApplyBytes), reporting entries per second. It then snapshots the
// resulting state and times fsm.RestoreFrom of it (what a restart does, in
// cluster's raftFSM.Restore).
//
// The log is built once, written straight into the store with StoreLogs in
// big batches, and cached under the system temp dir
// (gpuplane-replay-bench-wal-<n>), so only the first run pays for it (about a
// minute). Run with `make bench-replay`.
func BenchmarkReplay(b *testing.B) {
	n := uint64(replayEntries)
	if s := os.Getenv("GPUPLANE_REPLAY_ENTRIES"); s != "" {
		if _, err := fmt.Sscan(s, &n); err != nil {
			b.Fatalf("GPUPLANE_REPLAY_ENTRIES=%q: %v", s, err)
		}
	}
	dir := filepath.Join(os.TempDir(), fmt.Sprintf("gpuplane-replay-bench-wal-%d", n))
	if err := replaylog.Build(dir, cluster.LogDir(dir), n, cluster.NewRequestID); err != nil {
		b.Fatal(err)
	}
	off, err := OpenOffline(dir)
	if err != nil {
		b.Fatal(err)
	}
	last, err := off.LastIndex()
	if err != nil {
		off.Close()
		b.Fatal(err)
	}

	off.Close()

	// Each iteration opens the data dir afresh, as `audit replay --data-dir`
	// does: opening (mapping the file) is part of reading it from disk, and
	// a fresh mapping means no iteration reads pages an earlier one touched.
	var state *fsm.FSM
	b.ResetTimer()
	start, cpu0 := time.Now(), cpuTime()
	for b.Loop() {
		o, err := OpenOffline(dir)
		if err != nil {
			b.Fatal(err)
		}
		if state, err = o.StateAt(last); err != nil {
			b.Fatal(err)
		}
		if err := o.Close(); err != nil {
			b.Fatal(err)
		}
	}
	replay := time.Since(start) / time.Duration(b.N)
	// CPU time (all threads, GC included) tells the cost apart from the
	// machine's load, which on shared build machines stretches wall time.
	replayCPU := (cpuTime() - cpu0) / time.Duration(b.N)
	b.StopTimer()
	b.ReportMetric(float64(last)/replay.Seconds(), "entries/s")
	b.ReportMetric(replay.Seconds(), "s/replay")
	b.ReportMetric(replayCPU.Seconds(), "cpu-s/replay")

	// Snapshot restore of the replayed state, as raft does at start-up.
	data, err := state.Snapshot()
	if err != nil {
		b.Fatal(err)
	}
	restored := fsm.New()
	t0 := time.Now()
	if err := restored.RestoreFrom(bytes.NewReader(data)); err != nil {
		b.Fatal(err)
	}
	restore := time.Since(t0)
	if got := restored.Hash(); got != state.Hash() {
		b.Fatalf("restored hash %s, replayed %s", got, state.Hash())
	}
	b.ReportMetric(restore.Seconds(), "s/restore")
	b.ReportMetric(float64(len(data))/(1<<20), "MiB/snapshot")
	b.Logf("%d entries replayed in %v (%.0f entries/s, %v of CPU); snapshot %.1f MiB restored in %v; state %d accelerators, %d models, %d replicas",
		last, replay, float64(last)/replay.Seconds(), replayCPU, float64(len(data))/(1<<20), restore,
		len(state.Accelerators()), len(state.Models()), len(state.Replicas("", "")))
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
