//go:build linux

package jepsen

import (
	"errors"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// These run without root: they pin the checkers themselves, so that a
// passing jepsen run means something.

func TestLinearizabilityCatchesStaleRead(t *testing.T) {
	ops := []*Op{
		{Kind: OpCreate, Key: "reg-0", Outcome: Ok, Call: 0, Return: 10, Process: 0},
		{Kind: OpRead, Key: "reg-0", Outcome: Ok, Found: false, Call: 20, Return: 30, Process: 1},
	}
	if v := CheckLinearizable(ops, t.TempDir(), 10*time.Second); v.Pass {
		t.Fatalf("a read that missed an acknowledged create passed: %s", v)
	}
}

func TestLinearizabilityAllowsUnknownWrites(t *testing.T) {
	ops := []*Op{
		{Kind: OpCreate, Key: "reg-0", Outcome: Unknown, Call: 0, Return: never, Process: 0},
		{Kind: OpRead, Key: "reg-0", Outcome: Ok, Found: false, Call: 20, Return: 30, Process: 1},
		{Kind: OpRead, Key: "reg-0", Outcome: Ok, Found: true, Call: 40, Return: 50, Process: 2},
		{Kind: OpPut, Key: "dep-0", Value: 3, Outcome: Ok, Call: 0, Return: 10, Process: 3},
		{Kind: OpModelRead, Key: "dep-0", Value: 3, Found: true, Outcome: Ok, Call: 20, Return: 30, Process: 3},
	}
	if v := CheckLinearizable(ops, t.TempDir(), 10*time.Second); !v.Pass {
		t.Fatalf("a history with an indeterminate create that took effect late failed: %s", v)
	}
	ops[4].Value = 2
	ops[4].ID, ops[4].Node = 7, "s2"
	v := CheckLinearizable(ops, t.TempDir(), 10*time.Second)
	if v.Pass {
		t.Fatalf("a read of 2 replicas after an acknowledged put of 3 passed: %s", v)
	}
	// The verdict names the key and the operation where it first fails, not
	// the key whose history is fine.
	if !strings.Contains(v.Detail, "dep-0 first fails at operation 7, model-read(dep-0) via s2") || strings.Contains(v.Detail, "reg-0 first fails") {
		t.Fatalf("verdict does not name the failing key and operation: %s", v.Detail)
	}
}

// TestLinearizabilityStaleNotFound is the anomaly jepsen seed 585091768
// found: a worker's put is acknowledged, and its next request, a delete, is
// answered "not found" by a leader that had not applied the put yet.
func TestLinearizabilityStaleNotFound(t *testing.T) {
	ops := []*Op{
		{ID: 1, Kind: OpPut, Key: "dep-1", Value: 8, Outcome: Ok, Call: 0, Return: 10, Process: 4},
		{ID: 2, Kind: OpModelDelete, Key: "dep-1", Outcome: Fail, Code: connect.CodeNotFound.String(), Call: 11, Return: 20, Process: 4, Node: "c5"},
	}
	v := CheckLinearizable(ops, t.TempDir(), 10*time.Second)
	if v.Pass || !strings.Contains(v.Detail, "dep-1 first fails at operation 2") {
		t.Fatalf("a not-found delete right after an acknowledged put: %s", v)
	}
}

func TestClassify(t *testing.T) {
	refused := connect.NewError(connect.CodeUnavailable, &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)})
	for _, c := range []struct {
		err  error
		want string
	}{
		{nil, Ok},
		{connect.NewError(connect.CodeAlreadyExists, errors.New("exists")), Fail},
		{refused, Fail},
		{connect.NewError(connect.CodeUnavailable, errors.New("no leader")), Unknown},
		{connect.NewError(connect.CodeDeadlineExceeded, errors.New("timeout")), Unknown},
	} {
		op := &Op{Return: 5}
		classify(op, c.err)
		if op.Outcome != c.want {
			t.Errorf("classify(%v) = %s, want %s", c.err, op.Outcome, c.want)
		}
		if op.Outcome == Unknown && op.Return != never {
			t.Errorf("classify(%v): an unknown outcome keeps return %d, want never", c.err, op.Return)
		}
	}
}

func TestRule11CatchesOverCommit(t *testing.T) {
	st := &pb.ReplayResponse{
		Nodes:        []*pb.Node{{Name: "c4", Cards: []*pb.Card{{Index: 0, Device: "l4"}}}},
		Accelerators: []*pb.Accelerator{{Name: "pool", Spec: &pb.AcceleratorSpec{Device: "l4", Tenancy: pb.Tenancy_TENANCY_SHARED, MaxModels: 2}}},
		Replicas: []*pb.Replica{
			{Model: "dep-2", Index: 0, Accelerator: "pool", Node: "c4", Cards: []uint32{0}, ShareMilli: 600},
			{Model: "dep-1", Index: 0, Accelerator: "pool", Node: "c4", Cards: []uint32{0}, ShareMilli: 400},
		},
	}
	if err := rule11(st); err != nil {
		t.Fatalf("a card at exactly 100%% broke rule 11: %v", err)
	}
	st.Replicas[1].ShareMilli = 450
	if err := rule11(st); err == nil {
		t.Fatal("a card at 105% passed rule 11")
	}
	st.Replicas[1].ShareMilli = 100
	st.Replicas = append(st.Replicas, &pb.Replica{Model: "dep-0", Index: 0, Accelerator: "pool", Node: "c4", Cards: []uint32{0}, ShareMilli: 100})
	if err := rule11(st); err == nil {
		t.Fatal("three replicas on a maxModels-2 card passed rule 11")
	}
}

func TestLogsAgreeCatchesFork(t *testing.T) {
	ev := func(i uint64, hash string) *pb.Event { return &pb.Event{Index: i, Term: 1, Hash: hash} }
	logs := map[string][]*pb.Event{
		"s1": {ev(1, "a"), ev(2, "b"), ev(3, "c")},
		"s2": {ev(1, "a"), ev(2, "b")},
	}
	if v := CheckLogsAgree(logs); !v.Pass {
		t.Fatalf("a lagging prefix failed: %s", v)
	}
	logs["s3"] = []*pb.Event{ev(1, "a"), ev(2, "x")}
	if v := CheckLogsAgree(logs); v.Pass {
		t.Fatalf("a forked log passed: %s", v)
	}
}
