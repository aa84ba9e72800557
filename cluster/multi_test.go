package cluster

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/gpuplane/gpuplane/fsm"
)

// trio is three servers on loopback, bootstrapped together.
type trio struct {
	t     *testing.T
	opts  []nodeOpts
	nodes []*Cluster // nil while stopped
	fwd   *localForwarder
}

func startTrio(t *testing.T) *trio {
	tr := &trio{t: t, fwd: &localForwarder{nodes: map[string]*Cluster{}}}
	var peers []Peer
	for i := range 3 {
		o := nodeOpts{name: fmt.Sprintf("s%d", i+1), dir: t.TempDir(), addr: freeAddr(t), bootstrap: true}
		peers = append(peers, Peer{ID: o.name, Address: o.addr})
		tr.opts = append(tr.opts, o)
	}
	tr.nodes = make([]*Cluster, 3)
	for i := range tr.opts {
		tr.opts[i].peers = peers
		tr.restart(i)
	}
	return tr
}

func (tr *trio) restart(i int) {
	tr.nodes[i] = start(tr.t, tr.opts[i])
	tr.fwd.set(tr.nodes[i])
}

func (tr *trio) stop(i int) {
	if err := tr.nodes[i].Shutdown(); err != nil {
		tr.t.Fatal(err)
	}
	tr.nodes[i] = nil
}

// leader waits until exactly one running node leads and the others follow it.
func (tr *trio) leader() (int, *Cluster) {
	tr.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		lead, agree := -1, true
		for i, c := range tr.nodes {
			if c != nil && c.IsLeader() {
				lead = i
			}
		}
		for _, c := range tr.nodes {
			if c != nil && lead >= 0 {
				if id, _ := c.Leader(); id != tr.opts[lead].name {
					agree = false
				}
			}
		}
		if lead >= 0 && agree {
			return lead, tr.nodes[lead]
		}
		time.Sleep(20 * time.Millisecond)
	}
	tr.t.Fatal("no leader within 10s")
	return -1, nil
}

func (tr *trio) follower() (int, *Cluster) {
	lead, _ := tr.leader()
	for i, c := range tr.nodes {
		if c != nil && i != lead {
			return i, c
		}
	}
	tr.t.Fatal("no follower running")
	return -1, nil
}

// converge waits until every running node has applied the leader's commit
// index and checks that they all reached the same state hash.
func (tr *trio) converge() string {
	tr.t.Helper()
	_, l := tr.leader()
	idx := l.raft.CommitIndex()
	want := hashOf(l)
	for i, c := range tr.nodes {
		if c == nil {
			continue
		}
		if err := c.WaitApplied(testCtx(tr.t), idx); err != nil {
			tr.t.Fatalf("%s: %v", tr.opts[i].name, err)
		}
		if got := hashOf(c); got != want {
			tr.t.Fatalf("%s hash %s, leader %s", tr.opts[i].name, got, want)
		}
	}
	return want
}

func TestThreeNodes(t *testing.T) {
	tr := startTrio(t)
	ctx := testCtx(t)

	lead, leader := tr.leader()
	mustApply(t, leader, registerNode("gpu-1"))
	mustApply(t, leader, createAccelerator("standard"))

	// A follower forwards writes to the leader, and a linearizable read on
	// it sees them at once.
	_, follower := tr.follower()
	res := mustApply(t, follower, createAccelerator("forwarded"))
	if err := follower.Read(ctx, false, func(f *fsm.FSM) error {
		if _, ok := f.Accelerator("forwarded"); !ok || f.AppliedIndex() < res.Index {
			return fmt.Errorf("follower read misses the write at %d (applied %d)", res.Index, f.AppliedIndex())
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	dry, err := follower.DryRun(ctx, createAccelerator("forwarded"))
	if err != nil || dry.Code.String() != "CODE_ALREADY_EXISTS" {
		t.Fatalf("forwarded dry run: %v, %v", dry, err)
	}
	tr.converge()

	st := leader.Status()
	if len(st.Servers) != 3 || st.Leader != tr.opts[lead].name {
		t.Fatalf("leader status: %v", st)
	}
	for _, s := range st.Servers {
		if s.Suffrage != "voter" || s.LastContactMs < 0 || s.LastContactMs > 1000 {
			t.Fatalf("leader's view of %s: %v", s.Id, s)
		}
	}

	// Snapshot a follower, stop it, write while it is down, restart it: it
	// restores the snapshot, catches up from the leader's log and keeps the
	// whole log.
	fi, f := tr.follower()
	if err := f.raft.Snapshot().Error(); err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	var snapIndex uint64
	f.View(func(s *fsm.FSM) { snapIndex = s.AppliedIndex() })
	tr.stop(fi)
	for i := range 5 {
		mustApply(t, leader, createAccelerator(fmt.Sprintf("while-down-%d", i)))
	}
	tr.restart(fi)
	if got := tr.nodes[fi].AppliedIndex(); got < snapIndex {
		t.Fatalf("restarted follower applied %d, below its snapshot at %d", got, snapIndex)
	}
	tr.converge()
	if first, _ := tr.nodes[fi].store.FirstIndex(); first != 1 {
		t.Fatalf("follower's first log index %d after snapshot, want 1", first)
	}

	// Stop the leader: the other two elect a new one and take writes,
	// including forwarded ones.
	tr.stop(lead)
	newLead, nl := tr.leader()
	if newLead == lead {
		t.Fatal("stopped leader still leads")
	}
	mustApply(t, nl, createAccelerator("after-failover"))
	_, f2 := tr.follower()
	mustApply(t, f2, createAccelerator("after-failover-forwarded"))
	tr.converge()

	// The old leader comes back as a follower and catches up.
	tr.restart(lead)
	hash := tr.converge()
	for i, c := range tr.nodes {
		if got := replayHash(t, c); got != hash {
			t.Fatalf("%s: replay of its log gives %s, live %s", tr.opts[i].name, got, hash)
		}
	}
}

// TestNoLeader checks that a server cut off from its peers answers writes
// and linearizable reads with ErrNoLeader once the wait is over, while stale
// reads keep working.
func TestNoLeader(t *testing.T) {
	tr := startTrio(t)
	_, leader := tr.leader()
	mustApply(t, leader, registerNode("gpu-1"))
	tr.converge()
	survivor := 0
	for i := range tr.nodes {
		if i != survivor {
			tr.stop(i)
		}
	}
	c := tr.nodes[survivor]
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	if _, err := c.Apply(ctx, createAccelerator("x")); !errors.Is(err, ErrNoLeader) && !errors.Is(err, ErrNotLeader) {
		t.Fatalf("apply without quorum: %v", err)
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel2()
	if err := c.Read(ctx2, false, func(*fsm.FSM) error { return nil }); !errors.Is(err, ErrNoLeader) {
		t.Fatalf("linearizable read without quorum: %v", err)
	}
	if err := c.Read(context.Background(), true, func(f *fsm.FSM) error {
		if _, ok := f.Node("gpu-1"); !ok {
			return errors.New("stale read lost gpu-1")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if c.raft.State() == raft.Leader {
		t.Fatal("a server without quorum still leads")
	}
}
