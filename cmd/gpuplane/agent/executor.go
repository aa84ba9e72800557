package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"time"

	"connectrpc.com/connect"
	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"google.golang.org/protobuf/proto"

	"github.com/gpuplane/gpuplane/cluster"
	"github.com/gpuplane/gpuplane/fsm"
	"github.com/gpuplane/gpuplane/node/cardmanager"
	"github.com/gpuplane/gpuplane/node/engine"
	"github.com/gpuplane/gpuplane/node/executor"
	"github.com/gpuplane/gpuplane/node/inventory"
	"github.com/gpuplane/gpuplane/node/residency"
	"github.com/gpuplane/gpuplane/node/watchdog"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
	"github.com/gpuplane/gpuplane/proto/gpuplane/v1/gpuplanev1connect"
	"github.com/gpuplane/gpuplane/rpc"
)

// startExecutor runs the node executor (engines for the replicas placed on
// this node) and the watchdog that holds them to their memory shares.
func (a *Agent) startExecutor() error {
	if a.cfg.Hollow {
		return a.startHollowExecutor()
	}
	if a.cfg.Enforce == "" {
		a.cfg.Enforce = "auto"
	}
	mode, err := engine.ParseMode(a.cfg.Enforce)
	if err != nil {
		return fmt.Errorf("--enforce: %w", err)
	}
	enf, msg, err := engine.Detect(mode, engine.DetectOptions{HAMiLib: a.cfg.HAMiLib})
	if err != nil {
		return fmt.Errorf("--enforce %s: %w", a.cfg.Enforce, err)
	}
	fmt.Fprintln(a.cfg.Out, msg)
	var advise bool
	switch a.cfg.Residency {
	case "", "auto":
	case "advise":
		advise = true
	default:
		return fmt.Errorf("--residency: must be auto or advise, got %q", a.cfg.Residency)
	}
	if ts := a.cfg.ResidencyTimeScale; ts < 0 || ts > 1 && !a.cfg.Dev {
		return fmt.Errorf("residency time scale: must be ≥ 0, and above 1 only on a dev agent, got %g", ts)
	}

	node := a.localNode()
	// Engines and fronts listen on loopback whatever --bind says: they are
	// the gateway's, which is the node's one door (its queues, tokens and
	// tenants); another address would be a door past all three.
	opts := executor.Options{
		Node: a.cfg.NodeName, DataDir: a.cfg.DataDir, Cards: node.Cards,
		BindHost: localHost, AdvertiseHost: localHost,
		Enforcement: enf, Logger: a.cfg.Logger, OrphanGrace: a.cfg.OrphanGrace,
	}
	if a.cfg.OrphanGrace < 0 {
		return fmt.Errorf("--orphan-grace must not be negative, got %s", a.cfg.OrphanGrace)
	}
	if a.cfg.StartStall < 0 {
		return fmt.Errorf("--start-stall-timeout must not be negative, got %s", a.cfg.StartStall)
	}
	opts.StartStallTimeout = a.cfg.StartStall
	var lib nvml.Interface
	switch {
	case node.Simulated:
		opts.SimUsageDir = filepath.Join(a.cfg.DataDir, "sim-nvml")
		lib = inventory.NewSimNVML(node.Cards, inventory.NewSimUsage(opts.SimUsageDir))
	case len(node.Cards) == 0:
		// A server without an NVIDIA driver (docs/operations.md): no cards, so no
		// watchdog, and no NVML to start one with.
	default:
		lib = nvml.New()
		if ret := lib.Init(); ret != nvml.SUCCESS {
			return fmt.Errorf("NVML for the watchdog: %v", nvml.ErrorString(ret))
		}
	}
	opts.NVML = lib
	if a.cfg.ACL && a.frontKey == "" {
		if a.frontKey, err = newFrontKey(); err != nil {
			return err
		}
	}
	if a.engineKeys == nil {
		if a.engineKeys, err = engine.LoadKeys(a.cfg.DataDir); err != nil {
			return err
		}
	}
	opts.EngineKeys = a.engineKeys
	if a.residencyJournal == nil {
		a.residencyJournal = residency.NewJournal(a.cfg.NodeName, 0)
	}
	res := cardmanager.New(cardmanager.Options{
		Config: residency.Config{BestEffort: !a.cfg.NoBestEffort},
		Node:   a.cfg.NodeName, Cards: node.Cards, Advise: advise, NVML: lib, Journal: a.residencyJournal, DataDir: a.cfg.DataDir,
		BindHost: localHost, AdvertiseHost: localHost, FrontKey: a.frontKey, EngineKeys: a.engineKeys, Logger: a.cfg.Logger, TimeScale: a.cfg.ResidencyTimeScale,
	})
	opts.Gate = res
	a.resident = res
	src := &eventSource{c: a.cluster, http: a.sec.peerHTTP}
	ex, err := executor.New(src, &logReporter{c: a.cluster, node: a.cfg.NodeName}, opts)
	if err != nil {
		return fmt.Errorf("start executor: %w", err)
	}
	list := ex.Engines
	a.engines.Store(&list)
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		ex.Run(ctx)
	}()
	if lib != nil {
		go watchdog.New(lib, ex, watchdog.Options{Logger: a.cfg.Logger}).Run(ctx)
	}
	resDone := make(chan struct{})
	go func() {
		defer close(resDone)
		res.Run(ctx, ex)
	}()
	a.stopExecutor = func() {
		stop()
		<-done
		<-resDone
	}
	return nil
}

// localHost is where this node's engines and replica fronts listen.
const localHost = "127.0.0.1"

// newFrontKey is a fresh front key (cardmanager.Options.FrontKey): held in
// memory only, since fronts live and die with the agent that serves them.
func newFrontKey() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("front key: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// startHollowExecutor runs executor.Hollow on the node's real event source
// and reporter: no engines, watchdog or residency manager.
func (a *Agent) startHollowExecutor() error {
	src := &eventSource{c: a.cluster, http: a.sec.peerHTTP}
	ex := executor.NewHollow(src, &logReporter{c: a.cluster, node: a.cfg.NodeName}, a.cfg.NodeName, a.cfg.Advertise, a.cfg.Logger)
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		ex.Run(ctx)
	}()
	a.stopExecutor = func() {
		stop()
		<-done
	}
	return nil
}

// logReporter reports replica transitions as ReplicaStatus log entries; a
// report the state machine refuses is an *executor.Rejected, which the
// executor does not send again.
type logReporter struct {
	c    *cluster.Cluster
	node string
}

func (r *logReporter) Report(ctx context.Context, st *pb.ReplicaStatus) error {
	res, err := r.c.Apply(ctx, &pb.Envelope{Actor: "node/" + r.node, Command: &pb.Envelope_ReplicaStatus{ReplicaStatus: st}})
	if err != nil {
		return err
	}
	if res.GetCode() != pb.Code_CODE_OK {
		return &executor.Rejected{Reason: res.GetMessage()}
	}
	return nil
}

// eventSource turns the servers' committed event stream, filtered to this
// node, into snapshots of the replicas placed here: one when it connects,
// then one after each event that concerns the node. The stream is resumable
// by index, so a reconnect (to any server) misses nothing. A snapshot is
// the node's replicas and their specs alone (ReadNode), read from the
// server that serves the stream: the first linearizably, the next ones
// once that server has applied the event's index. A server follows its own
// state machine instead (watchLocal).
type eventSource struct {
	c    *cluster.Cluster
	http *http.Client
}

func (s *eventSource) Watch(ctx context.Context, node string, from uint64) (<-chan executor.Snapshot, error) {
	if s.c.IsServer() {
		return s.watchLocal(ctx, node)
	}
	addr, ok := s.c.ServerAPI()
	if !ok {
		return nil, errors.New("no server known yet to watch the log")
	}
	server := gpuplanev1connect.NewClusterServiceClient(s.http, rpc.BaseURL(addr))
	snap, err := readNode(ctx, server, node, 0)
	if err != nil {
		return nil, err
	}
	client := gpuplanev1connect.NewEventServiceClient(s.http, rpc.BaseURL(addr))
	stream, err := client.Watch(ctx, connect.NewRequest(&pb.WatchRequest{
		FromIndex: snap.Index + 1, Follow: true, Filter: &pb.EventFilter{Node: node},
	}))
	if err != nil {
		return nil, err
	}
	out := make(chan executor.Snapshot, 1)
	out <- snap
	go func() {
		defer close(out)
		defer stream.Close()
		for stream.Receive() {
			ev := stream.Msg().GetEvent()
			if ev == nil {
				continue // the answer a following stream starts with
			}
			next, err := readNode(ctx, server, node, ev.GetIndex())
			if err != nil {
				return
			}
			select {
			case out <- next:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}

// readNode reads node's snapshot from a server (ReadNode): linearizably
// when after is 0, otherwise as of at least index after.
func readNode(ctx context.Context, server gpuplanev1connect.ClusterServiceClient, node string, after uint64) (executor.Snapshot, error) {
	resp, err := server.ReadNode(ctx, connect.NewRequest(&pb.ReadNodeRequest{Node: node, Stale: after > 0, MinIndex: after}))
	if err != nil {
		return executor.Snapshot{}, err
	}
	snap := executor.Snapshot{Index: resp.Msg.GetAppliedIndex()}
	for _, r := range resp.Msg.GetReplicas() {
		if spec := resp.Msg.GetSpecs()[r.GetModel()]; spec != nil && r.GetNode() == node {
			snap.Replicas = append(snap.Replicas, executor.Desired{Replica: r, Spec: spec})
		}
	}
	return snap, nil
}

// localPoll bounds how long watchLocal waits before it looks at the applied
// index again (it is normally woken as soon as it changes).
const localPoll = time.Second

// watchLocal is Watch on a server: the state machine this server applies
// the log to already holds what the event stream would tell, so the
// executor follows it directly. After each batch of entries the server
// applies, the node's snapshot is rebuilt from that state and sent when it
// differs from the last one sent. The event stream would instead replay
// every entry of the log a second time, into a private state machine (the
// stream's Cursor), only to find the few that concern this node: per write,
// on every server, about as much work again as applying it.
//
// The first snapshot is read linearizably, like the stream's; later ones
// come from the local state, which only moves forward.
func (s *eventSource) watchLocal(ctx context.Context, node string) (<-chan executor.Snapshot, error) {
	snap, err := s.snapshot(ctx, node)
	if err != nil {
		return nil, err
	}
	out := make(chan executor.Snapshot, 1)
	out <- snap
	go func() {
		defer close(out)
		last := snap
		poll := time.NewTicker(localPoll)
		defer poll.Stop()
		for {
			applied, advanced := s.c.Progress()
			if applied > last.Index {
				var next executor.Snapshot
				s.c.View(func(f *fsm.FSM) { next = executor.SnapshotOf(f.AppliedIndex(), node, f) })
				if next.Index > last.Index && !sameSnapshot(last, next) {
					select {
					case out <- next:
					case <-ctx.Done():
						return
					}
					last = next
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-advanced:
			case <-poll.C:
			}
		}
	}()
	return out, nil
}

// sameSnapshot reports whether a and b place the same replicas, in the same
// states, with the same specs (their indexes aside).
func sameSnapshot(a, b executor.Snapshot) bool {
	return slices.EqualFunc(a.Replicas, b.Replicas, func(x, y executor.Desired) bool {
		return proto.Equal(x.Replica, y.Replica) && proto.Equal(x.Spec, y.Spec)
	})
}

// snapshot reads the replicas placed on node from the state (linearizably,
// so a snapshot never goes back in time across servers).
func (s *eventSource) snapshot(ctx context.Context, node string) (executor.Snapshot, error) {
	var snap executor.Snapshot
	err := s.c.Read(ctx, false, func(f *fsm.FSM) error {
		snap = executor.SnapshotOf(f.AppliedIndex(), node, f)
		return nil
	})
	return snap, err
}

// readLogs serves the engine logs kept in this node's data dir.
func (a *Agent) readLogs(ctx context.Context, model string, replica uint32, follow bool, w io.Writer) error {
	return executor.ReadLogs(ctx, a.cfg.DataDir, model, replica, follow, w)
}
