package cluster

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/gpuplane/gpuplane/fsm"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// TestApplyBatch checks that a batch gives every entry what Apply would:
// results in order, each with its own index, rejections and duplicates per
// entry, on the leader (proposed together) and on a follower (forwarded),
// and after the leader changes.
func TestApplyBatch(t *testing.T) {
	tr := startTrio(t)
	ctx := testCtx(t)
	lead, leader := tr.leader()

	first := createAccelerator("first")
	first.RequestId = "req-first"
	mustApply(t, leader, first)

	batch := func(prefix string) []*pb.Envelope {
		dup := createAccelerator("first")
		dup.RequestId = "req-first" // a retry of a write applied before
		taken := createAccelerator("first")
		return []*pb.Envelope{
			createAccelerator(prefix + "-a"),
			{RequestId: "no-command"}, // nothing this server knows: never proposed
			dup,
			taken, // a new request for a name in use: rejected by the state machine
			createAccelerator(prefix + "-b"),
		}
	}
	check := func(on *Cluster, prefix string) {
		t.Helper()
		before := on.AppliedIndex()
		results, errs := on.ApplyBatch(ctx, batch(prefix))
		if len(results) != 5 || len(errs) != 5 {
			t.Fatalf("%s: %d results, %d errors for 5 envelopes", on.NodeName(), len(results), len(errs))
		}
		for i, err := range errs {
			if err != nil {
				t.Fatalf("%s: entry %d: %v", on.NodeName(), i, err)
			}
		}
		a, b := results[0], results[4]
		if a.Code != pb.Code_CODE_OK || b.Code != pb.Code_CODE_OK || a.Index <= before || b.Index <= before || a.Index == b.Index {
			t.Fatalf("%s: accepted entries: %v, %v", on.NodeName(), a, b)
		}
		if r := results[1]; r.Code != pb.Code_CODE_INVALID_ARGUMENT || r.Index != 0 {
			t.Fatalf("%s: envelope without a command: %v", on.NodeName(), r)
		}
		if r := results[2]; !r.Duplicate || r.Code != pb.Code_CODE_OK {
			t.Fatalf("%s: retried request id: %v", on.NodeName(), r)
		}
		if r := results[3]; r.Code != pb.Code_CODE_ALREADY_EXISTS {
			t.Fatalf("%s: name in use: %v", on.NodeName(), r)
		}
		// Entries written one by one (on a follower, after a failover) go
		// in parallel, so a may land after b: wait for both on this node.
		if err := on.WaitApplied(ctx, max(a.Index, b.Index)); err != nil {
			t.Fatalf("%s: waiting for index %d: %v", on.NodeName(), max(a.Index, b.Index), err)
		}
		var missing []string
		on.View(func(f *fsm.FSM) {
			for _, n := range []string{prefix + "-a", prefix + "-b"} {
				if _, ok := f.Accelerator(n); !ok {
					missing = append(missing, n)
				}
			}
		})
		if len(missing) > 0 {
			t.Fatalf("%s: applied state misses %v", on.NodeName(), missing)
		}
	}

	check(leader, "on-leader")
	_, follower := tr.follower()
	check(follower, "on-follower")

	// A big batch, larger than what Raft appends at once.
	var envs []*pb.Envelope
	for i := range 600 {
		envs = append(envs, createAccelerator(fmt.Sprintf("big-%d", i)))
	}
	results, errs := leader.ApplyBatch(ctx, envs)
	seen := map[uint64]bool{}
	for i := range envs {
		if errs[i] != nil || results[i].Code != pb.Code_CODE_OK || seen[results[i].Index] {
			t.Fatalf("big batch entry %d: %v, %v", i, results[i], errs[i])
		}
		seen[results[i].Index] = true
	}
	tr.converge()

	// The leader goes: a batch on a survivor reaches the new leader.
	tr.stop(lead)
	_, survivor := tr.follower()
	check(survivor, "after-failover")
	tr.converge()
}

// TestApplyBatchCancelled checks that entries of a batch whose context has
// ended report the context's error, not a result.
func TestApplyBatchCancelled(t *testing.T) {
	c, _ := startDev(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	results, errs := c.ApplyBatch(ctx, []*pb.Envelope{createAccelerator("x")})
	if results[0] != nil || !errors.Is(errs[0], context.Canceled) {
		t.Fatalf("cancelled batch: %v, %v", results[0], errs[0])
	}
}
