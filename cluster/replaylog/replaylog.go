// Package replaylog generates the Raft log of a busy cluster for the
// benchmarks and tests that replay, archive or soak a long log (package
// cluster, package audit): realistic entries, written straight into a log
// store.
package replaylog

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/gpuplane/gpuplane/cluster/raftstore"
	"github.com/gpuplane/gpuplane/fsm"
	"github.com/gpuplane/gpuplane/internal/engines"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// Build writes a data dir with n log entries of the workload into its log
// dir, logDir (cluster.LogDir(dir)), unless dir already holds a complete
// one. newID gives each command its request id (cluster.NewRequestID).
func Build(dir, logDir string, n uint64, newID func() string) error {
	done := filepath.Join(dir, "complete")
	if _, err := os.Stat(done); err == nil {
		return nil
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	store, err := raftstore.Open(logDir, raftstore.Options{})
	if err != nil {
		return err
	}
	gen := New(true, newID)
	const batch = 10_000
	logs := make([]*raft.Log, 0, batch)
	for i := uint64(1); i <= n; i++ {
		logs = append(logs, gen.Entry(i))
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

// Workload generates the log of a busy cluster: 64 nodes with eight
// cards each registered once, a few accelerators, then deployments coming
// and going (ApplyModel, PlaceReplicas, ReplicaStatus reports as engines
// start and run, SetNodeStatus as nodes flap, DeleteModel), with the raft
// entries a real log holds (configuration, no-op per leader). Every command
// is checked against a state machine as it is generated, so the log is one
// the cluster would really have written.
type Workload struct {
	// check is the state machine every command is checked against as it
	// is generated; nil checks nothing.
	check              *fsm.FSM
	newID              func() string
	queue              []*raft.Log
	model              int
	commands, rejected int
	at                 time.Time
}

const (
	workloadNodes = 64
	workloadSlots = workloadNodes * 2 // four cards per slot, eight per node
)

// New returns a workload at its first entry. With check, every command is
// applied to a state machine as it is generated, and Build fails when more
// than one in a hundred is rejected; a caller that applies the entries
// itself passes false. newID gives each command its request id.
func New(check bool, newID func() string) *Workload {
	w := &Workload{newID: newID, at: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)}
	if check {
		w.check = fsm.New()
	}
	return w
}

// Entry returns the log entry at index; entries must be asked for in
// order from 1.
func (w *Workload) Entry(index uint64) *raft.Log {
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

func (w *Workload) cmd(env *pb.Envelope) {
	env.RequestId = w.newID()
	env.Actor = "system"
	env.ProposedAt = timestamppb.New(w.at)
	data, err := fsm.Marshal(env)
	if err != nil {
		panic(err)
	}
	w.queue = append(w.queue, &raft.Log{Term: 2, Type: raft.LogCommand, Data: data})
}

// refill queues the next episode of the workload.
func (w *Workload) refill() {
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
		Engine:    &pb.EngineSpec{Kind: engines.VLLM, MaxModelLen: 8192, Args: []string{"--enable-prefix-caching"}},
		Resources: &pb.HostResources{CpuMilli: 4000, MemoryMib: 16384},
	}}}})
	place := &pb.PlaceReplicas{Policy: "binpack"}
	for r := range 4 {
		place.Placements = append(place.Placements, &pb.Placement{Model: name, Replica: uint32(r), Generation: 1,
			Node: node, Cards: []uint32{uint32(slot%2*4 + r)}})
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
