package gateway

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpuplane/gpuplane/node/gateway/queue"
)

// metrics are the gateway's Prometheus series (SPEC §8.4 Measurement).
type metrics struct {
	ttft, tpot, queue *prometheus.HistogramVec
	rejections        *prometheus.CounterVec
	preemptions       *prometheus.CounterVec
	forwarded         *prometheus.CounterVec
	tokens            *prometheus.CounterVec
}

// latencyBuckets span 1 ms to about 65 s.
var latencyBuckets = prometheus.ExponentialBuckets(0.001, 2, 17)

func newMetrics(g *Gateway, reg prometheus.Registerer) *metrics {
	by := []string{"model", "class", "tenant"}
	m := &metrics{
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

func (m *metrics) labels(model string, c queue.Class, tenant string) []string {
	return []string{model, c.String(), tenant}
}

func (m *metrics) firstToken(l []string, d time.Duration) {
	m.ttft.WithLabelValues(l...).Observe(d.Seconds())
}
func (m *metrics) perToken(l []string, d time.Duration) {
	m.tpot.WithLabelValues(l...).Observe(d.Seconds())
}
func (m *metrics) queued(l []string, d time.Duration) {
	m.queue.WithLabelValues(l...).Observe(d.Seconds())
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
		ch <- prometheus.MustNewConstMetric(d.weight, prometheus.GaugeValue, w, t)
	}
}
