//go:build linux

package jepsen

import (
	"strings"
	"testing"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// These run without root, like checks_test.go: they pin the hollow fleet's
// layout and the checkers over what hollow nodes observed.

func TestHollowLayout(t *testing.T) {
	for _, c := range []struct {
		nodes, procs int
		want         []int
	}{
		{0, 0, nil},
		{1, 0, []int{1}},
		{4, 0, []int{4}},
		{5, 0, []int{3, 2}},
		{8, 0, []int{4, 4}},
		{100, 0, []int{50, 50}},
		{7, 3, []int{3, 2, 2}},
		{3, 3, []int{1, 1, 1}},
	} {
		got, err := HollowLayout(c.nodes, c.procs)
		if err != nil {
			t.Fatalf("HollowLayout(%d, %d): %v", c.nodes, c.procs, err)
		}
		if len(got) != len(c.want) {
			t.Fatalf("HollowLayout(%d, %d) = %v, want %v", c.nodes, c.procs, got, c.want)
		}
		for i := range got {
			if got[i] != c.want[i] {
				t.Fatalf("HollowLayout(%d, %d) = %v, want %v", c.nodes, c.procs, got, c.want)
			}
		}
	}
	for _, c := range []struct {
		nodes, procs int
		flag         string
	}{
		{-1, 0, "-jepsen.hollow:"},
		{maxHollowNodes + 1, 0, "-jepsen.hollow:"},
		{4, -1, "-jepsen.hollow-procs:"},
		{4, maxHollowProcs + 1, "-jepsen.hollow-procs:"},
		{2, 3, "-jepsen.hollow-procs:"},
		{0, 2, "-jepsen.hollow-procs:"},
	} {
		_, err := HollowLayout(c.nodes, c.procs)
		if err == nil || !strings.HasPrefix(err.Error(), c.flag) {
			t.Errorf("HollowLayout(%d, %d) = %v, want an error naming %s", c.nodes, c.procs, err, c.flag)
		}
	}
}

// Log events for the checkers: placements, reports, node status.
func placeEv(idx uint64, code pb.Code, ps ...*pb.Placement) *pb.Event {
	var res []string
	for _, p := range ps {
		res = append(res, "model/"+p.Model, "node/"+p.Node)
	}
	return &pb.Event{Index: idx, Type: pb.EventType_EVENT_TYPE_COMMAND, Actor: "system", Resources: res, Hash: hashOf(idx),
		Envelope: &pb.Envelope{Command: &pb.Envelope_PlaceReplicas{PlaceReplicas: &pb.PlaceReplicas{Placements: ps}}},
		Result:   &pb.Result{Code: code}}
}

func place(model string, replica uint32, gen uint64, node string) *pb.Placement {
	return &pb.Placement{Model: model, Replica: replica, Generation: gen, Node: node, Cards: []uint32{0}}
}

func reportEv(idx uint64, actor, model string, replica uint32, gen uint64, node string, code pb.Code) *pb.Event {
	return &pb.Event{Index: idx, Type: pb.EventType_EVENT_TYPE_COMMAND, Actor: "node/" + actor, Resources: []string{"model/" + model, "node/" + node}, Hash: hashOf(idx),
		Envelope: &pb.Envelope{Command: &pb.Envelope_ReplicaStatus{ReplicaStatus: &pb.ReplicaStatus{
			Model: model, Replica: replica, Generation: gen, Node: node, State: pb.ReplicaState_REPLICA_STATE_RUNNING}}},
		Result: &pb.Result{Code: code}}
}

func hashOf(idx uint64) string { return strings.Repeat(string(rune('a'+idx%26)), 12) }

func TestNodeReportsCatchWhatNoPlacementExplains(t *testing.T) {
	const ok, stale = pb.Code_CODE_OK, pb.Code_CODE_FAILED_PRECONDITION
	hollow := map[string]bool{"h6-0000": true, "h6-0001": true}
	good := []*pb.Event{
		placeEv(1, ok, place("dep-0", 0, 1, "h6-0000"), place("dep-0", 1, 1, "c4")),
		reportEv(2, "h6-0000", "dep-0", 0, 1, "h6-0000", ok),
		reportEv(3, "c4", "dep-0", 1, 1, "c4", ok),
		// dep-0/0 moves to h6-0001 (its node went down in between); the old
		// node's late report is rejected, the new node's accepted.
		{Index: 4, Type: pb.EventType_EVENT_TYPE_COMMAND, Resources: []string{"node/h6-0000"}, Result: &pb.Result{Code: ok},
			Envelope: &pb.Envelope{Command: &pb.Envelope_SetNodeStatus{SetNodeStatus: &pb.SetNodeStatus{Node: "h6-0000", Status: pb.NodeStatus_NODE_STATUS_DOWN}}}},
		placeEv(5, ok, place("dep-0", 0, 1, "h6-0001")),
		reportEv(6, "h6-0000", "dep-0", 0, 1, "h6-0000", stale),
		reportEv(7, "h6-0001", "dep-0", 0, 1, "h6-0001", ok),
	}
	v := CheckNodeReports(good, hollow)
	if !v.Pass {
		t.Fatalf("reports that follow the placements failed: %s", v)
	}
	if !strings.Contains(v.Detail, "hollow nodes: 3 reports from 2 of 2 nodes (2 accepted, 1 rejected as stale), marked down 1 times") {
		t.Errorf("detail does not count the hollow nodes' reports: %s", v.Detail)
	}
	for name, bad := range map[string][]*pb.Event{
		"a report of a replica never placed on the node": append(good[:7:7],
			reportEv(8, "h6-0001", "dep-0", 1, 1, "h6-0001", stale)),
		"a report of a placement from a rejected plan": append(good[:7:7],
			placeEv(8, pb.Code_CODE_CONFLICT, place("dep-0", 1, 1, "h6-0000")),
			reportEv(9, "h6-0000", "dep-0", 1, 1, "h6-0000", stale)),
		"a report of a later generation than placed": append(good[:7:7],
			reportEv(8, "h6-0001", "dep-0", 0, 2, "h6-0001", stale)),
		"a report before its placement": {
			reportEv(1, "h6-0000", "dep-0", 0, 1, "h6-0000", ok),
			placeEv(2, ok, place("dep-0", 0, 1, "h6-0000")),
		},
		"an accepted report from the replica's old node": append(good[:5:5],
			reportEv(6, "h6-0000", "dep-0", 0, 1, "h6-0000", ok)),
		"a node reporting for another": append(good[:7:7],
			reportEv(8, "h6-0000", "dep-0", 0, 1, "h6-0001", ok)),
	} {
		if v := CheckNodeReports(bad, hollow); v.Pass {
			t.Errorf("%s passed: %s", name, v)
		}
	}
	// A retried plan whose request id was already applied is answered with
	// the first result (OK, marked duplicate) and moves nothing: the new
	// node's reports stay the accepted ones.
	dup := placeEv(8, ok, place("dep-0", 0, 1, "h6-0000"))
	dup.Result.Duplicate = true
	if v := CheckNodeReports(append(good[:7:7], dup, reportEv(9, "h6-0001", "dep-0", 0, 1, "h6-0001", ok)), hollow); !v.Pass {
		t.Errorf("a duplicate plan was taken as a placement: %s", v)
	}
	if v := CheckNodeReports(good[:1], hollow); v.Pass {
		t.Errorf("hollow nodes that reported nothing passed: %s", v)
	}
	if v := CheckNodeReports(good[:1], nil); !v.Pass {
		t.Errorf("a run without hollow nodes and without reports failed: %s", v)
	}
}

func TestPlacementInvariants(t *testing.T) {
	card := func(i uint32) *pb.Card { return &pb.Card{Index: i, Device: "l4"} }
	st := func() *pb.ReplayResponse {
		return &pb.ReplayResponse{
			Nodes: []*pb.Node{
				{Name: "h6-0000", Status: pb.NodeStatus_NODE_STATUS_ALIVE, Cards: []*pb.Card{card(0), card(1)}},
				{Name: "h6-0001", Status: pb.NodeStatus_NODE_STATUS_DOWN, Cards: []*pb.Card{card(0), card(1)}},
			},
			Replicas: []*pb.Replica{
				{Model: "dep-0", Index: 0, Node: "h6-0000", Cards: []uint32{1}, State: pb.ReplicaState_REPLICA_STATE_RUNNING, Endpoint: "http://x/hollow/dep-0/0"},
				{Model: "dep-0", Index: 1, State: pb.ReplicaState_REPLICA_STATE_PENDING},
			},
		}
	}
	if err := placementInvariants(st()); err != nil {
		t.Fatalf("a good state failed: %v", err)
	}
	for name, spoil := range map[string]func(*pb.ReplayResponse){
		"a replica on a down node":      func(s *pb.ReplayResponse) { s.Replicas[0].Node = "h6-0001" },
		"a replica on an unknown node":  func(s *pb.ReplayResponse) { s.Replicas[0].Node = "h9-0000" },
		"a replica on a card not there": func(s *pb.ReplayResponse) { s.Replicas[0].Cards = []uint32{2} },
		"a card listed twice":           func(s *pb.ReplayResponse) { s.Replicas[0].Cards = []uint32{1, 1} },
		"a replica listed twice":        func(s *pb.ReplayResponse) { s.Replicas = append(s.Replicas, s.Replicas[0]) },
		"a nodeless replica still runs": func(s *pb.ReplayResponse) { s.Replicas[1].State = pb.ReplicaState_REPLICA_STATE_RUNNING },
		"a nodeless replica's endpoint": func(s *pb.ReplayResponse) { s.Replicas[1].Endpoint = "http://x/hollow/dep-0/1" },
		"a replica placed twice, on both": func(s *pb.ReplayResponse) {
			s.Replicas[1] = &pb.Replica{Model: "dep-0", Index: 0, Node: "h6-0000", Cards: []uint32{0}}
		},
	} {
		s := st()
		spoil(s)
		if err := placementInvariants(s); err == nil {
			t.Errorf("%s passed", name)
		}
	}
}

func TestNodeStreamCheck(t *testing.T) {
	const node = "h6-0000"
	ok := pb.Code_CODE_OK
	log := []*pb.Event{
		placeEv(1, ok, place("dep-0", 0, 1, "c4")),
		placeEv(2, ok, place("dep-0", 1, 1, node)),
		{Index: 3, Type: pb.EventType_EVENT_TYPE_MEMBERSHIP, Hash: hashOf(3)},
		// Deleting the deployment changes the node's replicas without
		// naming it: the stream may carry it.
		{Index: 4, Type: pb.EventType_EVENT_TYPE_COMMAND, Resources: []string{"model/dep-0"}, Hash: hashOf(4)},
		reportEv(5, "c4", "dep-0", 0, 1, "c4", ok),
		reportEv(6, node, "dep-0", 1, 1, node, ok),
	}
	good := []*pb.Event{log[1], log[2], log[3], log[5], {Index: 7, Hash: "later"}}
	if err := checkNodeStream(node, good, log); err != nil {
		t.Fatalf("the log's entries naming the node, and more, failed: %v", err)
	}
	if err := checkNodeStream(node, []*pb.Event{log[1], log[2], log[5]}, log); err != nil {
		t.Fatalf("exactly the entries naming the node failed: %v", err)
	}
	for name, got := range map[string][]*pb.Event{
		"a missed placement":   {log[2], log[5]},
		"a missed membership":  {log[1], log[5]},
		"a missed last report": {log[1], log[2]},
		"a repeat":             {log[1], log[2], log[2], log[5]},
		"out of order":         {log[2], log[1], log[5]},
		"another history":      {log[1], log[2], {Index: 5, Hash: "forked"}, log[5]},
	} {
		if err := checkNodeStream(node, got, log); err == nil {
			t.Errorf("%s passed", name)
		}
	}
	lacking := []*pb.Event{log[0], log[1], log[2], log[4], log[5]}
	if err := checkNodeStream(node, good, lacking); err == nil {
		t.Error("an index the log lacks passed")
	}
	if lastNaming(log, node) != 6 || lastNaming(log[:5], node) != 3 {
		t.Errorf("lastNaming = %d, %d, want 6, 3", lastNaming(log, node), lastNaming(log[:5], node))
	}
}
