package cluster

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/gpuplane/gpuplane/fsm"
	"github.com/gpuplane/gpuplane/internal/testutil"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

func TestSingleNodeApply(t *testing.T) {
	c, o := startDev(t)
	ctx := testCtx(t)

	if !c.IsLeader() {
		t.Fatal("a bootstrapped single node must lead")
	}
	if id, addr := c.Leader(); id != "n1" || addr != o.addr {
		t.Fatalf("Leader() = %q %q, want n1 %s", id, addr, o.addr)
	}

	reg := mustApply(t, c, registerNode("n1"))
	if reg.Outcome != pb.Outcome_OUTCOME_CREATED {
		t.Fatalf("register: %v", reg)
	}
	acc := mustApply(t, c, createAccelerator("standard"))
	if acc.Index <= reg.Index || acc.Outcome != pb.Outcome_OUTCOME_CREATED {
		t.Fatalf("create accelerator: %v after index %d", acc, reg.Index)
	}

	// The proposer fills in request id, actor and the leader's time.
	var l raft.Log
	if err := c.store.GetLog(acc.Index, &l); err != nil {
		t.Fatal(err)
	}
	var env pb.Envelope
	if err := proto.Unmarshal(l.Data, &env); err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(env.RequestId) || env.Actor != "system" ||
		time.Since(env.ProposedAt.AsTime()) > time.Minute {
		t.Fatalf("stored envelope: id %q actor %q proposed %v", env.RequestId, env.Actor, env.ProposedAt.AsTime())
	}

	// A repeated request id is answered with the first result and changes nothing.
	first := createAccelerator("fast")
	first.RequestId = "req-1"
	first.Actor = "alice"
	res1 := mustApply(t, c, first)
	again := createAccelerator("other")
	again.RequestId = "req-1"
	res2, err := c.Apply(ctx, again)
	if err != nil {
		t.Fatal(err)
	}
	if !res2.Duplicate || res2.Code != res1.Code || res2.Message != res1.Message || res1.Duplicate {
		t.Fatalf("duplicate request id: first %v, second %v", res1, res2)
	}
	err = c.Read(ctx, false, func(f *fsm.FSM) error {
		if _, ok := f.Accelerator("other"); ok {
			return errors.New(`the duplicate created accelerator "other"`)
		}
		if _, ok := f.Accelerator("fast"); !ok {
			return errors.New(`accelerator "fast" is missing`)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	// A rejected command is a result, not an error.
	dup, err := c.Apply(ctx, createAccelerator("standard"))
	if err != nil || dup.Code != pb.Code_CODE_ALREADY_EXISTS {
		t.Fatalf("create existing accelerator: %v, %v", dup, err)
	}
	empty, err := c.Apply(ctx, &pb.Envelope{})
	if err != nil || empty.Code != pb.Code_CODE_INVALID_ARGUMENT {
		t.Fatalf("envelope without command: %v, %v", empty, err)
	}

	// Dry runs check and persist nothing.
	before := c.LastIndex()
	dry, err := c.DryRun(ctx, createAccelerator("maybe"))
	if err != nil || dry.Code != pb.Code_CODE_OK || dry.Outcome != pb.Outcome_OUTCOME_CREATED {
		t.Fatalf("dry run: %v, %v", dry, err)
	}
	c.View(func(f *fsm.FSM) {
		if _, ok := f.Accelerator("maybe"); ok {
			t.Error("dry run created the accelerator")
		}
	})
	if c.LastIndex() > before+1 { // at most the read's once-per-term barrier
		t.Errorf("dry run grew the log from %d to %d", before, c.LastIndex())
	}

	st := c.Status()
	if st.Node != "n1" || st.Leader != "n1" || st.LeaderAddress != "127.0.0.1:7410" || st.Term == 0 ||
		st.RaftState != "Leader" || st.AppliedIndex < res2.Index || st.CommitIndex < st.AppliedIndex ||
		len(st.Servers) != 1 || st.Servers[0].Suffrage != "voter" || st.Servers[0].LastContactMs != 0 {
		t.Fatalf("status: %v", st)
	}
	c.View(func(f *fsm.FSM) {
		if st.StateHash != f.Hash() || f.AppliedIndex() != dup.Index {
			t.Errorf("status hash %s applied %d, state %s %d", st.StateHash, st.AppliedIndex, f.Hash(), f.AppliedIndex())
		}
	})

	if err := c.Shutdown(); err != nil {
		t.Fatal(err)
	}
	if err := c.Shutdown(); err != nil {
		t.Fatalf("second shutdown: %v", err)
	}
	if _, err := c.Apply(ctx, registerNode("late")); !errors.Is(err, ErrShutdown) {
		t.Fatalf("apply after shutdown: %v, want ErrShutdown", err)
	}
}

// TestRestart checks that a clean shutdown keeps every entry, that a single
// voter elects itself again without bootstrapping, and that start-up restores
// the latest snapshot and then replays only the entries after it.
func TestRestart(t *testing.T) {
	c, o := startDev(t)
	ctx := testCtx(t)
	mustApply(t, c, registerNode("n1"))
	for i := range 10 {
		mustApply(t, c, createAccelerator("a"+string(rune('a'+i))))
	}
	if err := c.raft.Snapshot().Error(); err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	atSnapshot, appliedAtSnapshot := hashOf(c), c.AppliedIndex()
	var last *pb.Result
	for i := range 5 {
		last = mustApply(t, c, createAccelerator("b"+string(rune('a'+i))))
	}
	final := hashOf(c)
	if err := c.Shutdown(); err != nil {
		t.Fatal(err)
	}

	// A data dir belongs to one node name.
	if _, err := New(Config{NodeName: "other", DataDir: o.dir, RaftBind: freeAddr(t), Server: true, Logger: testLogger()}); err == nil ||
		!strings.Contains(err.Error(), `belongs to node "n1"`) {
		t.Fatalf("open n1's data dir as other: %v", err)
	}

	o.bootstrap = false
	c = start(t, o)
	// The snapshot is restored before New returns; the entries after it are
	// applied only once the node has been elected and knows they committed.
	if got := hashOf(c); got != atSnapshot || c.AppliedIndex() != appliedAtSnapshot {
		t.Fatalf("after restart: hash %s applied %d, want the snapshot's %s %d", got, c.AppliedIndex(), atSnapshot, appliedAtSnapshot)
	}
	if err := c.Read(ctx, false, func(f *fsm.FSM) error {
		if f.Hash() != final || f.AppliedIndex() != last.Index || len(f.Accelerators()) != 15 {
			return errors.New("state after restart differs from state before")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if !c.IsLeader() {
		t.Fatal("the single voter did not elect itself after restart")
	}
	mustApply(t, c, createAccelerator("after-restart"))

	// Snapshots never compact the log (docs/audit.md).
	if first, _ := c.store.FirstIndex(); first != 1 {
		t.Fatalf("first log index %d after a snapshot, want 1", first)
	}
	if got := replayHash(t, c); got != hashOf(c) {
		t.Fatalf("replay of the log from index 1: hash %s, live %s", got, hashOf(c))
	}

	// One data dir, one agent: a second opener fails fast.
	o2 := o
	o2.addr = freeAddr(t)
	if _, err := New(Config{NodeName: "n1", DataDir: o.dir, RaftBind: o2.addr, Server: true, Logger: testLogger()}); err == nil ||
		!strings.Contains(err.Error(), "another gpuplane agent") {
		t.Fatalf("second open of a data dir in use: %v", err)
	}
}

// TestProposeAppendsOnlyChanges: Propose appends an entry for a change, and
// answers a refusal or a no-op from its check with no entry (Index 0), on
// the leader and through a follower (which forwards the whole of it).
func TestProposeAppendsOnlyChanges(t *testing.T) {
	t.Run("leader", func(t *testing.T) {
		c, _ := startDev(t)
		checkPropose(t, c, c)
	})
	t.Run("follower", func(t *testing.T) {
		tr := startTrio(t)
		_, lead := tr.leader()
		_, f := tr.follower()
		checkPropose(t, f, lead)
	})
}

func checkPropose(t *testing.T, c, leader *Cluster) {
	mustApply(t, c, registerNode("n1"))
	ctx := testCtx(t)
	upsert := func() *pb.Envelope {
		env := createAccelerator("a1")
		env.GetCreateAccelerator().Upsert = true
		return env
	}
	res, err := c.Propose(ctx, upsert())
	if err != nil || res.GetCode() != pb.Code_CODE_OK || res.GetOutcome() != pb.Outcome_OUTCOME_CREATED || res.GetIndex() == 0 {
		t.Fatalf("propose a change: %v, %v", res, err)
	}
	res, err = c.Propose(ctx, upsert())
	if err != nil || res.GetCode() != pb.Code_CODE_OK || res.GetOutcome() != pb.Outcome_OUTCOME_UNCHANGED || res.GetIndex() != 0 {
		t.Fatalf("propose a no-op: %v, %v", res, err)
	}
	res, err = c.Propose(ctx, createAccelerator("a1")) // exists, no upsert
	if err != nil || res.GetCode() != pb.Code_CODE_ALREADY_EXISTS || res.GetIndex() != 0 {
		t.Fatalf("propose a refused change: %v, %v", res, err)
	}
	// The leader's own membership entries may come and go meanwhile: count
	// the accelerator's.
	n := 0
	for _, data := range commands(t, leader) {
		var env pb.Envelope
		if err := proto.Unmarshal(data, &env); err != nil {
			t.Fatal(err)
		}
		if env.GetCreateAccelerator().GetName() == "a1" {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("the log holds %d entries creating a1, want 1 (the change; none for the no-op or the refusal)", n)
	}
}

// TestStatusCountsEntriesTheStateNeverSees: a barrier (like each new
// leader's no-op) is committed but never reaches the state machine; once
// raft has passed it, `cluster status` reports it applied, so an idle
// cluster after an election does not show its servers behind for good.
func TestStatusCountsEntriesTheStateNeverSees(t *testing.T) {
	c, _ := startDev(t)
	mustApply(t, c, createAccelerator("a"))
	if err := c.raft.Barrier(10 * time.Second).Error(); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "applied index reaches the commit index", func() error {
		if st := c.Status(); st.AppliedIndex != st.CommitIndex {
			return fmt.Errorf("applied %d of %d", st.AppliedIndex, st.CommitIndex)
		}
		return nil
	})
}

// A server that was started with neither a bootstrap nor peers answers a
// write with how to form the cluster, not only "no cluster leader".
func TestUnformedServerSaysHowToFormTheCluster(t *testing.T) {
	c := start(t, nodeOpts{name: "s1", dir: t.TempDir(), addr: freeAddr(t)})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := c.Apply(ctx, registerNode("n1"))
	if !errors.Is(err, ErrNoLeader) {
		t.Fatalf("apply on an unformed server: %v, want ErrNoLeader", err)
	}
	for _, want := range []string{"formed no cluster yet", "gpuplane cluster join", "--bootstrap-expect"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}
