//go:build linux

package jepsen

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/anishathalye/porcupine"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// Verdict is one checker's finding.
type Verdict struct {
	Name    string `json:"name"`
	Pass    bool   `json:"pass"`
	Skipped bool   `json:"skipped,omitempty"`
	Detail  string `json:"detail"`
}

// String is "pass", "FAIL" or "skipped" with the detail.
func (v Verdict) String() string {
	switch {
	case v.Skipped:
		return fmt.Sprintf("%-18s skipped: %s", v.Name, v.Detail)
	case v.Pass:
		return fmt.Sprintf("%-18s pass: %s", v.Name, v.Detail)
	}
	return fmt.Sprintf("%-18s FAIL: %s", v.Name, v.Detail)
}

func pass(name, format string, args ...any) Verdict {
	return Verdict{Name: name, Pass: true, Detail: fmt.Sprintf(format, args...)}
}

func fail(name, format string, args ...any) Verdict {
	return Verdict{Name: name, Detail: fmt.Sprintf(format, args...)}
}

func skipped(name, format string, args ...any) Verdict {
	return Verdict{Name: name, Pass: true, Skipped: true, Detail: fmt.Sprintf(format, args...)}
}

// unimplemented reports whether err says the server lacks the RPC (a
// feature that has not landed in the binary under test).
func unimplemented(err error) bool { return connect.CodeOf(err) == connect.CodeUnimplemented }

// FetchLog reads a server's whole committed log through AuditService.Log.
func FetchLog(ctx context.Context, cl *Clients) ([]*pb.Event, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	stream, err := cl.Audit.Log(ctx, connect.NewRequest(&pb.LogRequest{FromIndex: 1}))
	if err != nil {
		return nil, err
	}
	defer stream.Close()
	var events []*pb.Event
	for stream.Receive() {
		events = append(events, stream.Msg().GetEvent())
	}
	return events, stream.Err()
}

// ResolveUnknown settles each indeterminate write from the log by its
// request id: applied (ok, effect time still unknown), rejected (fail), or
// absent from the final log (never applied: dropped from the history).
// Indeterminate reads are dropped (they have no effect). It returns the
// history to check.
func ResolveUnknown(ops []*Op, log []*pb.Event, counts *Counts) []*Op {
	byID := map[string]*pb.Event{}
	for _, e := range log {
		if id := e.GetRequestId(); id != "" {
			if _, seen := byID[id]; !seen {
				byID[id] = e
			}
		}
	}
	var out []*Op
	for _, o := range ops {
		counts.Attempted++
		switch o.Outcome {
		case Ok:
			counts.Acknowledged++
		case Fail:
			counts.Failed++
		case Unknown:
			counts.Indeterminate++
		}
		if !o.IsWrite() && o.Outcome == Fail {
			continue // a read that failed observed nothing
		}
		if o.Outcome != Unknown {
			out = append(out, o)
			continue
		}
		if !o.IsWrite() {
			o.Resolved = "read: dropped"
			continue
		}
		e, ok := byID[o.RequestID]
		switch {
		case !ok:
			counts.ResolvedAbsent++
			o.Resolved = "not in the log: never applied"
			continue
		case e.GetResult().GetCode() == pb.Code_CODE_OK:
			counts.ResolvedApplied++
			o.Outcome, o.Index, o.Resolved = Ok, e.GetIndex(), fmt.Sprintf("applied at index %d", e.GetIndex())
		default:
			counts.ResolvedRejected++
			o.Outcome, o.Index, o.Resolved = Fail, e.GetIndex(), fmt.Sprintf("rejected at index %d: %s", e.GetIndex(), e.GetResult().GetMessage())
		}
		out = append(out, o)
	}
	return out
}

// registerState is one key's state: absent, or present with a value.
type registerState struct {
	Exists bool
	Value  uint32
}

// registerModel is the sequential specification of a key: accelerators
// (create fails when present, delete when absent) and deployments (put
// always succeeds). Operations with an unknown outcome keep an infinite
// return time and may take effect at any point after their call, including
// never (at the end).
var registerModel = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		var keys []string
		for _, op := range history {
			k := op.Input.(*Op).Key
			if _, ok := byKey[k]; !ok {
				keys = append(keys, k)
			}
			byKey[k] = append(byKey[k], op)
		}
		sort.Strings(keys)
		var out [][]porcupine.Operation
		for _, k := range keys {
			out = append(out, byKey[k])
		}
		return out
	},
	Init: func() any { return registerState{} },
	Step: func(state, input, _ any) (bool, any) {
		s, o := state.(registerState), input.(*Op)
		switch o.Kind {
		case OpCreate:
			switch {
			case o.Outcome == Unknown:
				return true, registerState{Exists: true}
			case o.Outcome == Ok:
				return !s.Exists, registerState{Exists: true}
			case o.Code == connect.CodeAlreadyExists.String():
				return s.Exists, s
			}
			return true, s
		case OpDelete, OpModelDelete:
			switch {
			case o.Outcome == Unknown:
				return true, registerState{}
			case o.Outcome == Ok:
				return s.Exists, registerState{}
			case o.Code == connect.CodeNotFound.String():
				return !s.Exists, s
			}
			return true, s
		case OpPut:
			if o.Outcome == Fail {
				return true, s
			}
			return true, registerState{Exists: true, Value: o.Value}
		case OpRead:
			return o.Found == s.Exists, s
		case OpModelRead:
			return o.Found == s.Exists && (!o.Found || o.Value == s.Value), s
		}
		return false, s
	},
	DescribeOperation: func(input, _ any) string {
		o := input.(*Op)
		switch o.Kind {
		case OpRead:
			return fmt.Sprintf("read(%s) → found=%v via %s", o.Key, o.Found, o.Node)
		case OpModelRead:
			return fmt.Sprintf("read(%s) → found=%v replicas=%d via %s", o.Key, o.Found, o.Value, o.Node)
		case OpPut:
			return fmt.Sprintf("put(%s, %d) → %s %s via %s", o.Key, o.Value, o.Outcome, o.Resolved, o.Node)
		}
		return fmt.Sprintf("%s(%s) → %s %s %s via %s", o.Kind, o.Key, o.Outcome, o.Code, o.Resolved, o.Node)
	},
	DescribeState: func(state any) string {
		s := state.(registerState)
		if !s.Exists {
			return "absent"
		}
		if s.Value != 0 {
			return fmt.Sprintf("present (%d replicas)", s.Value)
		}
		return "present"
	},
}

// CheckLinearizable runs porcupine over the resolved history, partitioned
// by key, and writes the visualisation to outDir when it finds a violation
// (or runs out of time).
func CheckLinearizable(ops []*Op, outDir string, timeout time.Duration) Verdict {
	const name = "linearizable"
	hist := make([]porcupine.Operation, 0, len(ops))
	for _, o := range ops {
		hist = append(hist, porcupine.Operation{ClientId: o.Process, Input: o, Output: o, Call: o.Call, Return: o.Return})
	}
	res, info := porcupine.CheckOperationsVerbose(registerModel, hist, timeout)
	keys := map[string]bool{}
	for _, o := range ops {
		keys[o.Key] = true
	}
	switch res {
	case porcupine.Ok:
		return pass(name, "%d operations on %d keys", len(ops), len(keys))
	case porcupine.Illegal:
		path := filepath.Join(outDir, "linearizability.html")
		if err := porcupine.VisualizePath(registerModel, info, path); err != nil {
			path = "(visualisation failed: " + err.Error() + ")"
		}
		return fail(name, "%d operations on %d keys are not linearizable (%s); see %s", len(ops), len(keys), strings.Join(illegalKeys(hist, timeout), ", "), path)
	}
	path := filepath.Join(outDir, "linearizability-partial.html")
	porcupine.VisualizePath(registerModel, info, path)
	return fail(name, "porcupine gave up after %s on %d operations (inconclusive); partial linearizations in %s", timeout, len(ops), path)
}

// illegalKeys names each key whose history alone is not linearizable, with
// the operation at which it first fails: the shortest prefix, in call order,
// that porcupine rejects ends with it.
func illegalKeys(hist []porcupine.Operation, timeout time.Duration) []string {
	var out []string
	for _, part := range registerModel.Partition(hist) {
		if porcupine.CheckOperationsTimeout(registerModel, part, timeout) != porcupine.Illegal {
			continue
		}
		slices.SortFunc(part, func(a, b porcupine.Operation) int { return cmp.Compare(a.Call, b.Call) })
		lo, hi := 1, len(part)
		for lo < hi {
			m := (lo + hi) / 2
			if porcupine.CheckOperationsTimeout(registerModel, part[:m], timeout) == porcupine.Illegal {
				hi = m
			} else {
				lo = m + 1
			}
		}
		o := part[lo-1].Input.(*Op)
		out = append(out, fmt.Sprintf("%s first fails at operation %d, %s(%s) via %s by worker %d: %s %s",
			o.Key, o.ID, o.Kind, o.Key, o.Node, o.Worker, o.Outcome, o.Code))
	}
	return out
}

// CheckAckedWrites checks that every acknowledged write that reported a log
// index is in the final log with a successful result.
func CheckAckedWrites(ops []*Op, log []*pb.Event) Verdict {
	const name = "acked-writes"
	byID := map[string]*pb.Event{}
	for _, e := range log {
		if _, ok := byID[e.GetRequestId()]; !ok {
			byID[e.GetRequestId()] = e
		}
	}
	var missing []string
	n := 0
	for _, o := range ops {
		if !o.IsWrite() || o.Outcome != Ok || o.Resolved != "" || o.Index == 0 {
			continue
		}
		n++
		e, ok := byID[o.RequestID]
		switch {
		case !ok:
			missing = append(missing, fmt.Sprintf("%s(%s) request %s acknowledged at index %d is not in the log", o.Kind, o.Key, o.RequestID, o.Index))
		case e.GetResult().GetCode() != pb.Code_CODE_OK:
			missing = append(missing, fmt.Sprintf("%s(%s) request %s acknowledged but the log says %s", o.Kind, o.Key, o.RequestID, e.GetResult().GetMessage()))
		}
	}
	if len(missing) > 0 {
		return fail(name, "%d of %d acknowledged writes missing: %s", len(missing), n, strings.Join(first(missing, 5), "; "))
	}
	return pass(name, "all %d acknowledged writes are in the log", n)
}

func first(s []string, n int) []string {
	if len(s) > n {
		return append(s[:n:n], fmt.Sprintf("… %d more", len(s)-n))
	}
	return s
}

// CheckReplayed replays the log (with the binary's own replay, through
// AuditService.Replay) to every index where a PlaceReplicas entry was
// applied, the only command that adds load to a card, and to the end, and
// checks rule 11 (verdict rule-11) and the placement invariants
// (placementInvariants, verdict placements) independently of the state
// machine in each state. Each replay starts from index 1, so past maxStates
// (0: no limit) it replays an evenly spaced sample of those indexes, and
// says so.
func CheckReplayed(ctx context.Context, cl *Clients, log []*pb.Event, maxStates int) []Verdict {
	const name, pname = "rule-11", "placements"
	start := time.Now()
	var at []uint64
	for _, e := range log {
		if e.GetEnvelope().GetPlaceReplicas() != nil && e.GetResult().GetCode() == pb.Code_CODE_OK {
			at = append(at, e.GetIndex())
		}
	}
	total := len(at)
	if maxStates > 0 && len(at) > maxStates {
		sample := make([]uint64, 0, maxStates)
		for i := range maxStates {
			sample = append(sample, at[i*len(at)/maxStates])
		}
		at = sample
	}
	if len(log) > 0 {
		at = append(at, log[len(log)-1].GetIndex())
	}
	at = slices.Compact(at)
	what := fmt.Sprintf("all %d states after an applied PlaceReplicas, and the last", len(at))
	if len(at) < total+1 {
		what = fmt.Sprintf("%d states: an even sample of the %d after an applied PlaceReplicas, and the last", len(at), total)
	}
	var violations, misplaced []string
	var mu sync.Mutex
	var firstErr error
	sem := make(chan struct{}, 2)
	var wg sync.WaitGroup
	for _, idx := range at {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			cctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			res, err := cl.Audit.Replay(cctx, connect.NewRequest(&pb.ReplayRequest{Index: idx}))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if firstErr == nil {
					firstErr = fmt.Errorf("replay to %d: %w", idx, err)
				}
				return
			}
			if err := rule11(res.Msg); err != nil {
				violations = append(violations, fmt.Sprintf("after index %d: %v", idx, err))
			}
			if err := placementInvariants(res.Msg); err != nil {
				misplaced = append(misplaced, fmt.Sprintf("after index %d: %v", idx, err))
			}
		})
	}
	wg.Wait()
	sort.Strings(violations)
	sort.Strings(misplaced)
	verdict := func(name string, violations []string, held string) Verdict {
		switch {
		case len(violations) > 0:
			return fail(name, "%d of %d replayed states break it: %s", len(violations), len(at), strings.Join(first(violations, 5), "; "))
		case firstErr != nil && unimplemented(firstErr):
			return skipped(name, "the binary has no AuditService.Replay (audit replay not landed)")
		case firstErr != nil:
			return fail(name, "%v", firstErr)
		}
		return pass(name, "%s in %s (replayed in %s)", held, what, time.Since(start).Round(time.Second))
	}
	return []Verdict{
		verdict(name, violations, "held"),
		verdict(pname, misplaced, "each replica once, placed ones on alive registered nodes' own cards, the others pending,"),
	}
}

// rule11 checks docs/descriptors.md rule 11 on one replayed state: on each card the
// shares sum to ≤ 100 %, at most maxModels replicas, one accelerator per
// card, a dedicated card holds one replica, and every card is of the
// accelerator's device. It mirrors cluster/placer_test.go's checkRule11 on
// the API's shapes.
func rule11(st *pb.ReplayResponse) error {
	type use struct {
		milli    uint32
		replicas int
		accs     map[string]bool
	}
	nodes := map[string]*pb.Node{}
	for _, n := range st.GetNodes() {
		nodes[n.GetName()] = n
	}
	accs := map[string]*pb.AcceleratorSpec{}
	for _, a := range st.GetAccelerators() {
		accs[a.GetName()] = a.GetSpec()
	}
	cards := map[string]*use{}
	var errs []error
	for _, r := range st.GetReplicas() {
		if r.GetNode() == "" {
			if len(r.GetCards()) != 0 || r.GetShareMilli() != 0 {
				errs = append(errs, fmt.Errorf("pending replica %s/%d holds cards", r.GetModel(), r.GetIndex()))
			}
			continue
		}
		acc := accs[r.GetAccelerator()]
		if acc == nil {
			errs = append(errs, fmt.Errorf("replica %s/%d placed for missing accelerator %q", r.GetModel(), r.GetIndex(), r.GetAccelerator()))
			continue
		}
		for _, idx := range r.GetCards() {
			var card *pb.Card
			for _, c := range nodes[r.GetNode()].GetCards() {
				if c.GetIndex() == idx {
					card = c
				}
			}
			k := fmt.Sprintf("%s/%d", r.GetNode(), idx)
			if card == nil || card.GetDevice() != acc.GetDevice() {
				errs = append(errs, fmt.Errorf("replica %s/%d on card %s, not a %s", r.GetModel(), r.GetIndex(), k, acc.GetDevice()))
				continue
			}
			u := cards[k]
			if u == nil {
				u = &use{accs: map[string]bool{}}
				cards[k] = u
			}
			u.milli += r.GetShareMilli()
			u.replicas++
			u.accs[r.GetAccelerator()] = true
		}
	}
	keys := make([]string, 0, len(cards))
	for k := range cards {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		u := cards[k]
		for a := range u.accs {
			acc := accs[a]
			switch {
			case u.milli > 1000:
				errs = append(errs, fmt.Errorf("card %s over-committed: %d‰ of memory", k, u.milli))
			case len(u.accs) > 1:
				errs = append(errs, fmt.Errorf("card %s bound to %d accelerators", k, len(u.accs)))
			case acc.GetTenancy() == pb.Tenancy_TENANCY_SHARED && uint32(u.replicas) > acc.GetMaxModels():
				errs = append(errs, fmt.Errorf("card %s holds %d replicas, maxModels %d", k, u.replicas, acc.GetMaxModels()))
			case acc.GetTenancy() != pb.Tenancy_TENANCY_SHARED && u.replicas > 1:
				errs = append(errs, fmt.Errorf("dedicated card %s holds %d replicas", k, u.replicas))
			}
			break
		}
	}
	return errors.Join(errs...)
}

// CheckLogsAgree compares the servers' logs entry by entry (index, term,
// request id, and the hash chain head after the entry): each must be a
// prefix of the longest (they were fetched one after another while the
// leader's loops may still append), so all share one prefix and hash head
// at every index they both hold.
func CheckLogsAgree(logs map[string][]*pb.Event) Verdict {
	const name = "logs-agree"
	var names []string
	for n := range logs {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool { return len(logs[names[i]]) > len(logs[names[j]]) })
	if len(names) < 2 {
		return skipped(name, "fewer than two servers' logs fetched")
	}
	ref := logs[names[0]]
	if len(ref) == 0 {
		return fail(name, "%s returned an empty log", names[0])
	}
	var problems, lens []string
	for _, n := range names {
		l := logs[n]
		lens = append(lens, fmt.Sprintf("%s %d", n, len(l)))
		for i := range l {
			a, b := ref[i], l[i]
			if a.GetIndex() != b.GetIndex() || a.GetTerm() != b.GetTerm() || a.GetRequestId() != b.GetRequestId() || a.GetHash() != b.GetHash() {
				problems = append(problems, fmt.Sprintf("%s and %s part at event %d: index %d/%d term %d/%d hash %.12s/%.12s",
					names[0], n, i, a.GetIndex(), b.GetIndex(), a.GetTerm(), b.GetTerm(), a.GetHash(), b.GetHash()))
				break
			}
		}
	}
	if len(problems) > 0 {
		return fail(name, "%s", strings.Join(problems, "; "))
	}
	shortest := logs[names[len(names)-1]]
	common := shortest[len(shortest)-1]
	return pass(name, "%d servers' logs share one prefix (events: %s); equal hash head %.12s at index %d, the last they all hold",
		len(names), strings.Join(lens, ", "), common.GetHash(), common.GetIndex())
}

// CheckVerify runs AuditService.Verify (what `gpuplane audit verify` does)
// on a server.
func CheckVerify(ctx context.Context, cl *Clients) Verdict {
	const name = "audit-verify"
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	res, err := cl.Audit.Verify(ctx, connect.NewRequest(&pb.VerifyRequest{}))
	switch {
	case unimplemented(err):
		return skipped(name, "the binary has no AuditService.Verify (audit verify not landed)")
	case err != nil:
		return fail(name, "%v", err)
	case !res.Msg.GetOk():
		var p []string
		for _, s := range res.Msg.GetServers() {
			if !s.GetOk() {
				p = append(p, fmt.Sprintf("%s: %s", s.GetServer(), strings.Join(s.GetProblems(), ", ")))
			}
		}
		return fail(name, "first divergence at %d: %s", res.Msg.GetFirstDivergence(), strings.Join(p, "; "))
	}
	var parts []string
	for _, s := range res.Msg.GetServers() {
		parts = append(parts, fmt.Sprintf("%s@%d", s.GetServer(), s.GetAppliedIndex()))
	}
	return pass(name, "%d servers agree with the replay (%s)", len(res.Msg.GetServers()), strings.Join(parts, " "))
}

// CheckOfflineVerify runs `gpuplane audit verify --data-dir` on each
// stopped server's data dir.
func CheckOfflineVerify(ctx context.Context, bin string, servers []*Agent) Verdict {
	const name = "offline-verify"
	var problems []string
	for _, s := range servers {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		out, err := exec.CommandContext(ctx, bin, "audit", "verify", "--data-dir", s.DataDir).CombinedOutput()
		cancel()
		if err != nil {
			if strings.Contains(string(out), "unknown flag") {
				return skipped(name, "the binary has no `audit verify --data-dir` (offline audit not landed)")
			}
			problems = append(problems, fmt.Sprintf("%s: %v: %s", s.Name, err, strings.TrimSpace(string(out))))
		}
	}
	if len(problems) > 0 {
		return fail(name, "%s", strings.Join(problems, "; "))
	}
	return pass(name, "`audit verify --data-dir` passes on all %d stopped servers", len(servers))
}

// EventWatcher follows the event stream through the whole run, resuming on
// another server (from the index after the last event it received) whenever
// its stream breaks, as `gpuplane events --follow` does.
type EventWatcher struct {
	C *Cluster
	// Filter, when set, is the stream's filter (a node's: what that node's
	// executor follows).
	Filter *pb.EventFilter
	// Stall is how long a stream may deliver nothing before it is
	// abandoned for another server (0: 5 s).
	Stall   time.Duration
	mu      sync.Mutex
	got     []*pb.Event
	resumes int
	err     error
}

// Run follows until ctx ends.
func (w *EventWatcher) Run(ctx context.Context) {
	servers := w.C.Servers()
	for i := 0; ctx.Err() == nil; i++ {
		s := servers[i%len(servers)]
		from := w.next()
		err := w.follow(ctx, w.C.Client(s.Name), from)
		if unimplemented(err) {
			w.mu.Lock()
			w.err = err
			w.mu.Unlock()
			return
		}
		w.mu.Lock()
		w.resumes++
		w.mu.Unlock()
		sleep(ctx, 200*time.Millisecond)
	}
}

func (w *EventWatcher) next() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.got) == 0 {
		return 1
	}
	return w.got[len(w.got)-1].GetIndex() + 1
}

// follow reads one stream; a stream that delivers nothing for a while (its
// server partitioned or paused) is abandoned for another server.
func (w *EventWatcher) follow(ctx context.Context, cl *Clients, from uint64) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := cl.Events.Watch(ctx, connect.NewRequest(&pb.WatchRequest{FromIndex: from, Follow: true, Filter: w.Filter}))
	if err != nil {
		return err
	}
	defer stream.Close()
	stall := w.Stall
	if stall == 0 {
		stall = 5 * time.Second
	}
	alive := make(chan struct{}, 1)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-alive:
			case <-time.After(stall):
				cancel()
				return
			}
		}
	}()
	for stream.Receive() {
		select {
		case alive <- struct{}{}:
		default:
		}
		ev := stream.Msg().GetEvent()
		if ev == nil {
			continue // the empty answer a following stream may start with
		}
		w.mu.Lock()
		w.got = append(w.got, ev)
		w.mu.Unlock()
	}
	return stream.Err()
}

// Caught reports whether the watcher has seen index.
func (w *EventWatcher) Caught(index uint64) bool { return w.next() > index }

// Check compares what the watcher received with the log: the same events in
// the same order, none missing and none twice, up to the log's last entry.
func (w *EventWatcher) Check(log []*pb.Event) Verdict {
	const name = "events-gap-free"
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return skipped(name, "the binary has no EventService.Watch (events --follow not landed): %v", w.err)
	}
	if len(log) == 0 {
		return skipped(name, "empty log")
	}
	got := w.got
	for i, e := range log {
		if i >= len(got) {
			return fail(name, "stream stopped after %d of %d events (last index %d)", len(got), len(log), got[len(got)-1].GetIndex())
		}
		g := got[i]
		if g.GetIndex() != e.GetIndex() || g.GetHash() != e.GetHash() {
			return fail(name, "event %d of the stream is index %d (hash %.12s), the log has index %d (hash %.12s)", i, g.GetIndex(), g.GetHash(), e.GetIndex(), e.GetHash())
		}
	}
	// Events past the log's end were committed after it was fetched.
	return pass(name, "%d events in log order with no gap or repeat across %d stream (re)starts", len(log), w.resumes+1)
}

// CheckRequestWindow checks that request ids expired during the run when the
// servers' window is shorter than it: the state machine (cluster status on
// the leader) holds fewer ids than the log has distinct ones, and the window
// in force is the one the servers were given. Whether a retry was ever
// applied twice is the linearizability and acked-writes checks' business;
// this one proves that expiry happened while they ran.
func CheckRequestWindow(ctx context.Context, cl *Clients, log []*pb.Event, window time.Duration) Verdict {
	const name = "request-window"
	if window == 0 {
		return skipped(name, "the servers keep their default window (a day): no id expires in a run")
	}
	ids := map[string]bool{}
	var first, last time.Time
	for _, e := range log {
		if id := e.GetRequestId(); id != "" {
			ids[id] = true
		}
		if t := e.GetProposedAt(); t != nil {
			if first.IsZero() {
				first = t.AsTime()
			}
			last = t.AsTime()
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	st, err := cl.Cluster.Status(ctx, connect.NewRequest(&pb.StatusRequest{}))
	if err != nil {
		return fail(name, "cluster status: %v", err)
	}
	r := st.Msg.GetResources()
	switch {
	case r == nil:
		return fail(name, "cluster status reports no resources: the binary does not report its request table")
	case r.GetRequestWindow().AsDuration() != window:
		return fail(name, "the window in force is %s, the servers were given %s", r.GetRequestWindow().AsDuration(), window)
	case last.Sub(first) <= window:
		return fail(name, "the log spans %s of log time, not more than the %s window: nothing could expire", last.Sub(first).Round(time.Second), window)
	case r.GetRequestLive() >= uint64(len(ids)):
		return fail(name, "the state machine remembers %d request ids of the log's %d over %s of log time: none expired under a %s window",
			r.GetRequestLive(), len(ids), last.Sub(first).Round(time.Second), window)
	}
	return pass(name, "%d of the log's %d request ids remembered (%d held) after %s of log time under a %s window",
		r.GetRequestLive(), len(ids), r.GetRequestEntries(), last.Sub(first).Round(time.Second), window)
}
