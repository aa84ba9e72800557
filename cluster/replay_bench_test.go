package cluster

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/gpuplane/gpuplane/cluster/raftstore"
	"github.com/gpuplane/gpuplane/fsm"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// replayEntries is the size of the log BenchmarkReplay replays (issue 6: one
// million entries in under two seconds). GPUPLANE_REPLAY_ENTRIES overrides it
// for quick runs.
const replayEntries = 1_000_000

// BenchmarkReplay measures audit replay from disk: a data dir whose log
// holds a million realistic entries is opened read-only (OpenOffline, as
// `audit replay --data-dir` does) and History.StateAt replays the whole log
// through the Cursor into a fresh state machine (LogReader, then
// fsm.ApplyBytes), reporting entries per second. It then snapshots the
// resulting state and times raftFSM.Restore of it (what a restart does).
//
// The log is built once, written straight into the store with StoreLogs in
// big batches, and cached under the system temp dir
// (gpuplane-replay-bench-wal-<n>), so only the first run pays for it (about a
// minute). Run with `make bench-replay`.
func BenchmarkReplay(b *testing.B) {
	n := uint64(replayEntries)
	if s := os.Getenv("GPUPLANE_REPLAY_ENTRIES"); s != "" {
		if _, err := fmt.Sscan(s, &n); err != nil {
			b.Fatalf("GPUPLANE_REPLAY_ENTRIES=%q: %v", s, err)
		}
	}
	dir := filepath.Join(os.TempDir(), fmt.Sprintf("gpuplane-replay-bench-wal-%d", n))
	if err := buildReplayLog(dir, n); err != nil {
		b.Fatal(err)
	}
	off, err := OpenOffline(dir)
	if err != nil {
		b.Fatal(err)
	}
	last, err := off.LastIndex()
	if err != nil {
		off.Close()
		b.Fatal(err)
	}

	off.Close()

	// Each iteration opens the data dir afresh, as `audit replay --data-dir`
	// does: opening (mapping the file) is part of reading it from disk, and
	// a fresh mapping means no iteration reads pages an earlier one touched.
	var state *fsm.FSM
	b.ResetTimer()
	start, cpu0 := time.Now(), cpuTime()
	for b.Loop() {
		o, err := OpenOffline(dir)
		if err != nil {
			b.Fatal(err)
		}
		if state, err = o.StateAt(last); err != nil {
			b.Fatal(err)
		}
		if err := o.Close(); err != nil {
			b.Fatal(err)
		}
	}
	replay := time.Since(start) / time.Duration(b.N)
	// CPU time (all threads, GC included) tells the cost apart from the
	// machine's load, which on shared build machines stretches wall time.
	replayCPU := (cpuTime() - cpu0) / time.Duration(b.N)
	b.StopTimer()
	b.ReportMetric(float64(last)/replay.Seconds(), "entries/s")
	b.ReportMetric(replay.Seconds(), "s/replay")
	b.ReportMetric(replayCPU.Seconds(), "cpu-s/replay")

	// Snapshot restore of the replayed state, as raft does at start-up.
	data, err := state.Snapshot()
	if err != nil {
		b.Fatal(err)
	}
	w := newRaftFSM()
	t0 := time.Now()
	if err := w.Restore(io.NopCloser(bytes.NewReader(data))); err != nil {
		b.Fatal(err)
	}
	restore := time.Since(t0)
	var got string
	w.view(func(f *fsm.FSM) { got = f.Hash() })
	if got != state.Hash() {
		b.Fatalf("restored hash %s, replayed %s", got, state.Hash())
	}
	b.ReportMetric(restore.Seconds(), "s/restore")
	b.ReportMetric(float64(len(data))/(1<<20), "MiB/snapshot")
	b.Logf("%d entries replayed in %v (%.0f entries/s, %v of CPU); snapshot %.1f MiB restored in %v; state %d accelerators, %d models, %d replicas",
		last, replay, float64(last)/replay.Seconds(), replayCPU, float64(len(data))/(1<<20), restore,
		len(state.Accelerators()), len(state.Models()), len(state.Replicas("", "")))
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// buildReplayLog writes a data dir with n log entries unless dir already
// holds a complete one.
func buildReplayLog(dir string, n uint64) error {
	done := filepath.Join(dir, "complete")
	if _, err := os.Stat(done); err == nil {
		return nil
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	store, err := raftstore.Open(LogDir(dir), raftstore.Options{})
	if err != nil {
		return err
	}
	gen := newReplayWorkload()
	const batch = 10_000
	logs := make([]*raft.Log, 0, batch)
	for i := uint64(1); i <= n; i++ {
		logs = append(logs, gen.entry(i))
		if len(logs) == batch || i == n {
			if err := store.StoreLogs(logs); err != nil {
				store.Close()
				return err
			}
			logs = logs[:0]
		}
	}
	if err := store.Close(); err != nil {
		return err
	}
	if gen.rejected*100 > gen.commands {
		return fmt.Errorf("replay workload: %d of %d commands rejected: the generator is out of step with the state machine", gen.rejected, gen.commands)
	}
	return os.WriteFile(done, nil, 0o600)
}

// replayWorkload generates the log of a busy cluster: 64 nodes with eight
// cards each registered once, a few accelerators, then deployments coming
// and going (ApplyModel, PlaceReplicas, ReplicaStatus reports as engines
// start and run, SetNodeStatus as nodes flap, DeleteModel), with the raft
// entries a real log holds (configuration, no-op per leader). Every command
// is checked against a state machine as it is generated, so the log is one
// the cluster would really have written.
type replayWorkload struct {
	// check is the state machine every command is checked against as it
	// is generated; nil checks nothing (the soak benchmark applies them
	// itself).
	check              *fsm.FSM
	queue              []*raft.Log
	model              int
	commands, rejected int
	at                 time.Time
}

const (
	workloadNodes = 64
	workloadSlots = workloadNodes * 2 // four cards per slot, eight per node
)

func newReplayWorkload() *replayWorkload {
	return &replayWorkload{check: fsm.New(), at: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)}
}

func (w *replayWorkload) entry(index uint64) *raft.Log {
	w.at = w.at.Add(10 * time.Millisecond)
	switch index {
	case 1:
		conf := raft.Configuration{Servers: []raft.Server{
			{Suffrage: raft.Voter, ID: "s1", Address: "10.0.0.1:7001"},
			{Suffrage: raft.Voter, ID: "s2", Address: "10.0.0.2:7001"},
			{Suffrage: raft.Voter, ID: "s3", Address: "10.0.0.3:7001"},
		}}
		return &raft.Log{Index: index, Term: 1, Type: raft.LogConfiguration, Data: raft.EncodeConfiguration(conf), AppendedAt: w.at}
	case 2:
		return &raft.Log{Index: index, Term: 1, Type: raft.LogNoop, AppendedAt: w.at}
	}
	if len(w.queue) == 0 {
		w.refill()
	}
	env := w.queue[0]
	w.queue = w.queue[1:]
	env.Index, env.AppendedAt = index, w.at
	if env.Type == raft.LogCommand && w.check != nil {
		w.commands++
		if res := w.check.ApplyBytes(index, env.Data); res.GetCode() != pb.Code_CODE_OK {
			w.rejected++
		}
	}
	return env
}

func (w *replayWorkload) cmd(env *pb.Envelope) {
	env.RequestId = NewRequestID()
	env.Actor = "system"
	env.ProposedAt = timestamppb.New(w.at)
	data, err := fsm.Marshal(env)
	if err != nil {
		panic(err)
	}
	w.queue = append(w.queue, &raft.Log{Term: 2, Type: raft.LogCommand, Data: data})
}

// refill queues the next episode of the workload.
func (w *replayWorkload) refill() {
	if w.model == 0 {
		for i := range workloadNodes {
			node := &pb.Node{Name: fmt.Sprintf("gpu-%02d", i), Address: fmt.Sprintf("10.1.0.%d:7000", i),
				Role: pb.NodeRole_NODE_ROLE_CLIENT, Status: pb.NodeStatus_NODE_STATUS_ALIVE,
				Labels: map[string]string{"zone": fmt.Sprintf("z%d", i%3), "rack": fmt.Sprintf("r%d", i%8)}, Version: "0.1.0",
				GossipAddress: fmt.Sprintf("10.1.0.%d:7946", i), CpuMilli: 64000, MemoryMib: 512 << 10}
			for c := range 8 {
				node.Cards = append(node.Cards, &pb.Card{Index: uint32(c), Uuid: fmt.Sprintf("GPU-%02d-%d-8f3a", i, c), Device: "l4",
					Product: "NVIDIA L4", MemoryMib: 23034, Architecture: "ada", Fp8: true, Healthy: true})
			}
			w.cmd(&pb.Envelope{Command: &pb.Envelope_RegisterNode{RegisterNode: &pb.RegisterNode{Node: node}}})
		}
		w.cmd(&pb.Envelope{Command: &pb.Envelope_CreateAccelerator{CreateAccelerator: &pb.CreateAccelerator{
			Name: "l4-dedicated", Spec: &pb.AcceleratorSpec{Device: "l4", Tenancy: pb.Tenancy_TENANCY_DEDICATED, DevicesPerReplica: 1}}}})
		w.cmd(&pb.Envelope{Command: &pb.Envelope_CreateAccelerator{CreateAccelerator: &pb.CreateAccelerator{
			Name: "l4-shared", Spec: &pb.AcceleratorSpec{Device: "l4", Tenancy: pb.Tenancy_TENANCY_SHARED, MaxModels: 2}}}})
	}
	// One deployment's life: it takes slot k (four cards of one node),
	// replacing the deployment that held the slot before.
	k := w.model
	w.model++
	slot := k % workloadSlots
	node := fmt.Sprintf("gpu-%02d", slot/2)
	name := fmt.Sprintf("model-%d", k)
	if k >= workloadSlots {
		w.cmd(&pb.Envelope{Command: &pb.Envelope_DeleteModel{DeleteModel: &pb.DeleteModel{Name: fmt.Sprintf("model-%d", k-workloadSlots)}}})
	}
	w.cmd(&pb.Envelope{Command: &pb.Envelope_ApplyModel{ApplyModel: &pb.ApplyModel{Name: name, Spec: &pb.ModelSpec{
		Model: "/models/llama-3.1-8b-instruct", ServedModelName: name, Replicas: 4,
		Placement: &pb.PlacementSpec{Accelerator: "l4-dedicated"},
		Engine:    &pb.EngineSpec{Kind: "vllm", MaxModelLen: 8192, Args: []string{"--enable-prefix-caching"}},
		Resources: &pb.HostResources{CpuMilli: 4000, MemoryMib: 16384},
	}}}})
	place := &pb.PlaceReplicas{Policy: "binpack"}
	for r := range 4 {
		place.Placements = append(place.Placements, &pb.Placement{Model: name, Replica: uint32(r), Generation: 1,
			Node: node, Cards: []uint32{uint32(slot%2*4 + r)}, ShareMilli: 1000})
	}
	w.cmd(&pb.Envelope{Command: &pb.Envelope_PlaceReplicas{PlaceReplicas: place}})
	for _, st := range []pb.ReplicaState{pb.ReplicaState_REPLICA_STATE_STARTING, pb.ReplicaState_REPLICA_STATE_RUNNING} {
		for r := range 4 {
			rs := &pb.ReplicaStatus{Model: name, Replica: uint32(r), Generation: 1, Node: node, State: st}
			if st == pb.ReplicaState_REPLICA_STATE_RUNNING {
				rs.Endpoint = fmt.Sprintf("http://10.1.0.%d:%d", slot/2, 8000+slot%2*4+r)
			}
			w.cmd(&pb.Envelope{Command: &pb.Envelope_ReplicaStatus{ReplicaStatus: rs}})
		}
	}
	if k%16 == 15 { // a node flaps now and then
		flap := fmt.Sprintf("gpu-%02d", (k*7)%workloadNodes)
		w.cmd(&pb.Envelope{Command: &pb.Envelope_SetNodeStatus{SetNodeStatus: &pb.SetNodeStatus{Node: flap, Status: pb.NodeStatus_NODE_STATUS_DOWN}}})
		w.cmd(&pb.Envelope{Command: &pb.Envelope_SetNodeStatus{SetNodeStatus: &pb.SetNodeStatus{Node: flap, Status: pb.NodeStatus_NODE_STATUS_ALIVE}}})
	}
	if k%1000 == 999 { // a new leader's no-op
		w.queue = append(w.queue, &raft.Log{Term: 2, Type: raft.LogNoop})
	}
}
