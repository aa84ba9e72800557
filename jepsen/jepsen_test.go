//go:build linux

package jepsen

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/internal/testbin"
)

var (
	enabled    = flag.Bool("jepsen", os.Getenv("GPUPLANE_JEPSEN") == "1", "run the jepsen tests (root; also GPUPLANE_JEPSEN=1)")
	seedFlag   = flag.Uint64("jepsen.seed", 0, "seed of the fault schedule and the workload (0: from the clock); printed by every run")
	duration   = flag.Duration("jepsen.duration", 2*time.Minute, "how long the workload runs under faults")
	faultsFlag = flag.String("jepsen.faults", "all", "faults to draw from: all, partition, or a comma-separated list of "+strings.Join(AllFaults, ", "))
	workers    = flag.Int("jepsen.workers", 8, "concurrent clients")
	hold       = flag.Duration("jepsen.hold", 8*time.Second, "longest a fault lasts")
	quiet      = flag.Duration("jepsen.quiet", 4*time.Second, "longest quiet spell between faults")
	stalePlans = flag.Duration("jepsen.stale-plans", 500*time.Millisecond, "interval of the stale-planner client's plans (0: off)")
	outFlag    = flag.String("jepsen.out", "", "output directory (default jepsen/out/<time>-<seed>)")
	binFlag    = flag.String("jepsen.bin", "", "gpuplane binary to test (default: build ./cmd/gpuplane)")
	linTimeout = flag.Duration("jepsen.lin-timeout", 2*time.Minute, "porcupine's time limit")
	reqWindow  = flag.Duration("jepsen.request-window", 0, "the servers' --request-window (0: their default, a day); shorter than the run, request ids expire during it")
	rule11Max  = flag.Int("jepsen.rule11-states", 1500, "most states replayed for the rule-11 check (0: every one)")
	hollowN    = flag.Int("jepsen.hollow", 0, "hollow client nodes to add (`gpuplane agent --hollow`), in namespaces of their own that the nemesis hits too")
	hollowP    = flag.Int("jepsen.hollow-procs", 0, "processes the hollow nodes run in (0: one per 4 nodes, at most 2)")
)

func moduleRoot(t *testing.T) string {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("cannot locate the module root")
	}
	return filepath.Join(filepath.Dir(file), "..")
}

func requireJepsen(t *testing.T) {
	t.Helper()
	if !*enabled {
		t.Skip("jepsen tests run only when asked: make jepsen, or go test ./jepsen -jepsen (as root)")
	}
	if why := Preflight(); why != "" {
		t.Skip(why)
	}
}

// buildBinary builds ./cmd/gpuplane with the given build tags into dir.
func buildBinary(t *testing.T, dir string, tags ...string) string {
	t.Helper()
	out := filepath.Join(dir, "gpuplane")
	if err := testbin.BuildTo(moduleRoot(t), out, tags...); err != nil {
		t.Fatal(err)
	}
	return out
}

func outDir(t *testing.T, seed uint64) string {
	if *outFlag != "" {
		return *outFlag
	}
	return filepath.Join(moduleRoot(t), "jepsen", "out", fmt.Sprintf("%s-%s-%d", time.Now().Format("20060102-150405"), t.Name(), seed))
}

func seed() uint64 {
	if *seedFlag != 0 {
		return *seedFlag
	}
	return uint64(time.Now().UnixNano()) % 1_000_000_000
}

// TestJepsen runs the workload under the seeded fault schedule and requires
// every checker to pass.
func TestJepsen(t *testing.T) {
	requireJepsen(t)
	faults, err := ParseFaults(*faultsFlag)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := HollowLayout(*hollowN, *hollowP); err != nil {
		t.Fatal(err)
	}
	s := seed()
	dir := outDir(t, s)
	bin := *binFlag
	if bin == "" {
		bin = buildBinary(t, t.TempDir())
	}
	t.Logf("seed %d (replay with -jepsen.seed %d); output in %s", s, s, dir)
	rep, err := Run(context.Background(), Config{
		Bin: bin, OutDir: dir, Seed: s, Duration: *duration, Faults: faults, Workers: *workers,
		StalePlans: *stalePlans, Hold: *hold, Quiet: *quiet, LinearizabilityTimeout: *linTimeout, Rule11States: *rule11Max, Logf: t.Logf,
		RequestWindow: *reqWindow, Hollow: *hollowN, HollowProcs: *hollowP,
	})
	if err != nil {
		t.Fatalf("seed %d: %v (agent logs in %s)", s, err, dir)
	}
	workload := "accelerators + deployments, stale plans"
	if *hollowN > 0 {
		workload += fmt.Sprintf(", %d hollow nodes", *hollowN)
	}
	t.Logf("results row:\n%s", rep.Row(workload))
	if f := rep.Failed(); len(f) > 0 {
		t.Errorf("seed %d: checkers failed: %s (history, report and agent logs in %s)", s, strings.Join(f, ", "), dir)
	}
}

// plantedBugFile is the test-only switch in the state machine: built with
// -tags jepsenbug it skips the capacity re-check of placements.
const plantedBugFile = "fsm/plantbug_jepsen.go"

// TestPlantedOverCommitIsCaught builds the binary with the planted bug (the
// state machine no longer re-checks a plan's card capacity at apply) and
// requires the rule-11 checker to report an over-commit: proof that the
// checker can fail. No network faults are needed: the stale planner's plans
// are enough.
func TestPlantedOverCommitIsCaught(t *testing.T) {
	requireJepsen(t)
	if _, err := os.Stat(filepath.Join(moduleRoot(t), plantedBugFile)); err != nil {
		t.Skipf("%s is missing: the planted bug needs the state machine's jepsenbug switch (see jepsen/README.md)", plantedBugFile)
	}
	s := seed()
	dir := outDir(t, s)
	bin := *binFlag
	if bin == "" {
		bin = buildBinary(t, t.TempDir(), "jepsenbug")
	}
	rep, err := Run(context.Background(), Config{
		Bin: bin, OutDir: dir, Seed: s, Duration: 20 * time.Second, Workers: 4,
		StalePlans: 200 * time.Millisecond, Hold: *hold, Quiet: *quiet, LinearizabilityTimeout: *linTimeout, Rule11States: *rule11Max, Logf: t.Logf,
	})
	if err != nil {
		t.Fatalf("seed %d: %v", s, err)
	}
	t.Logf("results row:\n%s", rep.Row("planted bug: capacity re-check skipped"))
	v, _ := rep.Verdict("rule-11")
	if v.Pass {
		t.Fatalf("seed %d: the planted over-commit bug went unnoticed: rule-11 says %q (stale plans %v)", s, v.Detail, rep.Plans)
	}
	t.Logf("caught: %s", v)
}
