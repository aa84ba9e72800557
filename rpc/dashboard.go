package rpc

import (
	"context"
	"encoding/binary"
	"hash/maphash"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"

	"github.com/gpuplane/gpuplane/fsm"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// dashboardRevisions is how many recent answers a server remembers the
// content of, so that a page can be sent what changed since its previous
// one. Each takes a hash per card, model and tenant (about 40 kB for 1,000
// of them); a page whose revision was forgotten (many pages refreshing
// while the cluster changes) gets everything again, which is only slower.
const dashboardRevisions = 64

// dashboardHandlers answer the dashboard's one call per refresh from the
// same sources as the separate APIs (the state read stale, Raft's status,
// gossip's members, the residency plans of every node) and this node's
// gateway series, so that the page fetches one small answer instead of
// every listing and the whole /metrics text.
type dashboardHandlers struct {
	b         Backend
	residency *residencyHandlers
	gather    prometheus.Gatherer // nil: no gateway figures
	seed      maphash.Seed

	mu   sync.Mutex
	next uint64
	// built is the latest answer's content, reused while nothing it was
	// built from changed.
	built *dashboardBuild
	// revisions are the recent answers' content, oldest first: each item's
	// key (kind and name) and the hash of its message.
	revisions []dashboardRevision
}

type dashboardRevision struct {
	revision uint64
	items    map[string]uint64
}

func newDashboardHandlers(b Backend, residency *residencyHandlers, gather prometheus.Gatherer) *dashboardHandlers {
	// Revisions start at a random number: a page that reloads from
	// another server (or the same one restarted) gets everything, instead
	// of a difference against some other answer that had its number.
	return &dashboardHandlers{b: b, residency: residency, gather: gather, seed: maphash.MakeSeed(), next: rand.Uint64()>>12 + 1}
}

// Item keys: a kind prefix, so that a card and a model of the same name
// are different items.
const (
	itemCard    = "c:"
	itemModel   = "m:"
	itemTenant  = "t:"
	itemMembers = "members"
)

// dashboardBuild is the content of a Summary answer as built from the
// state and the node's other sources, and what it was built from: the
// state's applied index and a hash of the rest (the residency plans,
// the gateway's series, gossip's members). Once stored it is never
// changed: answers share its messages.
type dashboardBuild struct {
	applied, inputs   uint64
	nodes, nodesAlive uint32
	cards             []*pb.DashboardCard
	models            []*pb.DashboardModel
	tenants           []*pb.DashboardTenant
	bounds            []float64
	members           *pb.DashboardMembers
	planError         string
	// items are each item's key (kind and name) and the hash of its
	// message.
	items map[string]uint64
}

func (h *dashboardHandlers) Summary(ctx context.Context, req *connect.Request[pb.SummaryRequest]) (*connect.Response[pb.SummaryResponse], error) {
	out := &pb.SummaryResponse{Health: &pb.DashboardHealth{}}
	if st, err := h.b.ClusterStatus(ctx); err != nil {
		out.Health.Error = err.Error()
	} else {
		out.Health.Node, out.Health.Leader, out.Health.Term = st.GetNode(), st.GetLeader(), st.GetTerm()
		out.Health.CommitIndex, out.Health.AppliedIndex, out.Health.RaftState = st.GetCommitIndex(), st.GetAppliedIndex(), st.GetRaftState()
	}
	members := &pb.DashboardMembers{}
	if ms, err := h.b.Members(ctx); err == nil {
		for _, m := range ms {
			members.Members = append(members.Members, &pb.DashboardMember{Name: m.GetName(), Role: m.GetRole(), Status: m.GetStatus(), Raft: m.GetRaft(), Leader: m.GetLeader()})
		}
	}
	plans, planErr := h.residency.GetPlan(ctx, connect.NewRequest(&pb.GetPlanRequest{}))
	var families []*dto.MetricFamily
	if h.gather != nil {
		// Gather returns what it could collect along with any error: the
		// figures it has are still worth showing.
		families, _ = h.gather.Gather()
	}
	inputs := h.inputsHash(members, plans, planErr, families)

	// The state is walked, and every item built and hashed, only when
	// something changed since the last answer: a page polling an idle
	// cluster costs the reads of the sources above and nothing more.
	h.mu.Lock()
	cached := h.built
	h.mu.Unlock()
	var b *dashboardBuild
	err := h.b.Read(ctx, true, func(f *fsm.FSM) error {
		if cached != nil && cached.applied == f.AppliedIndex() && cached.inputs == inputs {
			b = cached
			return nil
		}
		b = buildDashboardState(f)
		return nil
	})
	if err != nil {
		return nil, backendError("read", err)
	}
	if b != cached {
		b.inputs, b.members = inputs, members
		if planErr != nil {
			b.planError = planErr.Error()
		} else {
			h.addPlans(ctx, b.cards, b.models, plans.Msg)
		}
		b.bounds, b.tenants = addGateway(b.models, families)
		b.items = h.itemHashes(b)
		h.mu.Lock()
		h.built = b
		h.mu.Unlock()
	}
	out.Health.Nodes, out.Health.NodesAlive = b.nodes, b.nodesAlive
	out.PlanError, out.TtftBounds = b.planError, b.bounds
	items := b.items

	prev, revision := h.remember(req.Msg.GetSince(), items)
	out.Revision = revision
	out.Full = prev == nil
	changed := func(key string) bool { return prev == nil || prev[key] != items[key] }
	for _, c := range b.cards {
		if changed(itemCard + cardKey(c)) {
			out.Cards = append(out.Cards, c)
		}
	}
	for _, m := range b.models {
		if changed(itemModel + m.GetName()) {
			out.Models = append(out.Models, m)
		}
	}
	for _, t := range b.tenants {
		if changed(itemTenant + t.GetName()) {
			out.Tenants = append(out.Tenants, t)
		}
	}
	if changed(itemMembers) {
		out.Members = b.members
	}
	for _, key := range slices.Sorted(maps.Keys(prev)) {
		if _, ok := items[key]; ok {
			continue
		}
		switch {
		case strings.HasPrefix(key, itemCard):
			out.RemovedCards = append(out.RemovedCards, strings.TrimPrefix(key, itemCard))
		case strings.HasPrefix(key, itemModel):
			out.RemovedModels = append(out.RemovedModels, strings.TrimPrefix(key, itemModel))
		case strings.HasPrefix(key, itemTenant):
			out.RemovedTenants = append(out.RemovedTenants, strings.TrimPrefix(key, itemTenant))
		}
	}
	return connect.NewResponse(out), nil
}

// buildDashboardState builds what the dashboard shows of the state f: the
// node counts, every deployment and every card.
func buildDashboardState(f *fsm.FSM) *dashboardBuild {
	b := &dashboardBuild{applied: f.AppliedIndex()}
	for _, n := range f.Nodes() {
		b.nodes++
		if n.GetStatus() == pb.NodeStatus_NODE_STATUS_ALIVE {
			b.nodesAlive++
		}
	}
	specs := map[string]*pb.ModelSpec{}
	replicas := map[string]*pb.Replica{}
	byModel := map[string][]*pb.DashboardReplica{}
	for _, r := range f.Replicas("", "") {
		replicas[r.GetModel()+"/"+strconv.FormatUint(uint64(r.GetIndex()), 10)] = r
		byModel[r.GetModel()] = append(byModel[r.GetModel()], &pb.DashboardReplica{Index: r.GetIndex(), State: replicaStateText(r)})
	}
	for _, m := range f.Models() {
		spec := m.GetSpec()
		specs[m.GetName()] = spec
		served := spec.GetServedModelName()
		if served == "" {
			served = m.GetName()
		}
		b.models = append(b.models, &pb.DashboardModel{
			Name: m.GetName(), ServedModelName: served, Residency: fsm.ResidencyName(spec.GetResidency()),
			Priority: fsm.PriorityName(spec.GetPriority()), TtftTargetMs: spec.GetSlo().GetTtftMs(),
			Reason: m.GetStatus().GetReason(), Replicas: byModel[m.GetName()],
		})
	}
	for _, d := range f.Devices() {
		_, statuses, _ := f.Device(d.GetName())
		for _, c := range statuses {
			b.cards = append(b.cards, dashboardCard(d.GetName(), c, replicas, specs))
		}
	}
	return b
}

// inputsHash is a hash of what an answer is built from besides the state.
func (h *dashboardHandlers) inputsHash(members *pb.DashboardMembers, plans *connect.Response[pb.GetPlanResponse], planErr error, families []*dto.MetricFamily) uint64 {
	var mh maphash.Hash
	mh.SetSeed(h.seed)
	opts := proto.MarshalOptions{Deterministic: true}
	write := func(m proto.Message) {
		b, _ := opts.Marshal(m)
		_ = binary.Write(&mh, binary.LittleEndian, uint64(len(b)))
		mh.Write(b)
	}
	write(members)
	if planErr != nil {
		mh.WriteString(planErr.Error())
	} else {
		write(plans.Msg)
	}
	for _, fam := range families {
		write(fam)
	}
	return mh.Sum64()
}

// itemHashes hashes each item of b by its key.
func (h *dashboardHandlers) itemHashes(b *dashboardBuild) map[string]uint64 {
	items := make(map[string]uint64, len(b.cards)+len(b.models)+len(b.tenants)+1)
	hash := func(key string, m proto.Message) {
		data, _ := proto.MarshalOptions{Deterministic: true}.Marshal(m)
		items[key] = maphash.Bytes(h.seed, data)
	}
	for _, c := range b.cards {
		hash(itemCard+cardKey(c), c)
	}
	for _, m := range b.models {
		hash(itemModel+m.GetName(), m)
	}
	for _, t := range b.tenants {
		hash(itemTenant+t.GetName(), t)
	}
	hash(itemMembers, b.members)
	return items
}

// remember returns the content of revision since (nil when unknown) and
// the revision of items: the latest one's again when nothing changed,
// else a new one.
func (h *dashboardHandlers) remember(since uint64, items map[string]uint64) (map[string]uint64, uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var prev map[string]uint64
	if since != 0 {
		for _, r := range h.revisions {
			if r.revision == since {
				prev = r.items
			}
		}
	}
	if n := len(h.revisions); n > 0 && maps.Equal(h.revisions[n-1].items, items) {
		return prev, h.revisions[n-1].revision
	}
	rev := h.next
	h.next++
	if len(h.revisions) == dashboardRevisions {
		h.revisions = slices.Delete(h.revisions, 0, 1)
	}
	h.revisions = append(h.revisions, dashboardRevision{revision: rev, items: items})
	return prev, rev
}

func cardKey(c *pb.DashboardCard) string {
	return c.GetNode() + "/" + strconv.FormatUint(uint64(c.GetIndex()), 10)
}

// replicaStateText is what the dashboard shows of a replica: its residency,
// or its state when it has none (not placed).
func replicaStateText(r *pb.Replica) string {
	if s := fsm.ReplicaResidencyName(r.GetResidency()); s != "" {
		return s
	}
	return fsm.ReplicaStateName(r.GetState())
}

// dashboardCard is a card's status (as `devices get` shows it) with a
// segment per replica, counted as `devices get` counts them: loaded
// shares are resident; a replica asleep holds its residual (sleeping; the
// rest of its share is free, lent when reserved); reserved shares not
// loaded are used, not resident; cold onDemand replicas hold nothing.
func dashboardCard(device string, c *pb.CardStatus, replicas map[string]*pb.Replica, specs map[string]*pb.ModelSpec) *pb.DashboardCard {
	out := &pb.DashboardCard{
		Node: c.GetNode(), Index: c.GetIndex(), Device: device, Accelerator: c.GetAccelerator(),
		MemoryMib: mib32(c.GetMemoryMib()), UsedMib: mib32(c.GetUsedMib()), ReservedMib: mib32(c.GetReservedMib()),
		ResidentMib: mib32(c.GetResidentMib()), SleepingMib: mib32(c.GetSleepingMib()), FreeMib: mib32(c.GetFreeMib()),
	}
	for _, id := range c.GetReplicas() {
		r := replicas[id]
		model, _, _ := strings.Cut(id, "/")
		spec := specs[model]
		reserves := spec.GetResidency() != pb.Residency_RESIDENCY_ON_DEMAND
		seg := &pb.DashboardSegment{Replica: id, Residency: fsm.ResidencyName(spec.GetResidency())}
		if r != nil {
			seg.MemoryMib, seg.State, seg.Reason = mib32(r.GetMemoryMib()), replicaStateText(r), r.GetResidencyReason()
		}
		switch r.GetResidency() {
		case pb.ReplicaResidency_REPLICA_RESIDENCY_LOADING, pb.ReplicaResidency_REPLICA_RESIDENCY_RESIDENT,
			pb.ReplicaResidency_REPLICA_RESIDENCY_WAKING, pb.ReplicaResidency_REPLICA_RESIDENCY_DRAINING:
			seg.Kind = "resident"
		case pb.ReplicaResidency_REPLICA_RESIDENCY_SLEEPING:
			seg.Kind = "host"
			if reserves {
				seg.Kind = "lent"
			}
			seg.MemoryMib = mib32(min(r.GetResidualMib(), r.GetMemoryMib()))
		default:
			seg.Kind = "cold"
			if reserves {
				seg.Kind = "reserved"
			}
		}
		out.Segments = append(out.Segments, seg)
	}
	return out
}

func mib32(n uint64) uint32 { return uint32(min(n, 1<<32-1)) }

// addPlans adds what the residency controllers plan (resp): each card's
// headroom and pinned-only fallback, each model's estimated arrival rate.
func (h *dashboardHandlers) addPlans(ctx context.Context, cards []*pb.DashboardCard, models []*pb.DashboardModel, resp *pb.GetPlanResponse) {
	plans := map[string]*pb.ResidencyCardPlan{}
	rates := map[string]float64{}
	// waits: why a model's requests wait for the card, as the plan says
	// it (the first replica's); cold: models whose every planned replica
	// is an onDemand one cold without requests, as it should be.
	waits := map[string]string{}
	bestEffort := map[string]string{}
	cold := map[string]bool{}
	for _, p := range resp.GetCards() {
		plans[p.GetNode()+"/"+p.GetCard()] = p
		for _, e := range p.GetEntries() {
			name, idx, _ := strings.Cut(e.GetModel(), "/")
			rates[name] += e.GetRatePerMinute()
			if e.GetWait() != "" && waits[name] == "" {
				waits[name] = "replica " + idx + ": " + e.GetWait()
			}
			if e.GetBestEffort() != "" && bestEffort[name] == "" {
				bestEffort[name] = "replica " + idx + ": " + e.GetBestEffort()
			}
			byDesign := e.GetResidency() == "onDemand" && e.GetState() == "Cold" && e.GetActive() == 0
			if c, seen := cold[name]; !seen || c {
				cold[name] = byDesign
			}
		}
	}
	uuids := map[string]string{}
	if len(plans) > 0 {
		// A controller may name its card by UUID.
		_ = h.b.Read(ctx, true, func(f *fsm.FSM) error {
			for _, n := range f.Nodes() {
				for _, c := range n.GetCards() {
					uuids[n.GetName()+"/"+strconv.FormatUint(uint64(c.GetIndex()), 10)] = n.GetName() + "/" + c.GetUuid()
				}
			}
			return nil
		})
	}
	for _, c := range cards {
		p := plans[cardKey(c)]
		if p == nil {
			p = plans[uuids[cardKey(c)]]
		}
		if p == nil {
			continue
		}
		c.PinnedOnly = p.GetPinnedOnly()
		usable := uint32(p.GetUsableBytes() >> 20)
		if c.GetMemoryMib() > usable {
			c.HeadroomMib = min(c.GetFreeMib(), c.GetMemoryMib()-usable)
		}
	}
	for _, m := range models {
		if r, ok := rates[m.GetName()]; ok {
			m.PlannedRatePerMinute = proto.Float64(r)
		}
		m.BestEffort = bestEffort[m.GetName()]
		switch {
		case waits[m.GetName()] != "":
			m.Reason = waits[m.GetName()]
		case cold[m.GetName()]:
			// Not a fault: an onDemand model loads when a request comes.
			m.Reason = "onDemand: cold until a request comes, then loaded"
		}
	}
}

// addGateway adds this node's gateway counters (families, gathered) to the
// models (by the name requests use; the queue by deployment) and returns
// the TTFT buckets' bounds and the tenants.
func addGateway(models []*pb.DashboardModel, families []*dto.MetricFamily) ([]float64, []*pb.DashboardTenant) {
	if families == nil {
		return nil, nil
	}
	ttft := map[string]map[float64]float64{}
	requests, tokens, queued := map[string]float64{}, map[string]float64{}, map[string]float64{}
	tenantTokens, weights := map[string]float64{}, map[string]float64{}
	bounds := map[float64]bool{}
	for _, fam := range families {
		switch fam.GetName() {
		case "gpuplane_gateway_ttft_seconds":
			for _, m := range fam.GetMetric() {
				model := labelValue(m, "model")
				hist := m.GetHistogram()
				requests[model] += float64(hist.GetSampleCount())
				if ttft[model] == nil {
					ttft[model] = map[float64]float64{}
				}
				for _, b := range hist.GetBucket() {
					bounds[b.GetUpperBound()] = true
					ttft[model][b.GetUpperBound()] += float64(b.GetCumulativeCount())
				}
			}
		case "gpuplane_gateway_tokens_total":
			for _, m := range fam.GetMetric() {
				v := m.GetCounter().GetValue()
				tokens[labelValue(m, "model")] += v
				tenantTokens[labelValue(m, "tenant")] += v
			}
		case "gpuplane_gateway_queue_depth":
			for _, m := range fam.GetMetric() {
				replica := labelValue(m, "replica")
				if i := strings.LastIndexByte(replica, '/'); i >= 0 {
					queued[replica[:i]] += m.GetGauge().GetValue()
				}
			}
		case "gpuplane_gateway_tenant_weight":
			for _, m := range fam.GetMetric() {
				weights[labelValue(m, "tenant")] = m.GetGauge().GetValue()
			}
		}
	}
	sorted := slices.Sorted(maps.Keys(bounds))
	for _, m := range models {
		served := m.GetServedModelName()
		m.Requests, m.Tokens, m.Queued = requests[served], tokens[served], queued[m.GetName()]
		if b := ttft[served]; b != nil {
			m.TtftBuckets = make([]float64, len(sorted))
			for i, le := range sorted {
				m.TtftBuckets[i] = b[le]
			}
		}
	}
	names := map[string]bool{}
	for t := range tenantTokens {
		names[t] = true
	}
	for t := range weights {
		names[t] = true
	}
	var tenants []*pb.DashboardTenant
	for _, t := range slices.Sorted(maps.Keys(names)) {
		w, ok := weights[t]
		if !ok {
			w = 1
		}
		tenants = append(tenants, &pb.DashboardTenant{Name: t, Weight: w, Tokens: tenantTokens[t]})
	}
	return sorted, tenants
}

func labelValue(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}
