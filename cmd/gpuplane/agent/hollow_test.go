package agent_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/cmd/gpuplane/agent"
	"github.com/gpuplane/gpuplane/internal/testutil"
)

// stopAll stops nodes at once.
func stopAll(t *testing.T, nodes []*node) {
	var wg sync.WaitGroup
	for _, n := range nodes {
		if n != nil {
			wg.Go(func() { n.stop(t) })
		}
	}
	wg.Wait()
}

type replicaJSON struct {
	Model    string
	Index    uint32
	Node     string
	Cards    []uint32
	State    string
	Endpoint string
}

func replicasOn(n *node) ([]replicaJSON, error) {
	out, err := tryCLI(n, "replicas", "list", "-o", "json")
	if err != nil {
		return nil, err
	}
	var rs []replicaJSON
	return rs, json.Unmarshal([]byte(out), &rs)
}

// TestHollowFleet runs 20 hollow client nodes (agent.Config.Hollow, what
// `gpuplane agent --hollow N` and bench/fleet start) against one server:
// they register with their simulated cards, the replicas placed on them
// report Running through the log with no engine process, and when some of
// them die their nodes are marked down and their replicas placed again, on
// live nodes, with no card given to two replicas.
func TestHollowFleet(t *testing.T) {
	srv := newNode(t, "server", true, "")
	srv.cfg.BootstrapExpect = 0
	srv.cfg.Dev = true
	srv.start(t)

	const fleet, killed, replicas = 20, 4, 40
	hollow := make([]*node, fleet)
	// Stopping an agent takes about a second (its API's shutdown): stop
	// them together.
	t.Cleanup(func() { stopAll(t, hollow) })
	for i := range hollow {
		n := &node{cfg: agent.Config{
			Hollow: true, NodeName: fmt.Sprintf("hollow-%02d", i), DataDir: t.TempDir(), Bind: "127.0.0.1",
			Join: []string{srv.gossip()},
		}}
		n.start(t)
		hollow[i] = n
	}
	t.Logf("%s: %v", "every hollow node registered alive with 8 cards", testutil.Eventually(t, 60*time.Second, "every hollow node registered alive with 8 cards", func() error {
		ns, err := nodesOn(srv)
		if err != nil {
			return err
		}
		alive := 0
		for _, n := range ns {
			if strings.HasPrefix(n.Name, "hollow-") && n.Status == "alive" {
				alive++
			}
		}
		if alive != fleet {
			return fmt.Errorf("%d of %d hollow nodes alive", alive, fleet)
		}
		d, err := device(srv, "h100")
		if err != nil {
			return err
		}
		if d.Total != fleet*8 {
			return fmt.Errorf("%d h100 cards, want %d", d.Total, fleet*8)
		}
		return nil
	}))
	gpuplane(t, srv, "accelerators", "create", "big", "--device", "h100")
	gpuplane(t, srv, "models", "deploy", "m", "--accelerator", "big", "--model", "/m/x", "--engine", "sim",
		"--replicas", fmt.Sprint(replicas))

	// allRunning checks that every replica runs on a node not in dead, each
	// card of each node holding at most one replica (the accelerator is
	// dedicated).
	allRunning := func(dead map[string]bool) func() error {
		return func() error {
			rs, err := replicasOn(srv)
			if err != nil {
				return err
			}
			if len(rs) != replicas {
				return fmt.Errorf("%d replicas listed, want %d", len(rs), replicas)
			}
			used := map[string]string{}
			for _, r := range rs {
				id := fmt.Sprintf("%s/%d", r.Model, r.Index)
				if r.State != "running" || !strings.HasPrefix(r.Node, "hollow-") || dead[r.Node] {
					return fmt.Errorf("replica %s is %s on %q", id, r.State, r.Node)
				}
				if !strings.Contains(r.Endpoint, "/hollow/") {
					return fmt.Errorf("replica %s reports endpoint %q, not a hollow engine's", id, r.Endpoint)
				}
				for _, c := range r.Cards {
					card := fmt.Sprintf("%s/%d", r.Node, c)
					if other, ok := used[card]; ok {
						t.Fatalf("card %s holds both %s and %s", card, other, id)
					}
					used[card] = id
				}
			}
			return nil
		}
	}
	t.Logf("%s: %v", "every replica Running on a hollow node", testutil.Eventually(t, 60*time.Second, "every replica Running on a hollow node", allRunning(nil)))

	// Kill the nodes holding the first replicas (abruptly: no leave), so
	// that re-placement has work to do.
	rs, err := replicasOn(srv)
	if err != nil {
		t.Fatal(err)
	}
	dead := map[string]bool{}
	for _, r := range rs {
		if len(dead) < killed && !dead[r.Node] {
			dead[r.Node] = true
		}
	}
	var victims []*node
	for _, n := range hollow {
		if dead[n.cfg.NodeName] {
			victims = append(victims, n)
		}
	}
	stopAll(t, victims)
	t.Logf("%s: %v", "the killed nodes marked down", testutil.Eventually(t, 60*time.Second, "the killed nodes marked down", func() error {
		ns, err := nodesOn(srv)
		if err != nil {
			return err
		}
		var notDown []string
		for _, n := range ns {
			if dead[n.Name] && n.Status != "down" {
				notDown = append(notDown, n.Name+" "+n.Status)
			}
		}
		if len(notDown) > 0 {
			slices.Sort(notDown)
			return fmt.Errorf("not down yet: %s", strings.Join(notDown, ", "))
		}
		return nil
	}))
	t.Logf("%s: %v", "the dead nodes' replicas Running elsewhere", testutil.Eventually(t, 60*time.Second, "the dead nodes' replicas Running elsewhere", allRunning(dead)))
}
