package agent

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/gpuplane/gpuplane/fsm"
)

// metricsHandler serves /metrics: the Go runtime and process, the node's
// view of the cluster read from its local state when scraped, and Raft's own
// metrics (raftmetrics.go).
func (a *Agent) metricsHandler() http.Handler {
	reg := prometheus.NewRegistry()
	a.metricsReg = reg
	a.gatewayReg = prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "gpuplane_raft_applied_index", Help: "Index of the last log entry this node's state machine applied.",
	}, func() float64 { return float64(a.cluster.AppliedIndex()) }))
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "gpuplane_raft_leader", Help: "1 when this node is the Raft leader.",
	}, func() float64 {
		if a.cluster.IsLeader() {
			return 1
		}
		return 0
	}))
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "gpuplane_leader_reconcile_rounds_total", Help: "Membership reconcile rounds this server ran as leader.",
	}, func() float64 { n, _, _ := a.cluster.ReconcileStats(); return float64(n) }))
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "gpuplane_leader_reconcile_last_seconds", Help: "How long this server's last membership reconcile round as leader took, its writes included.",
	}, func() float64 { _, d, _ := a.cluster.ReconcileStats(); return d.Seconds() }))
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "gpuplane_leader_reconcile_max_seconds", Help: "The longest membership reconcile round this server ran as leader, its writes included.",
	}, func() float64 { _, _, d := a.cluster.ReconcileStats(); return d.Seconds() }))
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "gpuplane_residency_violations",
		Help: "Memory ledger invariant violations (docs/residency.md) the residency controllers of this node's cards found; each drops its card to pinned-only.",
	}, func() float64 {
		n := 0
		for _, c := range a.residencyJournal.Cards() {
			n += c.Violations
		}
		return float64(n)
	}))
	reg.MustRegister(&resourceCollector{a: a,
		logBytes:   prometheus.NewDesc("gpuplane_raft_log_bytes", "Bytes of this server's Raft log files.", nil, nil),
		firstIndex: prometheus.NewDesc("gpuplane_raft_log_first_index", "Oldest log index this server holds (above 1 once the log was compacted after an archive).", nil, nil),
		snapBytes:  prometheus.NewDesc("gpuplane_raft_snapshot_bytes", "Bytes of this server's latest snapshot.", nil, nil),
		reqEntries: prometheus.NewDesc("gpuplane_request_ids", "Request ids the state machine holds for deduplication (expired ones not yet compacted away included).", nil, nil),
		reqLive:    prometheus.NewDesc("gpuplane_request_ids_live", "Request ids within the window: those a retry is deduplicated against.", nil, nil),
		reqBytes:   prometheus.NewDesc("gpuplane_request_table_bytes", "Memory the request-id table takes, about.", nil, nil),
	})
	reg.MustRegister(&stateCollector{a: a,
		nodes:    prometheus.NewDesc("gpuplane_nodes", "Nodes by status, as this node's state says.", []string{"status"}, nil),
		replicas: prometheus.NewDesc("gpuplane_replicas", "Replicas by state, as this node's state says.", []string{"state"}, nil),
		cards:    prometheus.NewDesc("gpuplane_cards", "Cards by device kind, and how many are not bound to an accelerator.", []string{"device", "bound"}, nil),
	})
	reg.MustRegister(&engineCollector{a: a, client: &http.Client{}, requests: prometheus.NewDesc("gpuplane_engine_requests",
		"Requests each engine on this node says it runs and holds waiting, read from the engine's own /metrics when scraped (vLLM's num_requests_running and num_requests_waiting, llama-server's requests_processing and requests_deferred); requests sent to the engine past the gateway count too.",
		[]string{"model", "replica", "state"}, nil)})
	reg.MustRegister(&residencyCollector{a: a,
		memory: prometheus.NewDesc("gpuplane_card_memory_bytes",
			"Memory of each card this node's residency controllers manage, by state, as devices get counts it: total, usable (total less headroom) = used + sleeping + free; reserved (pinned and warm shares), resident (what engines awake cost), used (that and the reserved shares not loaded and not lent), sleeping (residuals of engines asleep), free (the rest, lent shares included).",
			[]string{"card", "state"}, nil),
		decisions: prometheus.NewDesc("gpuplane_residency_decisions_total",
			"Decisions this node's residency controllers recorded, by action and trigger; advised ones (advise mode) are not executed.",
			[]string{"action", "trigger", "advised"}, nil),
		transitions: prometheus.NewDesc("gpuplane_residency_transitions_total",
			"Residency transitions of this node's replicas (Cold, Loading, Resident, Draining, Sleeping, Waking, Failed).",
			[]string{"from", "to"}, nil),
		bestEffort: prometheus.NewDesc("gpuplane_model_best_effort",
			"1 where a replica's card cannot hold every model with demand and serves it best-effort, outside the protected set (residency plan says why, in numbers); 0 where it is protected or the card holds them all.",
			[]string{"model", "replica", "node", "card"}, nil),
	})
	if !a.cfg.Hollow {
		if lib := libraryMetrics(); lib != nil {
			reg.MustRegister(lib)
		}
	}
	return promhttp.HandlerFor(prometheus.Gatherers{reg, a.gatewayReg}, promhttp.HandlerOpts{})
}

// resourceCollector reports cluster.Resources at scrape time; client nodes
// hold none and report none of these series.
type resourceCollector struct {
	a                                                              *Agent
	logBytes, firstIndex, snapBytes, reqEntries, reqLive, reqBytes *prometheus.Desc
}

func (c *resourceCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.logBytes, c.firstIndex, c.snapBytes, c.reqEntries, c.reqLive, c.reqBytes} {
		ch <- d
	}
}

func (c *resourceCollector) Collect(ch chan<- prometheus.Metric) {
	r := c.a.cluster.Resources()
	if r == nil {
		return
	}
	for d, v := range map[*prometheus.Desc]uint64{c.logBytes: r.GetLogBytes(), c.firstIndex: r.GetFirstIndex(),
		c.snapBytes: r.GetSnapshotBytes(), c.reqEntries: r.GetRequestEntries(), c.reqLive: r.GetRequestLive(), c.reqBytes: r.GetRequestBytes()} {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v))
	}
}

// stateCollector reads counts from the local state at scrape time. Client
// nodes hold no state and report none of these series.
type stateCollector struct {
	a                      *Agent
	nodes, replicas, cards *prometheus.Desc
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.nodes
	ch <- c.replicas
	ch <- c.cards
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	if !c.a.cluster.IsServer() {
		return
	}
	c.a.cluster.View(func(f *fsm.FSM) {
		nodes := map[string]int{}
		for _, n := range f.Nodes() {
			nodes[fsm.StatusName(n.Status)]++
		}
		for status, n := range nodes {
			ch <- prometheus.MustNewConstMetric(c.nodes, prometheus.GaugeValue, float64(n), status)
		}
		replicas := map[string]int{}
		for _, r := range f.Replicas("", "") {
			replicas[fsm.ReplicaStateName(r.State)]++
		}
		for state, n := range replicas {
			ch <- prometheus.MustNewConstMetric(c.replicas, prometheus.GaugeValue, float64(n), state)
		}
		for _, d := range f.Devices() {
			ch <- prometheus.MustNewConstMetric(c.cards, prometheus.GaugeValue, float64(d.Total-d.Free), d.Name, "true")
			ch <- prometheus.MustNewConstMetric(c.cards, prometheus.GaugeValue, float64(d.Free), d.Name, "false")
		}
	})
}

// residencyCollector reads this node's residency journal at scrape time.
type residencyCollector struct {
	a                                          *Agent
	memory, decisions, transitions, bestEffort *prometheus.Desc
}

func (c *residencyCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.memory
	ch <- c.decisions
	ch <- c.transitions
	ch <- c.bestEffort
}

func (c *residencyCollector) Collect(ch chan<- prometheus.Metric) {
	j := c.a.residencyJournal
	if j == nil {
		return
	}
	for _, v := range j.Cards() {
		l := v.Ledger
		usable := v.Usable
		if usable == 0 {
			usable = l.Usable
		}
		acct := l.Account()
		for _, s := range []struct {
			state string
			bytes int64
		}{{"total", l.Memory}, {"usable", usable}, {"reserved", l.Reserved}, {"resident", l.Resident},
			{"used", acct.Used}, {"sleeping", acct.Sleeping}, {"free", acct.Free}} {
			ch <- prometheus.MustNewConstMetric(c.memory, prometheus.GaugeValue, float64(s.bytes), v.Card, s.state)
		}
		for _, e := range v.Plan {
			model, replica, _ := strings.Cut(string(e.Model), "/")
			be := 0.0
			if e.BestEffort != "" {
				be = 1
			}
			ch <- prometheus.MustNewConstMetric(c.bestEffort, prometheus.GaugeValue, be, model, replica, j.Node(), v.Card)
		}
	}
	decided, moved := j.Counts()
	for k, n := range decided {
		ch <- prometheus.MustNewConstMetric(c.decisions, prometheus.CounterValue, float64(n), k.Action, k.Trigger, strconv.FormatBool(k.Advised))
	}
	for k, n := range moved {
		ch <- prometheus.MustNewConstMetric(c.transitions, prometheus.CounterValue, float64(n), k.From.String(), k.To.String())
	}
}

// apiMetrics counts the API's calls by procedure and code and times them;
// it wraps the handlers outside the token check, so refused calls count.
type apiMetrics struct {
	calls   *prometheus.CounterVec
	latency *prometheus.HistogramVec
}

func newAPIMetrics(reg prometheus.Registerer) *apiMetrics {
	m := &apiMetrics{
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gpuplane_api_calls_total",
			Help: "API calls this node answered, by procedure and Connect code (ok when none)."}, []string{"procedure", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "gpuplane_api_call_seconds",
			Help:    "Time this node took to answer an API call (a stream: until it ended), by procedure and code.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 18)}, []string{"procedure", "code"}),
	}
	reg.MustRegister(m.calls, m.latency)
	return m
}

func (m *apiMetrics) observe(procedure string, start time.Time, err error) {
	code := "ok"
	if err != nil {
		code = connect.CodeOf(err).String()
	}
	m.calls.WithLabelValues(procedure, code).Inc()
	m.latency.WithLabelValues(procedure, code).Observe(time.Since(start).Seconds())
}

func (m *apiMetrics) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		start := time.Now()
		resp, err := next(ctx, req)
		m.observe(req.Spec().Procedure, start, err)
		return resp, err
	}
}

func (m *apiMetrics) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (m *apiMetrics) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		start := time.Now()
		err := next(ctx, conn)
		m.observe(conn.Spec().Procedure, start, err)
		return err
	}
}
