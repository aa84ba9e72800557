package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/gpuplane/gpuplane/cluster"
	"github.com/gpuplane/gpuplane/cluster/raftstore/logtamper"
	"github.com/gpuplane/gpuplane/cmd/gpuplane/agent"
	"github.com/gpuplane/gpuplane/fsm"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// startAuditAgent starts an in-process --dev agent on loopback with a data dir
// the test keeps after the agent stops.
func startAuditAgent(t *testing.T) (*agent.Agent, string) {
	t.Helper()
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a, err := agent.Start(ctx, agent.Config{
		Dev: true, NodeName: "dev1", DataDir: dir, APIPort: 0, RaftPort: freePort(t), GossipPort: freePort(t), SimGPUs: "l4=2",
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a, dir
}

// session is a scripted history of commands through the log: nodes joining,
// failing and coming back, accelerators and deployments created, changed and
// deleted, and commands the state machine rejects.
type session struct {
	t *testing.T
	c *cluster.Cluster
	n int
}

func (s *session) apply(actor string, env *pb.Envelope) {
	s.t.Helper()
	env.Actor = actor
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := s.c.Apply(ctx, env); err != nil {
		s.t.Fatalf("command %d: %v", s.n, err)
	}
	s.n++
}

func (s *session) round(i int) {
	node := fmt.Sprintf("w%d", i)
	acc := fmt.Sprintf("acc%d", i)
	model := fmt.Sprintf("m%d", i)
	tenancy := pb.Tenancy_TENANCY_SHARED
	var maxModels uint32 = 2
	if i%2 == 1 {
		tenancy, maxModels = pb.Tenancy_TENANCY_DEDICATED, 0
	}
	cards := []*pb.Card{
		{Index: 0, Uuid: "GPU-" + node + "-0", Device: "l4", Product: "NVIDIA L4", MemoryMib: 23034, Healthy: true},
		{Index: 1, Uuid: "GPU-" + node + "-1", Device: "l4", Product: "NVIDIA L4", MemoryMib: 23034, Healthy: true},
	}
	spec := func(replicas uint32) *pb.ModelSpec {
		s := &pb.ModelSpec{Model: "/models/" + model, Replicas: replicas, Placement: &pb.PlacementSpec{Accelerator: acc},
			Engine: &pb.EngineSpec{Kind: "sim"}}
		if tenancy == pb.Tenancy_TENANCY_SHARED {
			s.Engine.MemoryPercent = 40
		}
		return s
	}
	s.apply("node/"+node, &pb.Envelope{Command: &pb.Envelope_RegisterNode{RegisterNode: &pb.RegisterNode{Node: &pb.Node{
		Name: node, Address: "127.0.0.1:1", Role: pb.NodeRole_NODE_ROLE_CLIENT, Status: pb.NodeStatus_NODE_STATUS_ALIVE, Cards: cards}}}})
	s.apply("alice", &pb.Envelope{Command: &pb.Envelope_CreateAccelerator{CreateAccelerator: &pb.CreateAccelerator{
		Name: acc, Spec: &pb.AcceleratorSpec{Device: "l4", Tenancy: tenancy, MaxModels: maxModels, DevicesPerReplica: map[bool]uint32{true: 1}[tenancy == pb.Tenancy_TENANCY_DEDICATED]}}}})
	s.apply("alice", &pb.Envelope{Command: &pb.Envelope_CreateAccelerator{CreateAccelerator: &pb.CreateAccelerator{
		Name: acc, Spec: &pb.AcceleratorSpec{Device: "l4", Tenancy: tenancy}}}}) // rejected: exists
	s.apply("bob", &pb.Envelope{Command: &pb.Envelope_ApplyModel{ApplyModel: &pb.ApplyModel{Name: model, Spec: spec(2)}}})
	s.apply("bob", &pb.Envelope{Command: &pb.Envelope_ApplyModel{ApplyModel: &pb.ApplyModel{Name: model, Spec: spec(3)}}})
	s.apply("system", &pb.Envelope{Command: &pb.Envelope_SetNodeStatus{SetNodeStatus: &pb.SetNodeStatus{Node: node, Status: pb.NodeStatus_NODE_STATUS_DOWN}}})
	s.apply("system", &pb.Envelope{Command: &pb.Envelope_SetNodeStatus{SetNodeStatus: &pb.SetNodeStatus{Node: node, Status: pb.NodeStatus_NODE_STATUS_ALIVE}}})
	s.apply("bob", &pb.Envelope{Command: &pb.Envelope_ApplyModel{ApplyModel: &pb.ApplyModel{Name: "ghost", Spec: &pb.ModelSpec{
		Model: "m", Replicas: 1, Placement: &pb.PlacementSpec{Accelerator: "missing"}}}}}) // rejected: no accelerator
	s.apply("node/"+node, &pb.Envelope{Command: &pb.Envelope_UpdateInventory{UpdateInventory: &pb.UpdateInventory{Node: node, Cards: cards[:1]}}})
	if i%3 == 0 {
		s.apply("bob", &pb.Envelope{Command: &pb.Envelope_DeleteModel{DeleteModel: &pb.DeleteModel{Name: model}}})
		s.apply("alice", &pb.Envelope{Command: &pb.Envelope_DeleteAccelerator{DeleteAccelerator: &pb.DeleteAccelerator{Name: acc}}})
	} else {
		s.apply("alice", &pb.Envelope{Command: &pb.Envelope_DeleteAccelerator{DeleteAccelerator: &pb.DeleteAccelerator{Name: acc}}}) // refused: in use
		s.apply("system", &pb.Envelope{Command: &pb.Envelope_DeregisterNode{DeregisterNode: &pb.DeregisterNode{Node: fmt.Sprintf("w%d", i-1)}}})
	}
}

// liveListings is what the live `list -o json` commands printed, and the
// applied index they all reflect.
type liveListings struct {
	index uint64
	lists map[string]string // replay field -> stdout
}

var listCommands = map[string][]string{
	"nodes":        {"nodes", "list"},
	"devices":      {"devices", "list"},
	"accelerators": {"accelerators", "list"},
	"models":       {"models", "list"},
	"replicas":     {"replicas", "list"},
}

// captureLive runs every list command and returns their output once the
// applied index stayed the same throughout (the placer may append entries
// at any time), so the listings show the state right after that entry.
func captureLive(t *testing.T, a *agent.Agent) liveListings {
	t.Helper()
	for try := 0; try < 50; try++ {
		before := a.Cluster().AppliedIndex()
		out := liveListings{index: before, lists: map[string]string{}}
		for field, args := range listCommands {
			r := run(t, "", nil, append([]string{"--addr", a.APIURL(), "-o", "json"}, args...)...)
			if r.code != 0 {
				t.Fatalf("%v: exit %d: %s", args, r.code, r.stderr)
			}
			out.lists[field] = r.stdout
		}
		if a.Cluster().AppliedIndex() == before {
			return out
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("the applied index never stayed still for a listing")
	return liveListings{}
}

func jsonValue(t *testing.T, b []byte) any {
	t.Helper()
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("invalid JSON %q: %v", b, err)
	}
	return v
}

// TestAuditReplayVerifyTamper runs a scripted session of more than 100
// commands on a dev agent, then checks that `audit replay --at N -o json`
// equals, field for field, what the live listings printed right after entry
// N; that `audit verify` passes live and offline; and that an entry altered
// on disk makes offline verify fail naming its index.
func TestAuditReplayVerifyTamper(t *testing.T) {
	a, dir := startAuditAgent(t)
	s := &session{t: t, c: a.Cluster()}
	var captured []liveListings
	for i := range 12 {
		s.round(i)
		if i == 0 || i == 4 || i == 7 || i == 11 {
			captured = append(captured, captureLive(t, a))
		}
	}
	if s.n < 100 {
		t.Fatalf("session has %d commands, want at least 100", s.n)
	}

	for _, live := range captured {
		r := run(t, "", nil, "--addr", a.APIURL(), "-o", "json", "audit", "replay", "--at", strconv.FormatUint(live.index, 10))
		if r.code != 0 {
			t.Fatalf("audit replay --at %d: exit %d: %s", live.index, r.code, r.stderr)
		}
		var replayed map[string]json.RawMessage
		if err := json.Unmarshal([]byte(r.stdout), &replayed); err != nil {
			t.Fatalf("audit replay output: %v\n%s", err, r.stdout)
		}
		for field, out := range live.lists {
			got, want := jsonValue(t, replayed[field]), jsonValue(t, []byte(out))
			if !reflect.DeepEqual(got, want) {
				t.Errorf("replay at %d, %s:\n got %s\nwant %s", live.index, field, replayed[field], out)
			}
		}
	}
	last := captured[len(captured)-1].lists
	for _, field := range []string{"accelerators", "models", "replicas"} {
		if strings.TrimSpace(last[field]) == "[]" {
			t.Errorf("the last listing has no %s: the session did not exercise them", field)
		}
	}

	// The table form of the log: summaries, results, membership.
	r := run(t, "", nil, "--addr", a.APIURL(), "audit", "log")
	for _, want := range []string{"Membership dev1 joined as voter", "CreateAccelerator acc0 (shared l4)", "applied: created",
		"rejected: ", "SetNodeStatus w1 down", "alice"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("audit log lacks %q:\n%s", want, r.stdout)
		}
	}
	r = run(t, "", nil, "--addr", a.APIURL(), "audit", "log", "--resource", "accelerator/acc3", "-o", "json")
	var evs []map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &evs); err != nil || len(evs) < 3 {
		t.Fatalf("audit log --resource accelerator/acc3 -o json: %v (%d events)\n%s", err, len(evs), r.stdout)
	}
	if _, ok := evs[0]["envelope"].(map[string]any)["createAccelerator"]; !ok {
		t.Errorf("first acc3 event is not its creation with the full command: %v", evs[0])
	}

	if r := run(t, "", nil, "--addr", a.APIURL(), "audit", "verify"); r.code != 0 || !strings.Contains(r.stdout, "ok: 1 server(s) agree") {
		t.Fatalf("live audit verify: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	liveExport := run(t, "", nil, "--addr", a.APIURL(), "audit", "export")

	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if r := run(t, "", nil, "audit", "verify", "--data-dir", dir); r.code != 0 {
		t.Fatalf("offline audit verify: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	offExport := run(t, "", nil, "audit", "export", "--data-dir", dir)
	// Shutting down may append entries (engines reported stopped), so the
	// live export must be a prefix of the offline one.
	if !strings.HasPrefix(offExport.stdout, liveExport.stdout) || strings.Count(offExport.stdout, "\n") < 100 {
		t.Errorf("offline export (%d lines) does not start with the live export (%d lines)",
			strings.Count(offExport.stdout, "\n"), strings.Count(liveExport.stdout, "\n"))
	}

	// Alter one entry on disk: acc5's creation now names another device.
	index := tamper(t, dir, func(env *pb.Envelope) bool {
		ca := env.GetCreateAccelerator()
		if ca.GetName() != "acc5" || ca.GetSpec().GetDevicesPerReplica() == 0 {
			return false
		}
		ca.Spec.DevicesPerReplica = 2
		return true
	})
	r = run(t, "", nil, "audit", "verify", "--data-dir", dir)
	if r.code != 1 {
		t.Fatalf("verify of an altered log: exit %d, want 1\n%s%s", r.code, r.stdout, r.stderr)
	}
	if want := fmt.Sprintf("part at index %d", index); !strings.Contains(r.stderr, want) {
		t.Errorf("verify of an altered log does not name index %d:\n%s", index, r.stderr)
	}

	// Damage on disk (a byte flipped inside an entry, not rewritten through
	// the store): every offline command refuses the log, naming the file,
	// offset and entry index, with a non-zero exit and no panic.
	segs, _ := filepath.Glob(filepath.Join(cluster.LogDir(dir), "*.wal"))
	if len(segs) == 0 {
		t.Fatal("no log segments")
	}
	seg := segs[len(segs)-1]
	data, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	at := bytes.LastIndex(data, []byte("acc3"))
	if at < 0 {
		t.Fatalf("acc3 not in %s", seg)
	}
	data[at] ^= 0x01
	if err := os.WriteFile(seg, data, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"audit", "verify", "--data-dir", dir}, {"audit", "log", "--data-dir", dir}} {
		r := run(t, "", nil, args...)
		if r.code == 0 || strings.Contains(r.stderr, "panic") || !strings.Contains(r.stderr, "raft log damaged") ||
			!strings.Contains(r.stderr, seg) || !strings.Contains(r.stderr, "entry index") {
			t.Errorf("%s on a damaged log: exit %d\n%s%s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
		}
	}
}

// tamper rewrites the data of the first command entry that change alters,
// in the stopped node's log, and returns its index. It writes through the
// store (raft-wal keeps its checksums right), as someone with write access
// to the data dir could: only the hash chain can tell.
func tamper(t *testing.T, dir string, change func(*pb.Envelope) bool) uint64 {
	t.Helper()
	var marshalErr error
	altered, err := logtamper.Rewrite(cluster.LogDir(dir), func(l *raft.Log) bool {
		env := &pb.Envelope{}
		if l.Type != raft.LogCommand || proto.Unmarshal(l.Data, env) != nil || !change(env) {
			return false
		}
		l.Data, marshalErr = fsm.Marshal(env)
		return true
	})
	if err == nil {
		err = marshalErr
	}
	if err != nil {
		t.Fatal(err)
	}
	return altered
}
