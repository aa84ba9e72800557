package agent

import (
	"strings"
	"sync"
	"unicode"

	gometrics "github.com/hashicorp/go-metrics/compat"
	gmprom "github.com/hashicorp/go-metrics/compat/prometheus"
	"github.com/prometheus/client_golang/prometheus"
)

// Raft (and memberlist) report their own measurements through go-metrics'
// process-wide sink: commit time, FSM apply time, append-entries RPCs,
// leader contact, elections. Consul exports them to Prometheus the same
// way. The sink is process-wide because go-metrics is, so it is made once
// and registered in every agent's registry (tests run several agents in one
// process).
var (
	libMetricsOnce sync.Once
	libMetricsSink *gmprom.PrometheusSink
)

// libraryMetrics returns the collector of the libraries' own metrics, named
// gpuplane_raft_commit_time and the like (snake case, as Prometheus
// expects, where the libraries' keys are camel case).
func libraryMetrics() prometheus.Collector {
	libMetricsOnce.Do(func() {
		opts := gmprom.DefaultPrometheusOpts
		// Registered by each agent in its own registry, never in the
		// global one.
		opts.Registerer = prometheus.NewRegistry()
		sink, err := gmprom.NewPrometheusSinkFrom(opts)
		if err != nil {
			return
		}
		conf := gometrics.DefaultConfig("gpuplane")
		conf.EnableHostname = false
		conf.EnableHostnameLabel = false
		conf.EnableRuntimeMetrics = false // the Go collector already reports these
		if _, err := gometrics.NewGlobal(conf, snakeSink{sink}); err != nil {
			return
		}
		libMetricsSink = sink
	})
	if libMetricsSink == nil {
		return nil
	}
	return libMetricsSink
}

// snakeSink renames each key part from camel case to snake case on its way
// to the Prometheus sink (raft's "commitTime" becomes "commit_time").
type snakeSink struct{ next gometrics.MetricSink }

// snakeKeys remembers each key's snake-case form: raft reports several
// samples per batch and one per committed entry (commit time, dispatch,
// append entries, FSM apply), and renaming a key allocates. The keys are a
// few dozen fixed names.
var snakeKeys struct {
	sync.RWMutex
	m map[string][]string // parts joined by NUL -> snake-case parts
}

func snakeKey(key []string) []string {
	var buf [128]byte
	b := buf[:0]
	for _, part := range key {
		b = append(b, part...)
		b = append(b, 0)
	}
	snakeKeys.RLock()
	out, ok := snakeKeys.m[string(b)] // no allocation for the lookup
	snakeKeys.RUnlock()
	if ok {
		return out
	}
	out = make([]string, len(key))
	for i, part := range key {
		out[i] = snakeCase(part)
	}
	snakeKeys.Lock()
	if snakeKeys.m == nil {
		snakeKeys.m = map[string][]string{}
	}
	snakeKeys.m[string(b)] = out
	snakeKeys.Unlock()
	return out
}

func snakeCase(s string) string {
	var b strings.Builder
	prevLower := false
	for _, r := range s {
		if unicode.IsUpper(r) {
			if prevLower {
				b.WriteByte('_')
			}
			b.WriteRune(unicode.ToLower(r))
			prevLower = false
			continue
		}
		b.WriteRune(r)
		prevLower = unicode.IsLower(r) || unicode.IsDigit(r)
	}
	return b.String()
}

func (s snakeSink) SetGauge(key []string, val float32) { s.next.SetGauge(snakeKey(key), val) }
func (s snakeSink) SetGaugeWithLabels(key []string, val float32, labels []gometrics.Label) {
	s.next.SetGaugeWithLabels(snakeKey(key), val, labels)
}
func (s snakeSink) EmitKey(key []string, val float32)     { s.next.EmitKey(snakeKey(key), val) }
func (s snakeSink) IncrCounter(key []string, val float32) { s.next.IncrCounter(counterKey(key), val) }
func (s snakeSink) IncrCounterWithLabels(key []string, val float32, labels []gometrics.Label) {
	s.next.IncrCounterWithLabels(counterKey(key), val, labels)
}

// counterKey is a counter's key in snake case with the "_total" suffix
// Prometheus expects of counters (promtool check metrics).
func counterKey(key []string) []string {
	out := snakeKey(key)
	if len(out) > 0 {
		out[len(out)-1] += "_total"
	}
	return out
}
func (s snakeSink) AddSample(key []string, val float32) { s.next.AddSample(snakeKey(key), val) }
func (s snakeSink) AddSampleWithLabels(key []string, val float32, labels []gometrics.Label) {
	s.next.AddSampleWithLabels(snakeKey(key), val, labels)
}
