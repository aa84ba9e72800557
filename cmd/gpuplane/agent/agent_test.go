package agent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/cluster"
	"github.com/gpuplane/gpuplane/cmd/gpuplane/agent"
	"github.com/gpuplane/gpuplane/cmd/gpuplane/cli"
	"github.com/gpuplane/gpuplane/internal/porttest"
	"github.com/gpuplane/gpuplane/internal/testutil"
)

// node is one in-process agent with fixed ports and data dir, so that it
// can be stopped abruptly and started again on the same identity.
type node struct {
	cfg agent.Config
	a   *agent.Agent // nil while stopped
}

func (n *node) url() string {
	return "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(n.cfg.APIPort))
}

func (n *node) gossip() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(n.cfg.GossipPort))
}

func (n *node) start(t *testing.T) {
	t.Helper()
	a, err := agent.Start(context.Background(), n.cfg)
	if err != nil {
		t.Fatalf("start %s: %v", n.cfg.NodeName, err)
	}
	n.a = a
}

// stop stops the node without leaving the cluster: Raft, gossip and the API
// go away at once, as in a crash (the data dir is fsynced either way).
func (n *node) stop(t *testing.T) {
	t.Helper()
	if n.a == nil {
		return
	}
	if err := n.a.Close(); err != nil {
		t.Logf("stop %s: %v", n.cfg.NodeName, err)
	}
	n.a = nil
}

// freePort returns a port free for both TCP and UDP on loopback (gossip uses
// both on one port) that no other test, in this binary or another running
// beside it, is given (see porttest).
func freePort(t *testing.T) int {
	t.Helper()
	return porttest.Free(t)
}

func newNode(t *testing.T, name string, server bool, sim string) *node {
	cfg := agent.Config{
		Server: server, NodeName: name, DataDir: t.TempDir(), Bind: "127.0.0.1",
		APIPort: freePort(t), RaftPort: freePort(t), GossipPort: freePort(t), SimGPUs: sim,
	}
	if server {
		cfg.BootstrapExpect = 3
	}
	if os.Getenv("GPUPLANE_TEST_LOG") != "" {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})).With("agent", name)
	}
	n := &node{cfg: cfg}
	t.Cleanup(func() { n.stop(t) })
	return n
}

// gpuplane runs the CLI against n and returns stdout, failing on an error.
func gpuplane(t *testing.T, n *node, args ...string) string {
	t.Helper()
	out, err := tryCLI(n, args...)
	if err != nil {
		t.Fatalf("gpuplane %s on %s: %v", strings.Join(args, " "), n.cfg.NodeName, err)
	}
	return out
}

func tryCLI(n *node, args ...string) (string, error) {
	var stdout, stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	code := cli.Run(ctx, append([]string{"--addr", n.url()}, args...), nil, &stdout, &stderr)
	if code != 0 {
		return stdout.String(), fmt.Errorf("exit %d: %s", code, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

type member struct {
	Name, Address, Role, Status, Raft string
	Leader                            bool
}

func members(n *node) ([]member, error) {
	out, err := tryCLI(n, "cluster", "members", "-o", "json")
	if err != nil {
		return nil, err
	}
	var ms []member
	return ms, json.Unmarshal([]byte(out), &ms)
}

// checkMembers wants every node alive, three voters and one leader.
func checkMembers(n *node, want int) error {
	ms, err := members(n)
	if err != nil {
		return err
	}
	alive, voters, leaders := 0, 0, 0
	for _, m := range ms {
		if m.Status == "alive" {
			alive++
		}
		if m.Raft == "voter" {
			voters++
		}
		if m.Leader {
			leaders++
		}
	}
	if len(ms) != want || alive != want || voters != 3 || leaders != 1 {
		return fmt.Errorf("%s sees %d members, %d alive, %d voters, %d leaders: %+v", n.cfg.NodeName, len(ms), alive, voters, leaders, ms)
	}
	return nil
}

type nodeJSON struct {
	Name   string
	Status string
}

func nodesOn(n *node) ([]nodeJSON, error) {
	out, err := tryCLI(n, "nodes", "list", "-o", "json")
	if err != nil {
		return nil, err
	}
	var ns []nodeJSON
	return ns, json.Unmarshal([]byte(out), &ns)
}

type deviceJSON struct {
	Name        string
	Total, Free int
}

func device(n *node, name string) (deviceJSON, error) {
	out, err := tryCLI(n, "devices", "list", "-o", "json")
	if err != nil {
		return deviceJSON{}, err
	}
	var ds []deviceJSON
	if err := json.Unmarshal([]byte(out), &ds); err != nil {
		return deviceJSON{}, err
	}
	for _, d := range ds {
		if d.Name == name {
			return d, nil
		}
	}
	return deviceJSON{}, fmt.Errorf("%s lists no %s devices: %s", n.cfg.NodeName, name, out)
}

type statusJSON struct {
	Leader       string
	StateHash    string
	AppliedIndex uint64
	CommitIndex  uint64
}

func status(n *node) (statusJSON, error) {
	out, err := tryCLI(n, "cluster", "status", "-o", "json")
	if err != nil {
		return statusJSON{}, err
	}
	var st statusJSON
	return st, json.Unmarshal([]byte(out), &st)
}

// startCluster gives every node the same --join (the servers' gossip
// addresses, each server itself included) and starts them all at once:
// each server waits in the background for the others before the cluster
// forms. It returns the servers then the clients.
func startCluster(t *testing.T, servers, clients []*node) []*node {
	t.Helper()
	var join []string
	for _, s := range servers {
		join = append(join, s.gossip())
	}
	all := append(append([]*node{}, servers...), clients...)
	var wg sync.WaitGroup
	errs := make(chan error, len(all))
	for _, n := range all {
		n.cfg.Join = join
		wg.Go(func() {
			a, err := agent.Start(context.Background(), n.cfg)
			n.a = a
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	return all
}

// TestCluster starts three servers with the same flags (but names, ports and
// data dirs) and --bootstrap-expect 3, and two client agents with simulated
// cards, then checks membership, forwarding, leader failover and rejoin, and
// a client's failure and return, through the CLI on every node.
func TestCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts five agents")
	}
	servers := []*node{newNode(t, "s1", true, "l4=1"), newNode(t, "s2", true, "l4=1"), newNode(t, "s3", true, "l4=1")}
	clients := []*node{newNode(t, "c1", false, "h100=2"), newNode(t, "c2", false, "h100=2")}
	all := startCluster(t, servers, clients)

	// 1. One cluster: five alive members, three voters and one leader on any
	// node, and every node counts the clients' cards.
	formed := testutil.Eventually(t, 20*time.Second, "cluster forms", func() error {
		for _, n := range all {
			if err := checkMembers(n, 5); err != nil {
				return err
			}
		}
		return nil
	})
	t.Logf("five nodes formed one cluster in %v", formed)
	testutil.Eventually(t, 10*time.Second, "clients' cards counted", func() error {
		for _, n := range all {
			d, err := device(n, "h100")
			if err != nil {
				return err
			}
			if d.Total != 4 || d.Free != 4 {
				return fmt.Errorf("%s: h100 total %d free %d, want 4 and 4", n.cfg.NodeName, d.Total, d.Free)
			}
		}
		return nil
	})
	table := gpuplane(t, clients[0], "cluster", "members")
	if !strings.HasPrefix(table, "NAME") || !strings.Contains(table, "LEADER") || strings.Count(table, "\n") != 6 {
		t.Fatalf("cluster members table:\n%s", table)
	}

	// 2. Writes through a follower and through a client are forwarded to
	// the leader and visible on every node at once (linearizable reads).
	leader := leaderOf(t, servers)
	var follower *node
	for _, s := range servers {
		if s != leader {
			follower = s
			break
		}
	}
	gpuplane(t, follower, "accelerators", "create", "via-follower", "--device", "h100")
	gpuplane(t, clients[0], "accelerators", "create", "via-client", "--device", "h100")
	for _, n := range all {
		for _, name := range []string{"via-follower", "via-client"} {
			gpuplane(t, n, "accelerators", "get", name)
		}
	}

	// 3. Stop the leader abruptly: a new leader is elected and writes through
	// every surviving node succeed.
	leader.stop(t)
	stopped := time.Now()
	var survivors []*node
	for _, n := range all {
		if n != leader {
			survivors = append(survivors, n)
		}
	}
	// How soon is measured (bench/cluster's failover benchmark),
	// not asserted: on a loaded 2-core CI each try's CLI round trip alone
	// may take seconds.
	testutil.Eventually(t, 30*time.Second, "write after leader loss", func() error {
		_, err := tryCLI(survivors[0], "accelerators", "create", "after-failover", "--device", "h100")
		return err
	})
	t.Logf("leader %s stopped: first successful write after %v", leader.cfg.NodeName, time.Since(stopped))
	for i, n := range survivors {
		gpuplane(t, n, "accelerators", "create", fmt.Sprintf("after-failover-%d", i), "--device", "h100")
	}

	// The old leader, restarted on its data dir, rejoins, catches up and
	// reports the same state hash as the others.
	leader.start(t)
	testutil.Eventually(t, 15*time.Second, "old leader catches up", func() error {
		var want statusJSON
		for i, s := range servers {
			st, err := statusOnServer(s)
			if err != nil {
				return err
			}
			if i == 0 {
				want = st
			}
			if st.StateHash == "" || st.StateHash != want.StateHash || st.AppliedIndex != want.AppliedIndex {
				return fmt.Errorf("%s: hash %s applied %d; %s: hash %s applied %d", s.cfg.NodeName, st.StateHash,
					st.AppliedIndex, servers[0].cfg.NodeName, want.StateHash, want.AppliedIndex)
			}
		}
		return nil
	})
	gpuplane(t, leader, "accelerators", "get", "after-failover")

	// 4. Stop a client abruptly: it is down on every node and its cards stop
	// counting as free (the gossip settings promise it within
	// FailureDetectionTime, plus the leader's reconcile and one commit).
	c := clients[1]
	c.stop(t)
	// The deadline is generous and the time logged, not asserted: one
	// round of checks is ten CLI calls, seconds on a loaded CI.
	promise := cluster.FailureDetectionTime(5) + 2*time.Second
	took := testutil.Eventually(t, promise+30*time.Second, "stopped client is down everywhere", func() error {
		for _, n := range all {
			if n.a == nil {
				continue
			}
			if err := nodeStatus(n, c.cfg.NodeName, "down"); err != nil {
				return err
			}
			d, err := device(n, "h100")
			if err != nil {
				return err
			}
			if d.Free != 2 {
				return fmt.Errorf("%s: h100 free %d with c2 down, want 2", n.cfg.NodeName, d.Free)
			}
		}
		return nil
	})
	t.Logf("client down on every node %v after it stopped (promise %v)", took, promise)

	// Restarted, it is alive again everywhere, with no duplicate entry.
	c.start(t)
	testutil.Eventually(t, 15*time.Second, "restarted client alive", func() error {
		for _, n := range all {
			if err := nodeStatus(n, c.cfg.NodeName, "alive"); err != nil {
				return err
			}
			ns, err := nodesOn(n)
			if err != nil {
				return err
			}
			if len(ns) != 5 {
				return fmt.Errorf("%s lists %d nodes, want 5: %+v", n.cfg.NodeName, len(ns), ns)
			}
			if err := checkMembers(n, 5); err != nil {
				return err
			}
		}
		return nil
	})
}

// statusOnServer is `cluster status` on a server, waiting for it to have
// applied the leader's commit index.
func statusOnServer(n *node) (statusJSON, error) {
	st, err := status(n)
	if err != nil {
		return st, err
	}
	if st.AppliedIndex != st.CommitIndex {
		return st, fmt.Errorf("%s applied %d of %d", n.cfg.NodeName, st.AppliedIndex, st.CommitIndex)
	}
	return st, nil
}

func nodeStatus(n *node, name, want string) error {
	ns, err := nodesOn(n)
	if err != nil {
		return err
	}
	for _, x := range ns {
		if x.Name == name {
			if !strings.EqualFold(x.Status, "NODE_STATUS_"+want) && !strings.EqualFold(x.Status, want) {
				return fmt.Errorf("%s says %s is %s, want %s", n.cfg.NodeName, name, x.Status, want)
			}
			return nil
		}
	}
	return fmt.Errorf("%s does not list %s", n.cfg.NodeName, name)
}

func leaderOf(t *testing.T, servers []*node) *node {
	t.Helper()
	for _, s := range servers {
		if s.a != nil && s.a.Cluster().IsLeader() {
			return s
		}
	}
	t.Fatal("no server leads")
	return nil
}

// TestLeaveAndRemovePeer checks graceful leave (a client, then a server
// that hands over leadership if it leads) and remove-peer of a dead server.
func TestLeaveAndRemovePeer(t *testing.T) {
	if testing.Short() {
		t.Skip("starts four agents")
	}
	servers := []*node{newNode(t, "s1", true, "l4=1"), newNode(t, "s2", true, "l4=1"), newNode(t, "s3", true, "l4=1")}
	client := newNode(t, "c1", false, "l4=2")
	all := append(append([]*node{}, servers...), client)
	for _, n := range all {
		n.cfg.Join = []string{servers[0].gossip(), servers[1].gossip(), servers[2].gossip()}
	}
	for _, n := range all {
		n.start(t)
	}
	testutil.Eventually(t, 20*time.Second, "cluster forms", func() error {
		for _, n := range all {
			if err := checkMembers(n, 4); err != nil {
				return err
			}
		}
		return nil
	})

	// A client that leaves is recorded as left, and its agent stops.
	if out := gpuplane(t, client, "cluster", "leave"); out != "left the cluster\n" {
		t.Fatalf("leave: %q", out)
	}
	select {
	case <-waitDone(client.a):
	case <-time.After(5 * time.Second):
		t.Fatal("client agent still running after leave")
	}
	client.stop(t)
	testutil.Eventually(t, 10*time.Second, "client left", func() error { return nodeStatus(servers[0], "c1", "left") })

	// A dead server stays a voter until remove-peer; an alive one is refused.
	servers[2].stop(t)
	// Both survivors must see it: remove-peer runs on s2, whose gossip view
	// may trail s1's by a probe round.
	for _, survivor := range servers[:2] {
		testutil.Eventually(t, 10*time.Second, "s3 failed", func() error {
			ms, err := members(survivor)
			if err != nil {
				return err
			}
			for _, m := range ms {
				if m.Name == "s3" && m.Status == "failed" && m.Raft == "voter" {
					return nil
				}
			}
			return fmt.Errorf("members: %+v", ms)
		})
	}
	if _, err := tryCLI(servers[0], "cluster", "remove-peer", "s2"); err == nil || !strings.Contains(err.Error(), "alive") {
		t.Fatalf("remove-peer of a live server: %v", err)
	}
	gpuplane(t, servers[1], "cluster", "remove-peer", "s3")
	ms, err := members(servers[0])
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if m.Name == "s3" && m.Raft != "none" {
			t.Fatalf("s3 after remove-peer: %+v", m)
		}
	}

	// A server that leaves is removed from Raft; the last one still leads.
	leaving, staying := servers[0], servers[1]
	gpuplane(t, leaving, "cluster", "leave")
	leaving.stop(t)
	testutil.Eventually(t, 10*time.Second, "one voter left", func() error {
		ms, err := members(staying)
		if err != nil {
			return err
		}
		voters := 0
		for _, m := range ms {
			if m.Raft == "voter" {
				voters++
			}
			if m.Name == leaving.cfg.NodeName && m.Status != "left" {
				return fmt.Errorf("%s is %s", m.Name, m.Status)
			}
		}
		if voters != 1 {
			return fmt.Errorf("%d voters: %+v", voters, ms)
		}
		return nil
	})
	gpuplane(t, staying, "accelerators", "create", "after-leave", "--device", "l4")
}

func waitDone(a *agent.Agent) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		_ = a.Wait(context.Background())
		close(done)
	}()
	return done
}
