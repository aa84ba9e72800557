package fsm_test

import (
	"fmt"
	"testing"

	"google.golang.org/protobuf/encoding/prototext"

	"github.com/gpuplane/gpuplane/fsm"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// TestPlanChecks covers the checks of a plan as a whole that the golden
// scripts do not: a card listed twice in one placement, one replica placed
// twice in a plan, two nodes' host resources summed over a plan's earlier
// placements, a plan naming a node twice, and a node going down releasing
// exactly its own replicas.
func TestPlanChecks(t *testing.T) {
	f := fsm.New()
	index := uint64(0)
	apply := func(text string) string {
		t.Helper()
		env := &pb.Envelope{}
		if err := prototext.Unmarshal([]byte(text), env); err != nil {
			t.Fatal(err)
		}
		index++
		return formatResult(f.Apply(index, env))
	}
	steps := []struct{ cmd, want string }{
		{`register_node: {node: {name: "a" role: NODE_ROLE_CLIENT cpu_milli: 3000 memory_mib: 1000
		  cards: {index: 0 device: "l4" memory_mib: 23034 healthy: true}
		  cards: {index: 1 device: "l4" memory_mib: 23034 healthy: true}
		  cards: {index: 2 device: "l4" memory_mib: 23034 healthy: true}}}`,
			"ok created: node \"a\" registered with 3 cards\n"},
		{`register_node: {node: {name: "b" role: NODE_ROLE_CLIENT cpu_milli: 3000 memory_mib: 1000
		  cards: {index: 0 device: "l4" memory_mib: 23034 healthy: true}
		  cards: {index: 1 device: "l4" memory_mib: 23034 healthy: true}}}`,
			"ok created: node \"b\" registered with 2 cards\n"},
		{`create_accelerator: {name: "pair" spec: {device: "l4" devices_per_replica: 2}}`,
			"ok created: accelerator \"pair\" created\n"},
		{`create_accelerator: {name: "one" spec: {device: "l4" devices_per_replica: 1}}`,
			"ok created: accelerator \"one\" created\n"},
		{`apply_model: {name: "m" spec: {model: "w" replicas: 3 placement: {accelerator: "one"} resources: {cpu_milli: 1000 memory_mib: 400}}}`,
			"ok created: deployment \"m\" created with 3 replicas\n"},
		{`apply_model: {name: "p" spec: {model: "w" replicas: 1 placement: {accelerator: "pair"} engine: {tensor_parallel: 2}}}`,
			"ok created: deployment \"p\" created with 1 replicas\n"},
		{`place_replicas: {placements: {model: "p" replica: 0 generation: 1 node: "b" cards: [1, 1]}}`,
			"conflict: placement 0 (p/0): card 1 listed twice; plan rejected, nothing applied\n"},
		{`place_replicas: {
		  placements: {model: "m" replica: 0 generation: 1 node: "a" cards: 0}
		  placements: {model: "m" replica: 0 generation: 1 node: "a" cards: 1}}`,
			"conflict: placement 1 (m/0): already placed on ; plan rejected, nothing applied\n"},
		{`place_replicas: {
		  placements: {model: "m" replica: 0 generation: 1 node: "a" cards: 0}
		  placements: {model: "m" replica: 1 generation: 1 node: "a" cards: 1}
		  placements: {model: "m" replica: 2 generation: 1 node: "a" cards: 2}}`,
			"conflict: placement 2 (m/2): node \"a\" has 200Mi host memory free, replica needs 400Mi; plan rejected, nothing applied\n"},
		{`place_replicas: {
		  placements: {model: "m" replica: 0 generation: 1 node: "a" cards: 0}
		  placements: {model: "m" replica: 1 generation: 1 node: "b" cards: 0}
		  placements: {model: "m" replica: 2 generation: 1 node: "a" cards: 1}}`,
			"ok configured: placed 3 replicas, 0 pending reasons updated\n"},
		{`place_replicas: {placements: {model: "p" replica: 0 generation: 1 node: "a" cards: [2, 0]}}`,
			"conflict: placement 0 (p/0): card a/0: bound to accelerator \"one\"; plan rejected, nothing applied\n"},
		{`set_node_status: {node: "a" status: NODE_STATUS_DOWN}`,
			"ok configured: node \"a\" is down\n"},
		{`place_replicas: {placements: {model: "p" replica: 0 generation: 1 node: "b" cards: [1, 0]}}`,
			"conflict: placement 0 (p/0): card b/0: bound to accelerator \"one\"; plan rejected, nothing applied\n"},
		{`set_node_status: {node: "a" status: NODE_STATUS_ALIVE}`,
			"ok configured: node \"a\" is alive\n"},
		{`place_replicas: {
		  placements: {model: "m" replica: 0 generation: 1 node: "a" cards: 2}
		  placements: {model: "p" replica: 0 generation: 1 node: "a" cards: [0, 1]}}`,
			"ok configured: placed 2 replicas, 0 pending reasons updated\n"},
		{`replica_status: {model: "m" replica: 1 generation: 1 node: "b" state: REPLICA_STATE_RUNNING endpoint: "http://b:8000"}`,
			"ok configured: replica m/1 is Running\n"},
		{`replica_status: {model: "m" replica: 1 generation: 1 node: "b" state: REPLICA_STATE_RUNNING endpoint: "http://b:8000"}`,
			"ok unchanged: replica m/1 unchanged\n"},
		{`replica_status: {model: "m" replica: 2 generation: 1 node: "b" state: REPLICA_STATE_RUNNING}`,
			"failed_precondition: stale report for replica m/2 from node \"b\" generation 1: it is placed on \"\" at generation 1\n"},
	}
	for _, s := range steps {
		if got := apply(s.cmd); got != s.want {
			t.Fatalf("%s:\ngot  %q\nwant %q", s.cmd, got, s.want)
		}
	}
	var got string
	for _, r := range f.Replicas("", "") {
		got += fmt.Sprintf("%s/%d@%s%v %s; ", r.Model, r.Index, r.Node, r.Cards, r.Reason)
	}
	// m/0, placed again after node a went down, says so until its node
	// reports it.
	want := "m/0@a[2] placed after a failover: node a is down; m/1@b[0] ; m/2@[] node a is down: waiting to be placed elsewhere; p/0@a[0 1] ; "
	if got != want || f.Hash() != "59aff52c4e713fcca413e1d3f7bb28ba602f46738d73443996c28c85b96d6b1d" {
		t.Fatalf("replicas %q\nhash %s", got, f.Hash())
	}
}
