//go:build linux

package jepsen

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// Config is one run of the harness.
type Config struct {
	Bin      string // the gpuplane binary under test
	OutDir   string // history, report, agent logs, data dirs
	Seed     uint64
	Duration time.Duration // of the workload under faults
	Faults   []string
	Workers  int
	// StalePlans adds the stale-planner client (a plan every interval; 0:
	// none).
	StalePlans time.Duration
	// Hold is the longest a fault lasts; Quiet the longest pause between
	// faults.
	Hold, Quiet time.Duration
	// LinearizabilityTimeout bounds porcupine.
	LinearizabilityTimeout time.Duration
	// Rule11States bounds the states replayed for rule 11 (0: all).
	Rule11States int
	// RequestWindow is the servers' --request-window (0: their default, a
	// day). Shorter than the run, request ids expire during it, and the
	// request-window check requires that they did.
	RequestWindow time.Duration
	// Hollow is how many hollow client nodes join the cluster besides the
	// five agents, run by HollowProcs `gpuplane agent --hollow` processes
	// (0: automatic; HollowLayout), each in a namespace of its own that the
	// nemesis partitions, kills and pauses like any agent's.
	Hollow, HollowProcs int
	Logf                func(format string, args ...any)
}

// Report is what a run measured.
type Report struct {
	Seed       uint64         `json:"seed"`
	Faults     []string       `json:"faults"`
	Hollow     []int          `json:"hollow_processes,omitempty"`
	Duration   string         `json:"duration"`
	Ops        Counts         `json:"ops"`
	Injected   map[string]int `json:"faults_injected"`
	Records    []FaultRecord  `json:"fault_log"`
	Plans      map[string]int `json:"stale_plans"`
	Recovered  string         `json:"recovered"`
	Verdicts   []Verdict      `json:"verdicts"`
	OutDir     string         `json:"out_dir"`
	LogEntries int            `json:"log_entries"`
}

// Failed lists the checkers that failed.
func (r *Report) Failed() []string {
	var f []string
	for _, v := range r.Verdicts {
		if !v.Pass {
			f = append(f, v.Name)
		}
	}
	return f
}

// Verdict returns the named checker's verdict.
func (r *Report) Verdict(name string) (Verdict, bool) {
	for _, v := range r.Verdicts {
		if v.Name == name {
			return v, true
		}
	}
	return Verdict{}, false
}

// Row is the report as a row of README.md's results table.
func (r *Report) Row(workload string) string {
	var inj []string
	total := 0
	for k, n := range r.Injected {
		inj = append(inj, fmt.Sprintf("%s %d", k, n))
		total += n
	}
	sort.Strings(inj)
	var v []string
	for _, x := range r.Verdicts {
		s := "pass"
		switch {
		case x.Skipped:
			s = "skip"
		case !x.Pass:
			s = "FAIL"
		}
		v = append(v, x.Name+" "+s)
	}
	o := r.Ops
	return fmt.Sprintf("| %s | %s (seed %d) | %s | %d / %d / %d / %d (applied %d, rejected %d, never %d) | %d: %s | %s |",
		workload, strings.Join(r.Faults, ", "), r.Seed, r.Duration,
		o.Attempted, o.Acknowledged, o.Failed, o.Indeterminate, o.ResolvedApplied, o.ResolvedRejected, o.ResolvedAbsent,
		total, strings.Join(inj, ", "), strings.Join(v, ", "))
}

// Run runs one test: cluster up, workload and nemesis for cfg.Duration,
// heal, checks, teardown. Teardown happens on every path, including SIGINT
// and SIGTERM.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	logf := cfg.Logf
	hollow, err := HollowLayout(cfg.Hollow, cfg.HollowProcs)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.OutDir, 0o755); err != nil {
		return nil, err
	}
	// One run per machine: a second would tear down the first's network.
	lock, err := os.OpenFile(filepath.Join(os.TempDir(), "gpj.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return nil, fmt.Errorf("another jepsen run holds %s: one run at a time per machine", lock.Name())
	}
	CleanStale()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	var (
		mu       sync.Mutex
		cl       *Cluster
		tornDown bool
	)
	teardown := func() {
		mu.Lock()
		defer mu.Unlock()
		if tornDown {
			return
		}
		tornDown = true
		if cl != nil {
			cl.Close()
		}
		CleanStale()
	}
	defer teardown()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	go func() {
		select {
		case s := <-sigs:
			fmt.Fprintf(os.Stderr, "jepsen: %v: tearing down the test network\n", s)
			cancel()
			teardown()
			os.Exit(1)
		case <-ctx.Done():
		}
	}()

	logf("jepsen: seed %d, faults %v, %s, hollow nodes %v, out %s", cfg.Seed, cfg.Faults, cfg.Duration, hollow, cfg.OutDir)
	var agentArgs []string
	if cfg.RequestWindow > 0 {
		agentArgs = append(agentArgs, "--request-window", cfg.RequestWindow.String())
	}
	c, err := StartCluster(ctx, cfg.OutDir, cfg.Bin, hollow, agentArgs...)
	if err != nil {
		return nil, err
	}
	mu.Lock()
	cl = c
	mu.Unlock()
	logf("jepsen: cluster up: 3 servers, 2 clients, %d hollow nodes in %d processes", cfg.Hollow, len(hollow))
	hollowNodes := map[string]bool{}
	for _, a := range c.Hollow() {
		for _, n := range a.Nodes() {
			hollowNodes[n] = true
		}
	}

	rep := &Report{Seed: cfg.Seed, Faults: cfg.Faults, Hollow: hollow, Duration: cfg.Duration.String(), OutDir: cfg.OutDir, Injected: map[string]int{}, Plans: map[string]int{}}
	h := NewHistory()
	w := &Workload{C: c, H: h, Workers: cfg.Workers, Seed: cfg.Seed}
	if err := w.Setup(ctx); err != nil {
		return nil, err
	}
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	watcher := &EventWatcher{C: c}
	var watchWG sync.WaitGroup
	watchWG.Go(func() { watcher.Run(watchCtx) })
	// Each hollow node's stream, as its executor asks for it: filtered to
	// the node. Such a stream is often silent, so it moves to another
	// server only after a longer stall.
	nodeWatchers := map[string]*EventWatcher{}
	for n := range hollowNodes {
		nw := &EventWatcher{C: c, Filter: &pb.EventFilter{Node: n}, Stall: 15 * time.Second}
		nodeWatchers[n] = nw
		watchWG.Go(func() { nw.Run(watchCtx) })
	}

	runCtx, stopRun := context.WithTimeout(ctx, cfg.Duration)
	nem := &Nemesis{C: c, Faults: cfg.Faults, Seed: cfg.Seed, Hold: cfg.Hold, Quiet: cfg.Quiet, Log: logf}
	var wg sync.WaitGroup
	wg.Go(func() { w.Run(runCtx) })
	wg.Go(func() { nem.Run(runCtx) })
	if cfg.StalePlans > 0 {
		wg.Go(func() { w.StalePlanner(runCtx, cfg.StalePlans) })
	}
	wg.Wait()
	stopRun()
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	rep.Records = nem.Records
	for _, r := range nem.Records {
		rep.Injected[r.Kind]++
	}
	rep.Plans = map[string]int{"proposed": int(w.PlansProposed.Load()), "applied": int(w.PlansApplied.Load()),
		"rejected": int(w.PlansRejected.Load()), "unknown": int(w.PlansUnknown.Load())}
	if cfg.StalePlans > 0 {
		logf("jepsen: stale plans %v; first rejections: %q", rep.Plans, w.Rejections)
	}

	// Heal and let the cluster converge before reading the final state.
	logf("jepsen: workload done (%d operations, %d Raft connections through the delay proxies); healing", len(h.Ops()), c.ProxiedConns())
	healErr := c.Heal()
	recovered := pass("recovered", "healthy after heal")
	t0 := time.Now()
	if err := c.WaitHealthy(ctx, 2*time.Minute); err != nil || healErr != nil {
		recovered = fail("recovered", "cluster not healthy 2m after heal: %v %v", err, healErr)
	} else {
		recovered.Detail = fmt.Sprintf("one leader, equal applied index and hash on 3 servers, %d nodes alive %s after heal", len(c.Nodes()), time.Since(t0).Round(100*time.Millisecond))
	}
	rep.Recovered = recovered.Detail
	w.FinalReads(ctx, "s1")

	// Fetch every server's log once they agree.
	serverLogs, logErr := fetchLogs(ctx, c)
	ref := serverLogs["s1"]
	for _, l := range serverLogs {
		if len(l) > len(ref) {
			ref = l
		}
	}
	rep.LogEntries = len(ref)
	if len(ref) > 0 {
		deadline := time.Now().Add(30 * time.Second)
		for !watcher.Caught(ref[len(ref)-1].GetIndex()) && time.Now().Before(deadline) {
			time.Sleep(200 * time.Millisecond)
		}
		for n, nw := range nodeWatchers {
			for last := lastNaming(ref, n); !nw.Caught(last) && time.Now().Before(deadline); {
				time.Sleep(200 * time.Millisecond)
			}
		}
	}
	stopWatch()
	watchWG.Wait()

	ops := h.Ops()
	resolved := ResolveUnknown(ops, ref, &rep.Ops)
	rep.Verdicts = append(rep.Verdicts, recovered)
	if logErr != nil && unimplemented(logErr) {
		rep.Verdicts = append(rep.Verdicts, skipped("log", "the binary has no AuditService.Log (audit log not landed): unknown outcomes stay unknown"))
	} else if logErr != nil {
		rep.Verdicts = append(rep.Verdicts, fail("log", "fetch the servers' logs: %v", logErr))
	}
	logf("jepsen: checking %d operations against a log of %d events", len(resolved), len(ref))
	leader := c.Leader(ctx)
	if leader == "" {
		leader = "s1"
	}
	rep.Verdicts = append(rep.Verdicts,
		CheckLinearizable(resolved, cfg.OutDir, cfg.LinearizabilityTimeout),
		CheckAckedWrites(resolved, ref),
	)
	rep.Verdicts = append(rep.Verdicts, CheckReplayed(ctx, c.Client(leader), ref, cfg.Rule11States)...)
	rep.Verdicts = append(rep.Verdicts,
		CheckLogsAgree(serverLogs),
		CheckVerify(ctx, c.Client(leader)),
		CheckRequestWindow(ctx, c.Client(leader), ref, cfg.RequestWindow),
		watcher.Check(ref),
		CheckNodeReports(ref, hollowNodes),
	)
	if len(hollowNodes) > 0 {
		rep.Verdicts = append(rep.Verdicts,
			CheckNodeStreams(nodeWatchers, ref),
			CheckHollowRunning(ctx, c.Client(leader), hollowNodes, time.Minute),
		)
	}

	// Offline: stop the agents and verify each server's data dir.
	c.StopAll()
	rep.Verdicts = append(rep.Verdicts, CheckOfflineVerify(ctx, cfg.Bin, c.Servers()))

	for _, v := range rep.Verdicts {
		logf("jepsen: %s", v)
	}
	if err := h.WriteJSON(filepath.Join(cfg.OutDir, "history.jsonl")); err != nil {
		return rep, err
	}
	b, _ := json.MarshalIndent(rep, "", "  ")
	if err := os.WriteFile(filepath.Join(cfg.OutDir, "report.json"), b, 0o644); err != nil {
		return rep, err
	}
	if len(rep.Failed()) == 0 {
		c.removeDataDirs()
	}
	return rep, nil
}

// fetchLogs reads every server's log.
func fetchLogs(ctx context.Context, c *Cluster) (map[string][]*pb.Event, error) {
	logs := map[string][]*pb.Event{}
	var errs []error
	for _, s := range c.Servers() {
		l, err := FetchLog(ctx, c.Client(s.Name))
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", s.Name, err))
			continue
		}
		logs[s.Name] = l
	}
	return logs, errors.Join(errs...)
}
