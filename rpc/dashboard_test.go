package rpc_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpuplane/gpuplane/fsm"
	"github.com/gpuplane/gpuplane/node/residency"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
	"github.com/gpuplane/gpuplane/proto/gpuplane/v1/gpuplanev1connect"
)

// smallCluster is two nodes of two L4 cards on a shared accelerator with a
// pinned, a warm and an onDemand deployment of two replicas each: replica
// 0 of each resident, replica 1 asleep (so every kind of segment shows).
func smallCluster(t *testing.T) *stateBackend {
	b := simulatedState(t, 2, 2, func(n int) string { return fmt.Sprintf("node-%d", n) })
	for i, res := range []pb.Residency{pb.Residency_RESIDENCY_PINNED, pb.Residency_RESIDENCY_WARM, pb.Residency_RESIDENCY_ON_DEMAND} {
		b.deploy(t, "model-"+string(rune('a'+i)), res, 500, 2,
			func(r int) (string, uint32) { return fmt.Sprintf("node-%d", r), uint32(i % 2) },
			func(r int) pb.ReplicaResidency {
				return []pb.ReplicaResidency{pb.ReplicaResidency_REPLICA_RESIDENCY_RESIDENT, pb.ReplicaResidency_REPLICA_RESIDENCY_SLEEPING}[r]
			}, "test")
	}
	return b
}

func setResidency(t *testing.T, b *stateBackend, model string, replica uint32, r pb.ReplicaResidency) {
	b.replicaStatus(t, model, replica, fmt.Sprintf("node-%d", replica), r, "test")
}

func summary(t testing.TB, c gpuplanev1connect.DashboardServiceClient, since uint64) *pb.SummaryResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := c.Summary(ctx, connect.NewRequest(&pb.SummaryRequest{Since: since}))
	if err != nil {
		t.Fatalf("Summary(since %d): %v", since, err)
	}
	return resp.Msg
}

func cardKeys(cs []*pb.DashboardCard) []string {
	var out []string
	for _, c := range cs {
		out = append(out, fmt.Sprintf("%s/%d", c.GetNode(), c.GetIndex()))
	}
	return out
}

func modelNames(ms []*pb.DashboardModel) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.GetName())
	}
	return out
}

// TestDashboardSummary: the dashboard's one call answers with every card's
// memory map as `devices get` counts it, every deployment with its
// replicas' residency and this node's gateway counters, the tenants, the
// residency plan's headroom and estimate, and the cluster's health; asked
// again with the revision of that answer, it answers with only what
// changed since: nothing, one card and one model after one replica's
// residency changed, one model and one tenant after a request, and the
// deployment removed after a delete.
func TestDashboardSummary(t *testing.T) {
	b := smallCluster(t)
	journal := residency.NewJournal("node-0", 0)
	journal.SetCard(residency.CardView{Card: "0", Mode: "auto", Usable: 20000 << 20,
		Plan: []residency.PlanEntry{{Model: "model-c/0", Rate: 6}, {Model: "model-a/0", Rate: 0}}}, nil)
	reg := prometheus.NewRegistry()
	ttft := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "gpuplane_gateway_ttft_seconds", Help: "TTFT.",
		Buckets: []float64{0.1, 1}}, []string{"model", "class", "tenant"})
	tokens := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gpuplane_gateway_tokens_total", Help: "Tokens."}, []string{"model", "class", "tenant", "kind"})
	depth := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "gpuplane_gateway_queue_depth", Help: "Queued."}, []string{"replica", "card"})
	weight := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "gpuplane_gateway_tenant_weight", Help: "Weight."}, []string{"tenant"})
	reg.MustRegister(ttft, tokens, depth, weight)
	ttft.WithLabelValues("model-a", "standard", "alice").Observe(0.05)
	ttft.WithLabelValues("model-a", "interactive", "bob").Observe(0.5)
	tokens.WithLabelValues("model-a", "standard", "alice", "generated").Add(30)
	tokens.WithLabelValues("model-a", "standard", "alice", "prompt").Add(10)
	tokens.WithLabelValues("model-a", "interactive", "bob", "generated").Add(5)
	depth.WithLabelValues("model-b/0", "1").Set(2)
	depth.WithLabelValues("model-b/1", "1").Set(1)
	weight.WithLabelValues("bob").Set(3)

	c := dashboardClient(t, b, "node-0", journal, reg)

	first := summary(t, c, 0)
	if !first.GetFull() || first.GetRevision() == 0 {
		t.Fatalf("first answer: full %v, revision %d; want full with a revision", first.GetFull(), first.GetRevision())
	}
	var devs []*pb.CardStatus
	_ = b.Read(context.Background(), true, func(f *fsm.FSM) error { _, devs, _ = f.Device("l4"); return nil })
	if got, want := cardKeys(first.GetCards()), cardKeys(statusCards(devs)); !slices.Equal(got, want) {
		t.Fatalf("cards %v, devices get %v", got, want)
	}
	for i, want := range devs {
		got := first.GetCards()[i]
		sum := map[string]uint32{}
		var ids []string
		for _, s := range got.GetSegments() {
			sum[s.GetKind()] += s.GetMemoryMib()
			ids = append(ids, s.GetReplica())
		}
		if !slices.Equal(ids, want.GetReplicas()) {
			t.Errorf("%s/%d: segments of %v, devices get %v", want.GetNode(), want.GetIndex(), ids, want.GetReplicas())
		}
		for _, c := range []struct {
			what      string
			got, want uint64
		}{
			{"resident", uint64(sum["resident"]), want.GetResidentMib()},
			{"sleeping", uint64(sum["lent"] + sum["host"]), want.GetSleepingMib()},
			{"used", uint64(sum["resident"] + sum["reserved"]), want.GetUsedMib()},
			{"memory", uint64(sum["resident"] + sum["reserved"] + sum["lent"] + sum["host"] + got.GetFreeMib()), want.GetMemoryMib()},
			{"free", uint64(got.GetFreeMib()), want.GetFreeMib()},
			{"reserved", uint64(got.GetReservedMib()), want.GetReservedMib()},
		} {
			if c.got != c.want {
				t.Errorf("%s/%d: %s %d MiB, devices get %d", want.GetNode(), want.GetIndex(), c.what, c.got, c.want)
			}
		}
	}
	kinds := map[string]bool{}
	for _, c := range first.GetCards() {
		for _, s := range c.GetSegments() {
			kinds[s.GetKind()] = true
		}
	}
	for _, k := range []string{"resident", "lent", "host"} {
		if !kinds[k] {
			t.Errorf("no %s segment among %v", k, kinds)
		}
	}
	if c := first.GetCards()[0]; c.GetHeadroomMib() != 23034-20000 || first.GetCards()[1].GetHeadroomMib() != 0 {
		t.Errorf("headroom of node-0/0 %d MiB (its plan keeps 20000 usable of 23034), of node-0/1 %d (no plan)", c.GetHeadroomMib(), first.GetCards()[1].GetHeadroomMib())
	}
	if got := modelNames(first.GetModels()); !slices.Equal(got, []string{"model-a", "model-b", "model-c"}) {
		t.Fatalf("models %v", got)
	}
	a, bm, cm := first.GetModels()[0], first.GetModels()[1], first.GetModels()[2]
	if a.GetRequests() != 2 || !slices.Equal(a.GetTtftBuckets(), []float64{1, 2}) || !slices.Equal(first.GetTtftBounds(), []float64{0.1, 1}) || a.GetTokens() != 45 {
		t.Errorf("model-a: %v requests, buckets %v over %v, %v tokens; want 2, [1 2] over [0.1 1], 45", a.GetRequests(), a.GetTtftBuckets(), first.GetTtftBounds(), a.GetTokens())
	}
	if bm.GetQueued() != 3 || bm.GetResidency() != "warm" || bm.GetTtftTargetMs() != 500 || len(bm.GetTtftBuckets()) != 0 {
		t.Errorf("model-b: %+v; want 3 queued, warm, target 500 ms, no TTFT", bm)
	}
	if got := []string{cm.GetReplicas()[0].GetState(), cm.GetReplicas()[1].GetState()}; !slices.Equal(got, []string{"Resident", "Sleeping"}) {
		t.Errorf("model-c's replicas: %v", got)
	}
	if cm.PlannedRatePerMinute == nil || cm.GetPlannedRatePerMinute() != 6 || bm.PlannedRatePerMinute != nil {
		t.Errorf("planned rates: model-c %v, model-b %v; want 6 and none", cm.PlannedRatePerMinute, bm.PlannedRatePerMinute)
	}
	var tenants []string
	for _, tn := range first.GetTenants() {
		tenants = append(tenants, fmt.Sprintf("%s:%g:%g", tn.GetName(), tn.GetWeight(), tn.GetTokens()))
	}
	if !slices.Equal(tenants, []string{"alice:1:40", "bob:3:5"}) {
		t.Errorf("tenants %v", tenants)
	}
	h := first.GetHealth()
	if h.GetLeader() != "node-000" || h.GetNodes() != 2 || h.GetNodesAlive() != 2 || len(first.GetMembers().GetMembers()) != 2 {
		t.Errorf("health %+v, members %v", h, first.GetMembers())
	}

	// Nothing changed: the same revision and nothing but the health.
	same := summary(t, c, first.GetRevision())
	if same.GetFull() || same.GetRevision() != first.GetRevision() || len(same.GetCards())+len(same.GetModels())+len(same.GetTenants()) != 0 ||
		same.GetMembers() != nil || same.GetHealth().GetAppliedIndex() != h.GetAppliedIndex() {
		t.Fatalf("asked again with nothing changed: %v", same)
	}

	// model-b/1 wakes on node-1's card 1: that card and model-b.
	setResidency(t, b, "model-b", 1, pb.ReplicaResidency_REPLICA_RESIDENCY_RESIDENT)
	woke := summary(t, c, first.GetRevision())
	if woke.GetFull() || woke.GetRevision() == first.GetRevision() || !slices.Equal(cardKeys(woke.GetCards()), []string{"node-1/1"}) ||
		!slices.Equal(modelNames(woke.GetModels()), []string{"model-b"}) || len(woke.GetTenants()) != 0 {
		t.Fatalf("after model-b/1 woke: full %v, revision %d (was %d), cards %v, models %v, tenants %v", woke.GetFull(), woke.GetRevision(),
			first.GetRevision(), cardKeys(woke.GetCards()), modelNames(woke.GetModels()), woke.GetTenants())
	}
	if s := woke.GetCards()[0].GetSegments(); s[len(s)-1].GetReplica() != "model-b/1" || s[len(s)-1].GetKind() != "resident" {
		t.Errorf("node-1/1 after the wake: %v", s)
	}

	// A request of bob's to model-a: model-a and bob.
	ttft.WithLabelValues("model-a", "interactive", "bob").Observe(2)
	tokens.WithLabelValues("model-a", "interactive", "bob", "generated").Add(7)
	served := summary(t, c, woke.GetRevision())
	if !slices.Equal(modelNames(served.GetModels()), []string{"model-a"}) || len(served.GetCards()) != 0 ||
		len(served.GetTenants()) != 1 || served.GetTenants()[0].GetName() != "bob" || served.GetTenants()[0].GetTokens() != 12 {
		t.Fatalf("after a request: models %v, cards %v, tenants %v", modelNames(served.GetModels()), cardKeys(served.GetCards()), served.GetTenants())
	}
	if m := served.GetModels()[0]; m.GetRequests() != 3 || !slices.Equal(m.GetTtftBuckets(), []float64{1, 2}) {
		t.Errorf("model-a after a 2 s request: %v requests, buckets %v", m.GetRequests(), m.GetTtftBuckets())
	}

	// model-c deleted: gone, and its cards changed.
	b.apply(t, &pb.Envelope{Command: &pb.Envelope_DeleteModel{DeleteModel: &pb.DeleteModel{Name: "model-c"}}})
	deleted := summary(t, c, served.GetRevision())
	if !slices.Equal(deleted.GetRemovedModels(), []string{"model-c"}) || len(deleted.GetModels()) != 0 ||
		!slices.Equal(cardKeys(deleted.GetCards()), []string{"node-0/0", "node-1/0"}) {
		t.Fatalf("after model-c's deletion: removed %v, models %v, cards %v", deleted.GetRemovedModels(), modelNames(deleted.GetModels()), cardKeys(deleted.GetCards()))
	}
	for _, card := range deleted.GetCards() {
		for _, s := range card.GetSegments() {
			if strings.HasPrefix(s.GetReplica(), "model-c/") {
				t.Errorf("%s/%d still shows %s", card.GetNode(), card.GetIndex(), s.GetReplica())
			}
		}
	}

	// From the first answer: every change since, at once.
	since := summary(t, c, first.GetRevision())
	if since.GetFull() || !slices.Equal(modelNames(since.GetModels()), []string{"model-a", "model-b"}) ||
		!slices.Equal(since.GetRemovedModels(), []string{"model-c"}) || !slices.Equal(cardKeys(since.GetCards()), []string{"node-0/0", "node-1/0", "node-1/1"}) {
		t.Errorf("since the first answer: models %v, removed %v, cards %v", modelNames(since.GetModels()), since.GetRemovedModels(), cardKeys(since.GetCards()))
	}
	// A revision this server never gave (another server's, or from before
	// a restart): everything.
	if other := summary(t, c, first.GetRevision()+1000); !other.GetFull() || len(other.GetCards()) != 4 || len(other.GetModels()) != 2 {
		t.Errorf("an unknown revision: full %v, %d cards, %d models; want everything", other.GetFull(), len(other.GetCards()), len(other.GetModels()))
	}
}

func statusCards(cs []*pb.CardStatus) []*pb.DashboardCard {
	var out []*pb.DashboardCard
	for _, c := range cs {
		out = append(out, &pb.DashboardCard{Node: c.GetNode(), Index: c.GetIndex()})
	}
	return out
}

// TestDashboardSummaryUnchangedUntilASourceChanges: polls with nothing
// changed get the same revision and an empty delta, however often they
// come; a change in any source the answer is built from (the state, the
// gateway's counters, gossip's members, a residency plan) is still seen in
// the next poll, and only that.
func TestDashboardSummaryUnchangedUntilASourceChanges(t *testing.T) {
	b := smallCluster(t)
	journal := residency.NewJournal("node-0", 0)
	journal.SetCard(residency.CardView{Card: "0", Mode: "auto", Usable: 20000 << 20, Plan: []residency.PlanEntry{{Model: "model-c/0", Rate: 6}}}, nil)
	reg := prometheus.NewRegistry()
	tokens := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gpuplane_gateway_tokens_total", Help: "Tokens."}, []string{"model", "class", "tenant", "kind"})
	reg.MustRegister(tokens)
	tokens.WithLabelValues("model-a", "standard", "alice", "generated").Add(30)
	c := dashboardClient(t, b, "node-0", journal, reg)

	rev := summary(t, c, 0).GetRevision()
	unchanged := func(what string) {
		t.Helper()
		for range 3 {
			s := summary(t, c, rev)
			if s.GetFull() || s.GetRevision() != rev || len(s.GetCards())+len(s.GetModels())+len(s.GetTenants()) != 0 || s.GetMembers() != nil ||
				len(s.GetRemovedCards())+len(s.GetRemovedModels())+len(s.GetRemovedTenants()) != 0 {
				t.Fatalf("%s, polled again with nothing changed: %v", what, s)
			}
		}
	}
	// changed polls once something changed: a new revision with exactly
	// the models and cards given, members or not.
	changed := func(what string, models, cards []string, members bool) {
		t.Helper()
		s := summary(t, c, rev)
		if s.GetFull() || s.GetRevision() == rev || !slices.Equal(modelNames(s.GetModels()), models) ||
			!slices.Equal(cardKeys(s.GetCards()), cards) || (s.GetMembers() != nil) != members {
			t.Fatalf("after %s: full %v, revision %d (was %d), models %v, cards %v, members %v; want models %v, cards %v, members %v",
				what, s.GetFull(), s.GetRevision(), rev, modelNames(s.GetModels()), cardKeys(s.GetCards()), s.GetMembers() != nil, models, cards, members)
		}
		rev = s.GetRevision()
		unchanged("after " + what)
	}
	unchanged("at first")

	tokens.WithLabelValues("model-a", "standard", "alice", "generated").Add(5)
	changed("a request", []string{"model-a"}, nil, false)

	setResidency(t, b, "model-b", 1, pb.ReplicaResidency_REPLICA_RESIDENCY_RESIDENT)
	changed("model-b/1 woke", []string{"model-b"}, []string{"node-1/1"}, false)

	b.mu.Lock()
	b.members = append(slices.Clone(b.members[:1]), &pb.Member{Name: "node-1", Role: "client", Status: "failed", Raft: "none"})
	b.mu.Unlock()
	changed("node-1 failed in gossip", nil, nil, true)

	journal.SetCard(residency.CardView{Card: "0", Mode: "auto", Usable: 20000 << 20, Plan: []residency.PlanEntry{{Model: "model-c/0", Rate: 9}}}, nil)
	changed("a new plan", []string{"model-c"}, nil, false)
}
