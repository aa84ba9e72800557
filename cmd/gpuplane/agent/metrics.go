package agent

import (
	"net/http"

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
		Help: "Memory ledger invariant violations (SPEC §8.2) the residency controllers of this node's cards found; each drops its card to pinned-only.",
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
	if lib := libraryMetrics(); lib != nil {
		reg.MustRegister(lib)
	}
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
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
