package cluster

import (
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/gpuplane/gpuplane/fsm"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// TestRequestWindowThroughRaft runs request-id expiry through the real apply
// path: the leader stamps its configured window into the log, a retry inside
// the window is a duplicate, a retry after it is applied to the current
// state (already exists, never a second create), and a server restarted
// with another window keeps the logged one until, as leader, it logs its own.
func TestRequestWindowThroughRaft(t *testing.T) {
	const window = 3 * time.Second
	o := nodeOpts{name: "n1", dir: t.TempDir(), addr: freeAddr(t), bootstrap: true, requestWindow: window}
	c := start(t, o)
	waitLeader(t, c)
	ctx := testCtx(t)

	first := createAccelerator("a")
	first.RequestId = "0123456789abcdef0123456789abcdef"
	res := mustApply(t, c, first)
	var l raft.Log
	if err := c.store.GetLog(res.Index, &l); err != nil {
		t.Fatal(err)
	}
	env := &pb.Envelope{}
	if err := proto.Unmarshal(l.Data, env); err != nil {
		t.Fatal(err)
	}
	if env.GetRequestWindow().AsDuration() != window {
		t.Fatalf("the leader's first entry carries window %v, want %v", env.GetRequestWindow().AsDuration(), window)
	}
	c.View(func(f *fsm.FSM) {
		if f.RequestWindow() != window {
			t.Errorf("state machine window %v, want %v", f.RequestWindow(), window)
		}
	})
	again, err := c.Apply(ctx, first)
	if err != nil {
		t.Fatal(err)
	}
	if !again.Duplicate {
		t.Fatalf("retry inside the window: %v %q, want the first result as a duplicate", again.Code, again.Message)
	}

	// Log time is the entries' proposal time: once the retry is proposed a
	// window after the first, the id is forgotten.
	time.Sleep(time.Until(env.GetProposedAt().AsTime().Add(window + 100*time.Millisecond)))
	late, err := c.Apply(ctx, first)
	if err != nil {
		t.Fatal(err)
	}
	if late.Duplicate || late.Code != pb.Code_CODE_ALREADY_EXISTS {
		t.Fatalf("retry after the window: duplicate %v, %v %q; want it answered from the current state (already exists)", late.Duplicate, late.Code, late.Message)
	}

	// Restarted with the default window, the server replays the logged one
	// and logs its own with its next proposal.
	if err := c.Shutdown(); err != nil {
		t.Fatal(err)
	}
	o.requestWindow = 0
	c = start(t, o)
	waitLeader(t, c)
	if err := c.raft.Barrier(10 * time.Second).Error(); err != nil {
		t.Fatal(err)
	}
	c.View(func(f *fsm.FSM) {
		if f.RequestWindow() != window {
			t.Errorf("after restart the state machine's window is %v, want the logged %v", f.RequestWindow(), window)
		}
	})
	mustApply(t, c, createAccelerator("b"))
	c.View(func(f *fsm.FSM) {
		if f.RequestWindow() != fsm.DefaultRequestWindow {
			t.Errorf("after the new leader's entry the window is %v, want its %v", f.RequestWindow(), fsm.DefaultRequestWindow)
		}
	})
}

// TestRequestWindowTooShort: a window shorter than a retry could take is
// refused with the rule and the value, before anything starts.
func TestRequestWindowTooShort(t *testing.T) {
	cfg := Config{NodeName: "n1", DataDir: t.TempDir(), RaftBind: "127.0.0.1:7000", Server: true, RequestWindow: 10 * time.Millisecond}
	err := cfg.validate()
	if err == nil || !strings.Contains(err.Error(), "request window must be at least 1s") || !strings.Contains(err.Error(), "10ms") {
		t.Fatalf("validate with a 10ms window: %v", err)
	}
}
