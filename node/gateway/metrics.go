package gateway

import (
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpuplane/gpuplane/node/gateway/isolation"
	"github.com/gpuplane/gpuplane/node/gateway/queue"
)

// metrics are the gateway's Prometheus series (docs/gateway.md, Metrics).
//
// Every label value comes from a bounded set, whatever clients send: a
// model label is a deployment's served name (a request for an unknown
// model is refused before it is counted), a class one of three, a node a
// member's name, and a tenant one of tenantLabels'. A latency histogram
// costs some 20 series per label set, so the histograms are split by
// tenant only with ACLs on, where the tenants are the ones the tokens
// name; without ACLs a tenant is whatever a client's header says, and
// only the token counters (two series a tenant) name it.
type metrics struct {
	ttft, tpot, queue *prometheus.HistogramVec
	rejections        *prometheus.CounterVec
	preemptions       *prometheus.CounterVec
	forwarded         *prometheus.CounterVec
	tokens            *prometheus.CounterVec
	// tenants bounds the tenant label's values; perTenant: the
	// histograms carry it.
	tenants   *tenantLabels
	perTenant bool
}

// OtherTenant is the tenant label of the requests of every tenant past
// Options.MetricTenants (without ACLs).
const OtherTenant = "other"

// DefaultMetricTenants is Options.MetricTenants' default.
const DefaultMetricTenants = 100

// tenantLabels bounds the tenant label's values. Without a bound (ACLs on)
// a tenant is its own label; with one, DefaultTenant and the configured
// tenants are, and so are the first max others seen; the rest share
// OtherTenant. The first come keep their label for the gateway's life, so
// that a tenant's series never change name under it.
type tenantLabels struct {
	max   int // 0: no bound
	fixed map[string]bool
	mu    sync.Mutex
	seen  map[string]bool
}

func newTenantLabels(max int, fixed map[string]float64) *tenantLabels {
	b := &tenantLabels{max: max, fixed: map[string]bool{isolation.DefaultTenant: true}, seen: map[string]bool{}}
	for t := range fixed {
		b.fixed[t] = true
	}
	return b
}

// label is tenant's label value, giving it one of its own if there is
// room.
func (b *tenantLabels) label(tenant string) string {
	if b.max == 0 || b.fixed[tenant] {
		return tenant
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.seen[tenant] {
		if len(b.seen) >= b.max {
			return OtherTenant
		}
		b.seen[tenant] = true
	}
	return tenant
}

// configured reports whether tenant is one the node's configuration or an
// ACL token names (not merely one a client's header did).
func (b *tenantLabels) configured(tenant string) bool {
	return b.max == 0 || b.fixed[tenant]
}

// latencyBuckets span 1 ms to about 65 s.
var latencyBuckets = prometheus.ExponentialBuckets(0.001, 2, 17)

func newMetrics(g *Gateway, reg prometheus.Registerer) *metrics {
	acl := g.opts.Tenants != nil
	by := []string{"model", "class"}
	if acl {
		by = append(by, "tenant")
	}
	bound := g.opts.MetricTenants
	if acl {
		bound = 0
	}
	m := &metrics{tenants: newTenantLabels(bound, g.opts.Weights), perTenant: acl,
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "gpuplane_gateway_ttft_seconds",
			Help: "Time from a request's arrival at the gateway to its first token (the whole answer when not streamed).", Buckets: latencyBuckets}, by),
		tpot: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "gpuplane_gateway_time_per_output_token_seconds",
			Help: "Mean time between a streamed request's tokens after the first.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}, by),
		queue: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "gpuplane_gateway_queue_seconds",
			Help: "Time a request waited in its card's queue before its engine got it.", Buckets: latencyBuckets}, by),
		rejections: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gpuplane_gateway_rejections_total",
			Help: "Requests the gateway turned away after admission checks, by HTTP status (429 queue full, 503 not loaded in time or preempted)."}, []string{"model", "status"}),
		preemptions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gpuplane_gateway_preemptions_total",
			Help: "Background requests cut off their engine for interactive work."}, []string{"model"}),
		forwarded: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gpuplane_gateway_forwarded_total",
			Help: "Requests forwarded to another node's gateway, by node."}, []string{"node"}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gpuplane_gateway_tokens_total",
			Help: "Tokens served on this node's engines, as the fair queues count them: the prompt (estimated, bytes/4) and the generated tokens."},
			[]string{"model", "class", "tenant", "kind"}),
	}
	if reg != nil {
		reg.MustRegister(m.ttft, m.tpot, m.queue, m.rejections, m.preemptions, m.forwarded, m.tokens, &depthCollector{g: g,
			queued: prometheus.NewDesc("gpuplane_gateway_queue_depth", "Requests waiting in the gateway for a replica on this node.",
				[]string{"replica", "card"}, nil),
			inFlight: prometheus.NewDesc("gpuplane_gateway_in_flight", "Requests the gateway has on a replica's engine on this node.",
				[]string{"replica", "card"}, nil),
			weight: prometheus.NewDesc("gpuplane_gateway_tenant_weight", "Weight of each tenant the gateway's queues know (configured or from its token; others weigh 1).",
				[]string{"tenant"}, nil),
		})
	}
	return m
}

// labels are a request's label values: model, class and tenant (bounded).
func (m *metrics) labels(model string, c queue.Class, tenant string) []string {
	return []string{model, c.String(), m.tenants.label(tenant)}
}

// latency are the histograms' label values of l.
func (m *metrics) latency(l []string) []string {
	if m.perTenant {
		return l
	}
	return l[:2]
}

func (m *metrics) firstToken(l []string, d time.Duration) {
	m.ttft.WithLabelValues(m.latency(l)...).Observe(d.Seconds())
}
func (m *metrics) perToken(l []string, d time.Duration) {
	m.tpot.WithLabelValues(m.latency(l)...).Observe(d.Seconds())
}
func (m *metrics) queued(l []string, d time.Duration) {
	m.queue.WithLabelValues(m.latency(l)...).Observe(d.Seconds())
}
func (m *metrics) rejected(model string, status int) {
	m.rejections.WithLabelValues(model, strconv.Itoa(status)).Inc()
}
func (m *metrics) servedTokens(l []string, prompt, generated int) {
	m.tokens.WithLabelValues(append(l, "prompt")...).Add(float64(prompt))
	m.tokens.WithLabelValues(append(l, "generated")...).Add(float64(generated))
}
func (m *metrics) preempted(p *pending)    { m.preemptions.WithLabelValues(p.model).Inc() }
func (m *metrics) forwardedTo(node string) { m.forwarded.WithLabelValues(node).Inc() }

// depthCollector reads the queues when scraped.
type depthCollector struct {
	g                        *Gateway
	queued, inFlight, weight *prometheus.Desc
}

func (d *depthCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- d.queued
	ch <- d.inFlight
	ch <- d.weight
}

func (d *depthCollector) Collect(ch chan<- prometheus.Metric) {
	d.g.mu.Lock()
	ls := make([]*local, 0, len(d.g.locals))
	for _, l := range d.g.locals {
		ls = append(ls, l)
	}
	d.g.mu.Unlock()
	weights := map[string]float64{}
	for t, w := range d.g.opts.Weights {
		weights[t] = w
	}
	for _, l := range ls {
		c := l.card
		c.mu.Lock()
		q, f := c.s.Queued(l.key), c.s.InFlight(l.key)
		for t, w := range c.weights {
			weights[t] = w
		}
		c.mu.Unlock()
		card := strconv.FormatUint(uint64(c.index), 10)
		ch <- prometheus.MustNewConstMetric(d.queued, prometheus.GaugeValue, float64(q), l.key, card)
		ch <- prometheus.MustNewConstMetric(d.inFlight, prometheus.GaugeValue, float64(f), l.key, card)
	}
	for t, w := range weights {
		// Without ACLs a weight the node was not configured with came in
		// a forwarded request's header, as did its tenant: shown, it would
		// be a series per name a client makes up.
		if d.g.metrics.tenants.configured(t) {
			ch <- prometheus.MustNewConstMetric(d.weight, prometheus.GaugeValue, w, t)
		}
	}
}
