package agent

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpuplane/gpuplane/node/engine"
)

// engineScrapeTimeout bounds the reading of one engine's /metrics: a busy
// or stuck engine leaves its series out of this scrape, not the scrape
// waiting.
const engineScrapeTimeout = time.Second

// engineCollector reads, when /metrics is scraped, the request gauges of
// the node's running engines that have them (engine.ReadLoad), all at
// once.
type engineCollector struct {
	a        *Agent
	client   *http.Client
	requests *prometheus.Desc
}

func (c *engineCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.requests }

func (c *engineCollector) Collect(ch chan<- prometheus.Metric) {
	list := c.a.engines.Load()
	if list == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), engineScrapeTimeout)
	defer cancel()
	var wg sync.WaitGroup
	for _, e := range (*list)() {
		if e.URL == "" || !engine.HasMetrics(e.Kind) {
			continue
		}
		wg.Go(func() {
			l, err := engine.ReadLoad(ctx, c.client, e.Kind, e.URL, c.a.engineKeys.For(e.Model, e.Replica))
			if err != nil {
				return // starting, stopping or asleep without a server
			}
			replica := strconv.FormatUint(uint64(e.Replica), 10)
			ch <- prometheus.MustNewConstMetric(c.requests, prometheus.GaugeValue, l.Running, e.Model, replica, "running")
			ch <- prometheus.MustNewConstMetric(c.requests, prometheus.GaugeValue, l.Waiting, e.Model, replica, "waiting")
		})
	}
	wg.Wait()
}
