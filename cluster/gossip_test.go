package cluster

import (
	"fmt"
	"io"
	"log"
	"net"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/gpuplane/gpuplane/internal/testutil"
)

func startGossip(t *testing.T, name string, digest string) *Gossip {
	t.Helper()
	g, err := NewGossip(GossipConfig{Name: name, Bind: "127.0.0.1:0", Meta: Meta{Role: RoleClient, API: name + ":7410", Digest: digest}, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Shutdown() })
	return g
}

func gossipStatusOf(g *Gossip, name string) string {
	m, ok := g.Member(name)
	if !ok {
		return "unknown"
	}
	return m.Status
}

// TestGossipMembership checks that gossip spreads meta changes, reports a
// stopped node failed (the time, within FailureDetectionTime on an idle
// machine, is logged; the deadline allows for a loaded CI), a node that
// leaves as left, and a node restarted under the same name alive again.
func TestGossipMembership(t *testing.T) {
	var gs []*Gossip
	for i := range 4 {
		gs = append(gs, startGossip(t, fmt.Sprintf("g%d", i), "d0"))
	}
	for _, g := range gs[1:] {
		if n, err := g.Join([]string{gs[0].Addr()}); err != nil || n != 1 {
			t.Fatalf("join: %d, %v", n, err)
		}
	}
	testutil.Eventually(t, 5*time.Second, "", func() error {
		for _, g := range gs {
			if n := len(g.Members()); n != 4 {
				return fmt.Errorf("%d members", n)
			}
		}
		return nil
	})
	if err := gs[3].SetMeta(func(m *Meta) { m.Digest = "d1" }); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, "", func() error {
		for _, g := range gs {
			if m, _ := g.Member("g3"); m.Meta.Digest != "d1" {
				return fmt.Errorf("digest %q", m.Meta.Digest)
			}
		}
		return nil
	})

	gs[3].Shutdown()
	start := time.Now()
	testutil.Eventually(t, FailureDetectionTime(4)+15*time.Second, "g3 failed everywhere", func() error {
		for _, g := range gs[:3] {
			if s := gossipStatusOf(g, "g3"); s != GossipFailed {
				return fmt.Errorf("g3 is %s", s)
			}
		}
		return nil
	})
	t.Logf("failure detected on every node after %v (promise %v)", time.Since(start), FailureDetectionTime(4))

	if err := gs[2].Leave(time.Second); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, "", func() error {
		for _, g := range gs[:2] {
			if s := gossipStatusOf(g, "g2"); s != GossipLeft {
				return fmt.Errorf("g2 is %s", s)
			}
		}
		return nil
	})
}

// TestGossipReconnectsFailedMember checks that a node does not give up on a
// member it declared failed: memberlist alone never contacts a dead member
// again, so a node that comes back on the same address without joining
// anyone (as after a partition, where both sides hold the other dead) would
// stay failed forever. The reconnect loop must find it.
func TestGossipReconnectsFailedMember(t *testing.T) {
	a := startGossip(t, "a", "d0")
	b := startGossip(t, "b", "d0")
	if _, err := b.Join([]string{a.Addr()}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, "", func() error {
		if s := gossipStatusOf(a, "b"); s != GossipAlive {
			return fmt.Errorf("b is %s on a", s)
		}
		return nil
	})
	addr := b.Addr()
	b.Shutdown()
	testutil.Eventually(t, FailureDetectionTime(2)+15*time.Second, "b failed on a", func() error {
		if s := gossipStatusOf(a, "b"); s != GossipFailed {
			return fmt.Errorf("b is %s on a", s)
		}
		return nil
	})

	// b comes back on the same address and joins nobody.
	b2, err := NewGossip(GossipConfig{Name: "b", Bind: addr, Meta: Meta{Role: RoleClient, API: "b:7410", Digest: "d1"}, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b2.Shutdown() })
	start := time.Now()
	testutil.Eventually(t, 10*time.Second, "", func() error {
		if s := gossipStatusOf(a, "b"); s != GossipAlive {
			return fmt.Errorf("b is %s on a", s)
		}
		if m, _ := a.Member("b"); m.Meta.Digest != "d1" {
			return fmt.Errorf("a sees b's old digest %q", m.Meta.Digest)
		}
		if s := gossipStatusOf(b2, "a"); s != GossipAlive {
			return fmt.Errorf("a is %s on b", s)
		}
		return nil
	})
	t.Logf("reconnected after %v", time.Since(start))
}

// TestUpdateBroadcastTimeoutText pins the memberlist error SetMeta takes for
// a broadcast still being retransmitted (isUpdateBroadcastTimeout): two
// joined members that never gossip nor probe, so an update's broadcast is
// never sent, and UpdateNode times out.
func TestUpdateBroadcastTimeoutText(t *testing.T) {
	var ms []*memberlist.Memberlist
	for i := range 2 {
		mc, err := memberlistConfig(GossipConfig{Name: fmt.Sprintf("m%d", i), Bind: "127.0.0.1:0"})
		if err != nil {
			t.Fatal(err)
		}
		mc.GossipInterval, mc.ProbeInterval, mc.PushPullInterval = time.Hour, time.Hour, time.Hour
		mc.Logger = log.New(io.Discard, "", 0)
		m, err := memberlist.Create(mc)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = m.Shutdown() })
		ms = append(ms, m)
	}
	if n, err := ms[1].Join([]string{ms[0].LocalNode().Address()}); err != nil || n != 1 {
		t.Fatalf("join: %d, %v", n, err)
	}
	// m0 merges m1's state after answering its join.
	testutil.Until(t, 10*time.Second, "m0 did not learn of m1", func() bool { return ms[0].NumMembers() == 2 })
	err := ms[0].UpdateNode(50 * time.Millisecond)
	if !isUpdateBroadcastTimeout(err) {
		t.Fatalf("UpdateNode with its broadcast unsent returned %v; isUpdateBroadcastTimeout must recognize memberlist's timeout", err)
	}
}

// TestFailureDetectionTimeAtFleetScale checks the promise the gossip
// settings make as the cluster grows: it never shrinks with more members,
// and with 1,000 it leaves the leader time to write the failure into the
// log within 15 s of the node's death (the fleet bench's goal).
func TestFailureDetectionTimeAtFleetScale(t *testing.T) {
	prev := time.Duration(0)
	for _, n := range []int{1, 3, 10, 100, 1000, 10000} {
		d := FailureDetectionTime(n)
		if d < prev {
			t.Errorf("FailureDetectionTime(%d) = %v, shorter than for fewer nodes (%v)", n, d, prev)
		}
		prev = d
	}
	if d := FailureDetectionTime(1000); d > 12*time.Second {
		t.Errorf("FailureDetectionTime(1000) = %v: with a reconcile round and a commit it misses 15 s", d)
	}
}

// TestMaxSuspicionFollowsMemberlist checks maxSuspicion against
// memberlist's rule: the timeout grows with log10 of the cluster's size,
// and is stretched by SuspicionMaxTimeoutMult only when confirmations are
// expected (SuspicionMult > 2, and enough other members to give them).
func TestMaxSuspicionFollowsMemberlist(t *testing.T) {
	mc := memberlist.DefaultLANConfig() // 1 s, SuspicionMult 4, max ×6
	for _, c := range []struct {
		n    int
		want time.Duration
	}{
		{1, 4 * time.Second},      // k = 2 > n-2: no confirmations expected
		{3, 4 * time.Second},      // n-2 = 1 < k
		{4, 24 * time.Second},     // 4 × 1 × 1 s, × 6
		{100, 48 * time.Second},   // 4 × 2 × 1 s, × 6
		{1000, 72 * time.Second},  // 4 × 3 × 1 s, × 6
		{10000, 96 * time.Second}, // 4 × 4 × 1 s, × 6
	} {
		if got := maxSuspicion(mc, c.n); got != c.want {
			t.Errorf("n=%d: %v, want %v", c.n, got, c.want)
		}
	}
	mc.SuspicionMult = 2 // k = 0: the timeout is the minimum
	if got := maxSuspicion(mc, 1000); got != 6*time.Second {
		t.Errorf("SuspicionMult 2, n=1000: %v, want 6s", got)
	}
}

// TestReconnectTargetScalesWithFailed checks that a member tries to
// reconnect to a failed one with probability min(failed,
// reconnectsPerInterval)/alive, so that a large cluster does not send
// failed members a full-state push/pull from every member every interval,
// nor hundreds a second when hundreds were held failed for a moment.
func TestReconnectTargetScalesWithFailed(t *testing.T) {
	g := &Gossip{members: map[string]*GossipMember{}, servers: map[string]*GossipMember{}, onChange: func() {}}
	// Members are added as memberlist's events add them, so that the
	// counts the loop reads follow each change of status.
	add := func(name, status string) {
		meta := []byte(`{"r":"client"}`)
		if status == GossipLeft {
			meta = []byte(`{"r":"client","l":true}`)
		}
		g.update(&memberlist.Node{Name: name, Addr: net.IPv4(10, 0, 0, 1), Port: 1, Meta: meta}, status != GossipAlive)
		g.members[name].Addr = name + ":1"
	}
	if _, ok := g.reconnectTarget(0); ok {
		t.Fatal("no members: picked one")
	}
	add("self", GossipAlive)
	add("dead", GossipAlive)
	if _, ok := g.reconnectTarget(0); ok {
		t.Fatal("none failed: picked one")
	}
	add("dead", GossipFailed)
	// 1 failed, 1 alive: always.
	if addr, ok := g.reconnectTarget(0.999); !ok || addr != "dead:1" {
		t.Fatalf("1 failed of 2: got %q %v, want dead:1", addr, ok)
	}
	for i := range 999 {
		add(fmt.Sprintf("n%d", i), GossipAlive)
	}
	add("gone", GossipLeft)
	// 1 failed, 1,000 alive: one round in a thousand.
	if addr, ok := g.reconnectTarget(0.0009); !ok || addr != "dead:1" {
		t.Fatalf("draw below 1/1000: got %q %v, want dead:1", addr, ok)
	}
	if addr, ok := g.reconnectTarget(0.0011); ok {
		t.Fatalf("draw above 1/1000: picked %q", addr)
	}
	// Many failed (a fleet whose members were slow for a moment): the
	// cluster as a whole still tries only reconnectsPerInterval a round.
	for i := range 500 {
		add(fmt.Sprintf("n%d", i), GossipFailed)
	}
	bound := float64(reconnectsPerInterval) / 500
	if _, ok := g.reconnectTarget(bound * 0.99); !ok {
		t.Fatalf("500 failed of 1,000: draw below %v picked none", bound)
	}
	if addr, ok := g.reconnectTarget(bound * 1.01); ok {
		t.Fatalf("500 failed of 1,000: draw above %v picked %q", bound, addr)
	}
	for i := range 500 {
		add(fmt.Sprintf("n%d", i), GossipAlive)
	}
	g.members["dead"].Since = time.Now().Add(-reconnectTimeout)
	if addr, ok := g.reconnectTarget(0); ok {
		t.Fatalf("failed longer than reconnectTimeout: picked %q", addr)
	}
	g.members["dead"].Since = time.Now()
	add("dead", GossipAlive)
	if addr, ok := g.reconnectTarget(0); ok {
		t.Fatalf("the failed member came back: picked %q", addr)
	}
	add("dead", GossipFailed)
	g.left = true
	if addr, ok := g.reconnectTarget(0); ok {
		t.Fatalf("after leaving: picked %q", addr)
	}
}

// TestServersFollowMeta checks the servers a client picks from: members
// whose gossiped meta says server, by name, whatever their status, and no
// longer once their meta says otherwise.
func TestServersFollowMeta(t *testing.T) {
	g := &Gossip{members: map[string]*GossipMember{}, servers: map[string]*GossipMember{}, onChange: func() {}}
	node := func(name, role string) *memberlist.Node {
		return &memberlist.Node{Name: name, Addr: net.IPv4(10, 0, 0, 1), Port: 1, Meta: []byte(`{"r":"` + role + `","a":"` + name + `:7410"}`)}
	}
	g.update(node("s2", RoleServer), false)
	g.update(node("c1", RoleClient), false)
	g.update(node("s1", RoleServer), true)
	names := func() (out []string) {
		for _, m := range g.Servers() {
			out = append(out, m.Name+"/"+m.Status)
		}
		return out
	}
	if got := fmt.Sprint(names()); got != "[s1/failed s2/alive]" {
		t.Fatalf("servers %s, want [s1/failed s2/alive]", got)
	}
	g.update(node("s2", RoleClient), false)
	if got := fmt.Sprint(names()); got != "[s1/failed]" {
		t.Fatalf("after s2 became a client: %s", got)
	}
}
