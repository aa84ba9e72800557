package events_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/gpuplane/gpuplane/cluster"
	"github.com/gpuplane/gpuplane/cluster/events"
	"github.com/gpuplane/gpuplane/cluster/scheduler"
	"github.com/gpuplane/gpuplane/fsm"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// testProgress is a server (events.Server) with a log the test wrote and
// an applied index the test moves, as a server's state machine does.
type testProgress struct {
	files   events.LogFiles
	mu      sync.Mutex
	applied uint64
	changed chan struct{}
}

func newTestProgress(files events.LogFiles) *testProgress {
	return &testProgress{files: files, changed: make(chan struct{})}
}

func (p *testProgress) LogFiles() (events.LogFiles, error) { return p.files, nil }

func (p *testProgress) Progress() (uint64, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.applied, p.changed
}

func (p *testProgress) set(i uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.applied = i
	close(p.changed)
	p.changed = make(chan struct{})
}

// fleetLog writes a random workload into an in-memory Raft log: nodes
// registered and failing, deployments created, changed (re-placing their
// replicas), scaled and deleted, the scheduler's plans, nodes' status
// reports, no-ops and a membership change. Many of its entries change a
// node's replicas without naming the node (a deployment's new generation,
// an unplace).
func fleetLog(t *testing.T, seed uint64) *raft.InmemStore {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 1))
	store := raft.NewInmemStore()
	f := fsm.New()
	var index uint64
	add := func(l *raft.Log) {
		index++
		l.Index, l.Term = index, 1
		if err := store.StoreLog(l); err != nil {
			t.Fatal(err)
		}
	}
	apply := func(env *pb.Envelope) {
		data, err := proto.Marshal(env)
		if err != nil {
			t.Fatal(err)
		}
		add(&raft.Log{Type: raft.LogCommand, Data: data})
		f.ApplyBytes(index, data)
	}
	add(&raft.Log{Type: raft.LogConfiguration, Data: raft.EncodeConfiguration(raft.Configuration{Servers: []raft.Server{{ID: "s1", Address: "a1"}}})})
	for i := range 5 {
		var cards []*pb.Card
		for c := range 2 {
			cards = append(cards, &pb.Card{Index: uint32(c), Uuid: fmt.Sprintf("n%d-%d", i, c), Device: "l4", MemoryMib: 23034, Healthy: true})
		}
		apply(&pb.Envelope{Command: &pb.Envelope_RegisterNode{RegisterNode: &pb.RegisterNode{Node: &pb.Node{
			Name: fmt.Sprintf("n%d", i), Role: pb.NodeRole_NODE_ROLE_CLIENT, Cards: cards}}}})
	}
	apply(&pb.Envelope{Command: &pb.Envelope_CreateAccelerator{CreateAccelerator: &pb.CreateAccelerator{
		Name: "shared", Spec: &pb.AcceleratorSpec{Device: "l4", Tenancy: pb.Tenancy_TENANCY_SHARED, MaxModels: 3}}}})
	for range 300 {
		switch op := rng.IntN(10); {
		case op < 2:
			apply(&pb.Envelope{Command: &pb.Envelope_ApplyModel{ApplyModel: &pb.ApplyModel{Name: fmt.Sprintf("d%d", rng.IntN(4)), Spec: &pb.ModelSpec{
				Model: fmt.Sprintf("m%d", rng.IntN(2)), Replicas: uint32(rng.IntN(4)), Placement: &pb.PlacementSpec{Accelerator: "shared"},
				Engine: &pb.EngineSpec{Kind: "sim", MemoryPercent: uint32(10 + rng.IntN(20))}}}}})
		case op == 2:
			apply(&pb.Envelope{Command: &pb.Envelope_DeleteModel{DeleteModel: &pb.DeleteModel{Name: fmt.Sprintf("d%d", rng.IntN(4))}}})
		case op == 3:
			status := []pb.NodeStatus{pb.NodeStatus_NODE_STATUS_DOWN, pb.NodeStatus_NODE_STATUS_ALIVE}[rng.IntN(2)]
			apply(&pb.Envelope{Command: &pb.Envelope_SetNodeStatus{SetNodeStatus: &pb.SetNodeStatus{Node: fmt.Sprintf("n%d", rng.IntN(5)), Status: status}}})
		case op < 6:
			if plan, err := cluster.Plan(f, scheduler.Policies()[0]); err != nil {
				t.Fatal(err)
			} else if plan != nil {
				apply(&pb.Envelope{Command: &pb.Envelope_PlaceReplicas{PlaceReplicas: plan}})
			}
		case op < 8:
			placed := f.Replicas("", "")
			if len(placed) == 0 {
				continue
			}
			r := placed[rng.IntN(len(placed))]
			if r.Node == "" {
				continue
			}
			st := []pb.ReplicaState{pb.ReplicaState_REPLICA_STATE_STARTING, pb.ReplicaState_REPLICA_STATE_RUNNING, pb.ReplicaState_REPLICA_STATE_FAILED}[rng.IntN(3)]
			apply(&pb.Envelope{Command: &pb.Envelope_ReplicaStatus{ReplicaStatus: &pb.ReplicaStatus{
				Model: r.Model, Replica: r.Index, Generation: r.Generation, Node: r.Node, State: st}}})
		case op == 8:
			placed := f.Replicas("", "")
			if len(placed) > 0 {
				r := placed[rng.IntN(len(placed))]
				apply(&pb.Envelope{Command: &pb.Envelope_UnplaceReplica{UnplaceReplica: &pb.UnplaceReplica{Model: r.Model, Replica: r.Index, Reason: "test"}}})
			}
		default:
			add(&raft.Log{Type: raft.LogNoop})
		}
	}
	return store
}

// replayed is what a stream's own Cursor yields from from to upTo.
func replayed(t *testing.T, hist events.LogFiles, from, upTo uint64, filter *pb.EventFilter) []*pb.Event {
	t.Helper()
	var out []*pb.Event
	if err := hist.Cursor(from, filter).Advance(upTo, func(ev *pb.Event) error {
		out = append(out, ev)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// received reads n events from s (its backlog first), failing the test if
// they do not come within a minute or the subscription ends first.
func received(t *testing.T, s *events.Subscription, n int) []*pb.Event {
	t.Helper()
	out := append([]*pb.Event(nil), s.Backlog()...)
	timeout := time.After(time.Minute)
	for len(out) < n {
		select {
		case ev, ok := <-s.C():
			if !ok {
				t.Fatalf("subscription ended after %d of %d events: %v", len(out), n, s.Err())
			}
			out = append(out, ev)
		case <-timeout:
			t.Fatalf("got %d of %d events in a minute", len(out), n)
		}
	}
	return out
}

func sameEvents(t *testing.T, what string, got, want []*pb.Event) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d events, want %d", what, len(got), len(want))
	}
	for i := range want {
		if !proto.Equal(got[i], want[i]) {
			t.Fatalf("%s: event %d is\n%v\nwant (its own replay's)\n%v", what, i, got[i], want[i])
		}
	}
}

// TestFeedSendsEachStreamWhatItsOwnReplayWould: streams served by the
// shared feed — filtered by node, by resource, or not at all, started
// before the feed's replay, inside its window, or while it follows — get
// exactly the events a Cursor of their own yields, in order: in
// particular every entry that moved a node's replicas without naming the
// node.
func TestFeedSendsEachStreamWhatItsOwnReplayWould(t *testing.T) {
	for seed := range uint64(3) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			const window = 32
			store := fleetLog(t, seed)
			last, _ := store.LastIndex()
			if last < 6*window {
				t.Fatalf("the log has %d entries: too few for a window of %d", last, window)
			}
			hist := events.LogFiles{Log: store}
			prog := newTestProgress(hist)
			prog.set(last / 3)
			f, err := events.NewFeed(prog, window, 1<<16)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Stop(nil)
			type stream struct {
				from   uint64
				filter *pb.EventFilter
				sub    *events.Subscription
			}
			var streams []*stream
			subscribe := func(from uint64) {
				filters := []*pb.EventFilter{nil, {Resource: "model/d1"}}
				for i := range 5 {
					filters = append(filters, &pb.EventFilter{Node: fmt.Sprintf("n%d", i)})
				}
				for _, filter := range filters {
					sub, err := f.Subscribe(from, filter)
					if err != nil {
						t.Fatalf("subscribe from %d: %v", from, err)
					}
					streams = append(streams, &stream{from, filter, sub})
				}
			}
			// Ahead of the feed's replay, and where it will start.
			subscribe(last/2 + 1)
			subscribe(last/3 + 1 - window)
			// Inside the window, once the feed has passed it.
			prog.set(2 * last / 3)
			waitFeed(t, f, 2*last/3+1)
			subscribe(2*last/3 - window/2)
			if _, err := f.Subscribe(1, nil); !errors.Is(err, events.ErrNotInFeed) {
				t.Errorf("a stream from before the window: %v, want ErrNotInFeed", err)
			}
			prog.set(last)
			for _, s := range streams {
				want := replayed(t, hist, s.from, last, s.filter)
				sameEvents(t, fmt.Sprintf("from %d, filter %v", s.from, s.filter), received(t, s.sub, len(want)), want)
			}
		})
	}
}

// waitFeed waits until f has read the log up to pos-1.
func waitFeed(t *testing.T, f *events.Feed, pos uint64) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		at := events.FeedPos(f)
		if at >= pos {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the feed is at %d after a minute, want %d", at, pos)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestFeedCutsOffAStreamThatFellBehind: a subscriber that does not read is
// cut off when its buffer is full, with every event before the cut
// delivered and the error naming the index to resume from; resumed there,
// it gets the rest, none skipped.
func TestFeedCutsOffAStreamThatFellBehind(t *testing.T) {
	store := fleetLog(t, 7)
	last, _ := store.LastIndex()
	hist := events.LogFiles{Log: store}
	prog := newTestProgress(hist)
	const buffer = 4
	f, err := events.NewFeed(prog, 1<<16, buffer)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Stop(nil)
	sub, err := f.Subscribe(1, nil)
	if err != nil {
		t.Fatal(err)
	}
	prog.set(last)
	waitFeed(t, f, last+1)
	var got []*pb.Event
	for ev := range sub.C() {
		got = append(got, ev)
	}
	want := replayed(t, hist, 1, last, nil)
	sameEvents(t, "before the cut", got, want[:buffer])
	err = sub.Err()
	resume := want[buffer].Index
	if !errors.Is(err, events.ErrFellBehind) || !strings.Contains(err.Error(), fmt.Sprintf("resume from index %d", resume)) {
		t.Fatalf("cut off with %v, want ErrFellBehind naming index %d", err, resume)
	}
	again, err := f.Subscribe(resume, nil)
	if err != nil {
		t.Fatal(err)
	}
	sameEvents(t, "resumed", received(t, again, len(want)-buffer), want[buffer:])
}

// TestNodeStreamsSeeSpecOnlyChanges: an apply that changes only a
// deployment's spec (an adapter added) leaves its replicas as they were,
// yet the node running its replica must see it, through its own cursor and
// through the shared feed; a node running nothing of it does not.
func TestNodeStreamsSeeSpecOnlyChanges(t *testing.T) {
	store := raft.NewInmemStore()
	f := fsm.New()
	var index uint64
	apply := func(env *pb.Envelope) {
		data, err := proto.Marshal(env)
		if err != nil {
			t.Fatal(err)
		}
		index++
		if err := store.StoreLog(&raft.Log{Index: index, Term: 1, Type: raft.LogCommand, Data: data}); err != nil {
			t.Fatal(err)
		}
		if res := f.ApplyBytes(index, data); res.GetCode() != pb.Code_CODE_OK {
			t.Fatalf("entry %d: %v", index, res)
		}
	}
	for i := range 2 {
		apply(&pb.Envelope{Command: &pb.Envelope_RegisterNode{RegisterNode: &pb.RegisterNode{Node: &pb.Node{
			Name: fmt.Sprintf("n%d", i), Role: pb.NodeRole_NODE_ROLE_CLIENT,
			Cards: []*pb.Card{{Index: 0, Uuid: fmt.Sprintf("n%d-0", i), Device: "l4", MemoryMib: 23034, Healthy: true}}}}}})
	}
	apply(&pb.Envelope{Command: &pb.Envelope_CreateAccelerator{CreateAccelerator: &pb.CreateAccelerator{
		Name: "shared", Spec: &pb.AcceleratorSpec{Device: "l4", Tenancy: pb.Tenancy_TENANCY_SHARED, MaxModels: 3}}}})
	spec := &pb.ModelSpec{Model: "sim://chat", Replicas: 1, Placement: &pb.PlacementSpec{Accelerator: "shared"},
		Engine: &pb.EngineSpec{Kind: "sim", MemoryPercent: 20}}
	apply(&pb.Envelope{Command: &pb.Envelope_ApplyModel{ApplyModel: &pb.ApplyModel{Name: "chat", Spec: spec}}})
	plan, err := cluster.Plan(f, scheduler.Policies()[0])
	if err != nil || plan == nil {
		t.Fatalf("plan: %v %v", plan, err)
	}
	apply(&pb.Envelope{Command: &pb.Envelope_PlaceReplicas{PlaceReplicas: plan}})
	placed := f.Replicas("chat", "")
	if len(placed) != 1 || placed[0].GetNode() == "" {
		t.Fatalf("replicas %v", placed)
	}
	on, other := placed[0].GetNode(), "n0"
	if on == "n0" {
		other = "n1"
	}
	before := f.ReplicasOn(on)
	spec = proto.Clone(spec).(*pb.ModelSpec)
	spec.Adapters = []*pb.Adapter{{Name: "a1", Source: "/adapters/a1", Rank: 8}}
	apply(&pb.Envelope{Command: &pb.Envelope_ApplyModel{ApplyModel: &pb.ApplyModel{Name: "chat", Spec: spec}}})
	if !events.ReplicasEqual(before, f.ReplicasOn(on)) {
		t.Fatal("adding an adapter changed the replicas: this test needs a spec-only change")
	}
	last := index

	hist := events.LogFiles{Log: store}
	lastIs := func(what string, evs []*pb.Event, want bool) {
		t.Helper()
		got := len(evs) > 0 && evs[len(evs)-1].GetIndex() == last
		if got != want {
			t.Errorf("%s: sees the adapter's apply = %v, want %v", what, got, want)
		}
	}
	lastIs("own cursor of "+on, replayed(t, hist, 1, last, &pb.EventFilter{Node: on}), true)
	lastIs("own cursor of "+other, replayed(t, hist, 1, last, &pb.EventFilter{Node: other}), false)

	prog := newTestProgress(hist)
	feed, err := events.NewFeed(prog, 64, 64)
	if err != nil {
		t.Fatal(err)
	}
	defer feed.Stop(nil)
	sub, err := feed.Subscribe(last, &pb.EventFilter{Node: on})
	if err != nil {
		t.Fatal(err)
	}
	prog.set(last)
	lastIs("feed's stream of "+on, received(t, sub, 1), true)
}
