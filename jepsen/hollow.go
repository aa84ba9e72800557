//go:build linux

package jepsen

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"connectrpc.com/connect"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// Bounds of the hollow fleet: each hollow process lives in a namespace of
// its own on the test subnet, and its nodes take ports from the hollow base
// ports up.
const (
	maxHollowNodes = 1000
	maxHollowProcs = 16
)

// HollowLayout spreads nodes hollow client nodes over procs `gpuplane agent
// --hollow` processes (as evenly as it goes, the first ones taking one more)
// and returns each process's count. 0 nodes: no process. procs 0: one
// process per 4 nodes, at most 2.
func HollowLayout(nodes, procs int) ([]int, error) {
	if nodes < 0 || nodes > maxHollowNodes {
		return nil, fmt.Errorf("-jepsen.hollow: must be 0 to %d hollow nodes, got %d", maxHollowNodes, nodes)
	}
	if procs < 0 || procs > maxHollowProcs {
		return nil, fmt.Errorf("-jepsen.hollow-procs: must be 0 (automatic) to %d processes, got %d", maxHollowProcs, procs)
	}
	if nodes == 0 {
		if procs > 0 {
			return nil, fmt.Errorf("-jepsen.hollow-procs: %d processes but -jepsen.hollow is 0: give -jepsen.hollow too", procs)
		}
		return nil, nil
	}
	if procs == 0 {
		procs = min(2, (nodes+3)/4)
	}
	if procs > nodes {
		return nil, fmt.Errorf("-jepsen.hollow-procs: %d processes for %d hollow nodes: each process runs at least one", procs, nodes)
	}
	out := make([]int, procs)
	for i := range out {
		out[i] = nodes / procs
		if i < nodes%procs {
			out[i]++
		}
	}
	return out, nil
}

// placementInvariants checks one replayed state for what the state machine
// keeps true of every placement, whoever proposed it: each replica appears
// once, a placed replica is on a registered node that is alive (a node that
// goes down or leaves has its replicas unplaced in the same entry), on
// cards that node has, each card listed once, and a replica without a node
// is pending, holding no endpoint.
func placementInvariants(st *pb.ReplayResponse) error {
	nodes := map[string]*pb.Node{}
	for _, n := range st.GetNodes() {
		nodes[n.GetName()] = n
	}
	type rk struct {
		model string
		index uint32
	}
	seen := map[rk]bool{}
	var errs []error
	for _, r := range st.GetReplicas() {
		k := rk{r.GetModel(), r.GetIndex()}
		id := fmt.Sprintf("%s/%d", k.model, k.index)
		if seen[k] {
			errs = append(errs, fmt.Errorf("replica %s listed twice", id))
			continue
		}
		seen[k] = true
		if r.GetNode() == "" {
			if r.GetState() != pb.ReplicaState_REPLICA_STATE_PENDING || r.GetEndpoint() != "" {
				errs = append(errs, fmt.Errorf("replica %s has no node but is %s with endpoint %q", id, r.GetState(), r.GetEndpoint()))
			}
			continue
		}
		n := nodes[r.GetNode()]
		switch {
		case n == nil:
			errs = append(errs, fmt.Errorf("replica %s placed on %s, which is not registered", id, r.GetNode()))
			continue
		case n.GetStatus() != pb.NodeStatus_NODE_STATUS_ALIVE:
			errs = append(errs, fmt.Errorf("replica %s placed on %s, which is %s", id, r.GetNode(), n.GetStatus()))
		}
		for j, idx := range r.GetCards() {
			if slices.Contains(r.GetCards()[:j], idx) {
				errs = append(errs, fmt.Errorf("replica %s lists card %s/%d twice", id, r.GetNode(), idx))
			}
			if !slices.ContainsFunc(n.GetCards(), func(c *pb.Card) bool { return c.GetIndex() == idx }) {
				errs = append(errs, fmt.Errorf("replica %s on card %s/%d, which the node does not have", id, r.GetNode(), idx))
			}
		}
	}
	return errors.Join(errs...)
}

// CheckNodeReports checks, from the log alone, that what the client nodes
// reported follows what was placed on them. A node learns its replicas
// from its event stream, so every ReplicaStatus it proposes must name a
// replica that an earlier, applied PlaceReplicas put on that node at that
// generation (else its stream showed it a placement the log never had: a
// phantom or a foreign history), a node reports only for itself, and a
// report the state machine accepted must match the replica's last applied
// placement (the only entry that sets a replica's node). hollow names the
// hollow nodes, whose reports are counted apart.
func CheckNodeReports(log []*pb.Event, hollow map[string]bool) Verdict {
	const name = "node-reports"
	type rk struct {
		model string
		index uint32
	}
	type at struct {
		node       string
		generation uint64
	}
	last := map[rk]at{}
	placed := map[rk]map[at]uint64{} // every placement, with its first index
	var problems []string
	var reports, hollowReports, hollowAccepted, hollowStale, hollowDown int
	hollowWith := map[string]bool{}
	for _, e := range log {
		env := e.GetEnvelope()
		// A duplicate request is answered with its first application's
		// result and changes nothing: it is not applied again.
		ok := e.GetResult().GetCode() == pb.Code_CODE_OK && !e.GetResult().GetDuplicate()
		if ns := env.GetSetNodeStatus(); ns != nil && ok && hollow[ns.GetNode()] && ns.GetStatus() == pb.NodeStatus_NODE_STATUS_DOWN {
			hollowDown++
		}
		if p := env.GetPlaceReplicas(); p != nil && ok {
			for _, pl := range p.GetPlacements() {
				k, a := rk{pl.GetModel(), pl.GetReplica()}, at{pl.GetNode(), pl.GetGeneration()}
				last[k] = a
				if placed[k] == nil {
					placed[k] = map[at]uint64{}
				}
				if _, seen := placed[k][a]; !seen {
					placed[k][a] = e.GetIndex()
				}
			}
			continue
		}
		st := env.GetReplicaStatus()
		if st == nil {
			continue
		}
		reports++
		k, a := rk{st.GetModel(), st.GetReplica()}, at{st.GetNode(), st.GetGeneration()}
		id := fmt.Sprintf("%s/%d", k.model, k.index)
		if hollow[a.node] {
			hollowReports++
			hollowWith[a.node] = true
			if ok {
				hollowAccepted++
			} else {
				hollowStale++
			}
		}
		if actor, isNode := strings.CutPrefix(e.GetActor(), "node/"); isNode && actor != a.node {
			problems = append(problems, fmt.Sprintf("index %d: node %s reported for node %s (replica %s)", e.GetIndex(), actor, a.node, id))
		}
		if _, was := placed[k][a]; !was {
			problems = append(problems, fmt.Sprintf("index %d: %s reported replica %s generation %d %s, never placed on it at that generation before",
				e.GetIndex(), a.node, id, a.generation, st.GetState()))
			continue
		}
		if ok && last[k] != a {
			problems = append(problems, fmt.Sprintf("index %d: the report of %s for replica %s generation %d was accepted, but its last placement was on %q at generation %d",
				e.GetIndex(), a.node, id, a.generation, last[k].node, last[k].generation))
		}
	}
	if len(problems) > 0 {
		return fail(name, "%d of %d reports do not follow the placements: %s", len(problems), reports, strings.Join(first(problems, 5), "; "))
	}
	if len(hollow) > 0 && hollowReports == 0 {
		return fail(name, "the %d hollow nodes reported nothing in %d reports: none was placed anything, or none saw it", len(hollow), reports)
	}
	v := pass(name, "all %d reports name a replica placed on their node before at their generation, accepted ones its last placement", reports)
	if len(hollow) > 0 {
		v.Detail += fmt.Sprintf("; hollow nodes: %d reports from %d of %d nodes (%d accepted, %d rejected as stale), marked down %d times",
			hollowReports, len(hollowWith), len(hollow), hollowAccepted, hollowStale, hollowDown)
	}
	return v
}

// namesNode reports whether a node's filtered stream must carry e: a
// membership change, or a command the log names the node in.
func namesNode(e *pb.Event, node string) bool {
	return e.GetType() == pb.EventType_EVENT_TYPE_MEMBERSHIP || slices.Contains(e.GetResources(), "node/"+node)
}

// lastNaming is the index of the last event of log a node's stream must
// carry (0: none).
func lastNaming(log []*pb.Event, node string) uint64 {
	for i := len(log) - 1; i >= 0; i-- {
		if namesNode(log[i], node) {
			return log[i].GetIndex()
		}
	}
	return 0
}

// checkNodeStream compares what a node's filtered event stream delivered
// (across its restarts) with the log: strictly increasing indexes, each
// the log's entry at that index (same hash: no entry of another history,
// none uncommitted), and, up to the log's last entry, every entry that
// names the node or changes membership (no gap). The stream may carry more:
// entries that changed the node's replicas without naming it.
func checkNodeStream(node string, got, log []*pb.Event) error {
	byIndex := make(map[uint64]*pb.Event, len(log))
	for _, e := range log {
		byIndex[e.GetIndex()] = e
	}
	end := uint64(0)
	if len(log) > 0 {
		end = log[len(log)-1].GetIndex()
	}
	delivered := map[uint64]bool{}
	var prev uint64
	for i, g := range got {
		idx := g.GetIndex()
		if i > 0 && idx <= prev {
			return fmt.Errorf("%s's stream went from index %d back to %d (a repeat or reordering)", node, prev, idx)
		}
		prev = idx
		if idx > end {
			break // committed after the log was fetched
		}
		e, ok := byIndex[idx]
		switch {
		case !ok:
			return fmt.Errorf("%s's stream delivered index %d, which is no event of the log", node, idx)
		case e.GetHash() != g.GetHash():
			return fmt.Errorf("%s's stream delivered index %d with hash %.12s, the log's is %.12s", node, idx, g.GetHash(), e.GetHash())
		}
		delivered[idx] = true
	}
	for _, e := range log {
		if namesNode(e, node) && !delivered[e.GetIndex()] {
			return fmt.Errorf("%s's stream missed index %d (%s), which names it", node, e.GetIndex(), e.GetSummary())
		}
	}
	return nil
}

// CheckNodeStreams checks each hollow node's followed stream (watchers,
// by node) against the log with checkNodeStream.
func CheckNodeStreams(watchers map[string]*EventWatcher, log []*pb.Event) Verdict {
	const name = "node-streams"
	if len(watchers) == 0 {
		return skipped(name, "no hollow nodes")
	}
	nodes := make([]string, 0, len(watchers))
	for n := range watchers {
		nodes = append(nodes, n)
	}
	sort.Strings(nodes)
	var problems []string
	events, starts := 0, 0
	for _, n := range nodes {
		w := watchers[n]
		w.mu.Lock()
		got, err, resumes := w.got, w.err, w.resumes
		w.mu.Unlock()
		if err != nil {
			return skipped(name, "the binary has no EventService.Watch: %v", err)
		}
		events += len(got)
		starts += resumes + 1
		if err := checkNodeStream(n, got, log); err != nil {
			problems = append(problems, err.Error())
		}
	}
	if len(problems) > 0 {
		return fail(name, "%d of %d hollow nodes' streams part from the log: %s", len(problems), len(nodes), strings.Join(first(problems, 5), "; "))
	}
	return pass(name, "%d hollow nodes' streams (%d events, %d stream (re)starts) are the log's entries naming them, in order, none missing or repeated",
		len(nodes), events, starts)
}

// CheckHollowRunning waits (up to timeout) until every replica placed on a
// hollow node is reported Running by it, at its current generation, with
// the hollow engine's endpoint: after the faults are healed, each hollow
// node's stream and reports must catch up with what the log placed on it.
func CheckHollowRunning(ctx context.Context, cl *Clients, hollow map[string]bool, timeout time.Duration) Verdict {
	const name = "hollow-running"
	if len(hollow) == 0 {
		return skipped(name, "no hollow nodes")
	}
	start := time.Now()
	deadline := start.Add(timeout)
	var last error
	var onHollow, nodesWith int
	for {
		onHollow, nodesWith, last = hollowRunning(ctx, cl, hollow)
		if last == nil || time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
		sleep(ctx, time.Second)
	}
	if last != nil {
		return fail(name, "%s after heal: %v", time.Since(start).Round(100*time.Millisecond), last)
	}
	return pass(name, "all %d replicas on %d of %d hollow nodes Running at their generation, %s after the other checks began",
		onHollow, nodesWith, len(hollow), time.Since(start).Round(100*time.Millisecond))
}

func hollowRunning(ctx context.Context, cl *Clients, hollow map[string]bool) (int, int, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	res, err := cl.Models.ListReplicas(ctx, connect.NewRequest(&pb.ListReplicasRequest{}))
	if err != nil {
		return 0, 0, fmt.Errorf("list replicas: %w", err)
	}
	var behind []string
	n := 0
	with := map[string]bool{}
	for _, r := range res.Msg.GetReplicas() {
		if !hollow[r.GetNode()] {
			continue
		}
		n++
		with[r.GetNode()] = true
		want := fmt.Sprintf("/hollow/%s/%d", r.GetModel(), r.GetIndex())
		if r.GetState() != pb.ReplicaState_REPLICA_STATE_RUNNING || !strings.HasSuffix(r.GetEndpoint(), want) {
			behind = append(behind, fmt.Sprintf("%s/%d on %s is %s (endpoint %q)", r.GetModel(), r.GetIndex(), r.GetNode(), r.GetState(), r.GetEndpoint()))
		}
	}
	if len(behind) > 0 {
		return n, len(with), fmt.Errorf("%d of %d replicas on hollow nodes not Running: %s", len(behind), n, strings.Join(first(behind, 5), "; "))
	}
	return n, len(with), nil
}
