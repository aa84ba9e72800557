package agent

import (
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"

	gometrics "github.com/hashicorp/go-metrics/compat"
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
	libMetricsSink *libSink
)

// libraryMetrics returns the collector of the libraries' own metrics, named
// gpuplane_raft_commit_time and the like (snake case, as Prometheus
// expects, where the libraries' keys are camel case).
func libraryMetrics() prometheus.Collector {
	libMetricsOnce.Do(func() {
		sink := newLibSink("gpuplane", libMetricsExpiry)
		conf := gometrics.DefaultConfig("")
		conf.EnableHostname = false
		conf.EnableHostnameLabel = false
		conf.EnableRuntimeMetrics = false // the Go collector already reports these
		if _, err := gometrics.NewGlobal(conf, sink); err != nil {
			return
		}
		libMetricsSink = sink
	})
	if libMetricsSink == nil {
		return nil
	}
	return libMetricsSink
}

// libMetricsExpiry drops a series not reported for this long, as
// go-metrics' Prometheus sink does by default (a server that stopped
// leading stops reporting the leader's series).
const libMetricsExpiry = time.Minute

// libSink is the go-metrics sink that exports the libraries' measurements
// to Prometheus, as go-metrics' own Prometheus sink does and with the same
// series: timings as summaries (median, 90th and 99th percentiles over 10
// s), counters, gauges, each named prefix_ and its key's parts in snake
// case joined by "_" (counters with "_total"), labels as constant labels,
// a series dropped when not reported for expiry. Raft reports several
// samples per batch and one per committed entry (commit time, FSM apply,
// dispatch), and go-metrics' sink builds the series' name and stores a new
// map entry for every one of them, a visible share of a server's CPU per
// write in the commit benchmark (bench/cluster); this one finds the
// series without allocating.
type libSink struct {
	prefix string
	expiry time.Duration

	mu     sync.RWMutex
	series map[string]*libSeries // kind, key parts and labels (see seriesKey)
}

// libSeries is one series and when it was last reported (unix nanoseconds).
type libSeries struct {
	m       libMetric
	updated atomic.Int64
}

// libMetric is what the three kinds of series have in common.
type libMetric interface {
	prometheus.Collector
}

const (
	kindGauge   = 'g'
	kindCounter = 'c'
	kindSummary = 's'
)

func newLibSink(prefix string, expiry time.Duration) *libSink {
	return &libSink{prefix: prefix, expiry: expiry, series: map[string]*libSeries{}}
}

// get returns the series of kind for key and labels, made on first use.
func (s *libSink) get(kind byte, key []string, labels []gometrics.Label) *libSeries {
	var buf [256]byte
	b := append(buf[:0], kind)
	for _, part := range key {
		b = append(b, 0)
		b = append(b, part...)
	}
	for _, l := range labels {
		b = append(b, 1)
		b = append(b, l.Name...)
		b = append(b, 2)
		b = append(b, l.Value...)
	}
	s.mu.RLock()
	ser := s.series[string(b)] // no allocation for the lookup
	s.mu.RUnlock()
	if ser != nil {
		return ser
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if ser = s.series[string(b)]; ser != nil {
		return ser
	}
	ser = &libSeries{m: newLibMetric(kind, s.name(key, kind == kindCounter), libHelp(kind, key), labels)}
	s.series[string(b)] = ser
	return ser
}

// name is the series' name: the prefix and the key's parts in snake case,
// joined by "_", with characters Prometheus does not allow in a name
// replaced as go-metrics' Prometheus sink replaces them.
func (s *libSink) name(key []string, counter bool) string {
	parts := []string{}
	if s.prefix != "" {
		parts = append(parts, s.prefix)
	}
	parts = append(parts, snakeKeyOf(key, counter)...)
	return forbiddenChars.Replace(strings.Join(parts, "_"))
}

var forbiddenChars = strings.NewReplacer(" ", "_", ".", "_", "=", "_", "-", "_", "/", "_")

// libHelpTexts says what the libraries' best-known series measure, with
// their unit; keyed by the library's own key joined with ".".
var libHelpTexts = map[string]string{
	"memberlist.gossip":                  "Time memberlist takes for one gossip round to its peers, in milliseconds.",
	"memberlist.queue.broadcasts":        "Messages waiting in memberlist's broadcast queue to be gossiped (count).",
	"raft.thread.main.saturation":        "Share of time raft's main goroutine was busy, from 0 to 1.",
	"raft.leader.oldestLogAge":           "Age of the oldest entry in the leader's log store, in milliseconds (how far back a lagging follower can catch up without a snapshot).",
	"raft.commitTime":                    "Time from a write reaching the leader to its commit, in milliseconds.",
	"raft.fsm.apply":                     "Time to apply one committed entry to the state machine, in milliseconds.",
	"raft.leader.lastContact":            "Time since the leader last heard from a follower, in milliseconds.",
	"raft.thread.fsm.saturation":         "Share of time raft's state-machine goroutine was busy, from 0 to 1.",
	"raft.replication.appendEntries.rpc": "Time of one append-entries RPC to a follower, in milliseconds.",
}

// libHelp is a series' HELP: its known text, or what the library reports
// under that key and in which unit go-metrics reports it (timings are in
// milliseconds).
func libHelp(kind byte, key []string) string {
	if h, ok := libHelpTexts[strings.Join(key, ".")]; ok {
		return h
	}
	what := "Measurement"
	switch kind {
	case kindCounter:
		what = "Count"
	case kindSummary:
		what = "Timing or size, timings in milliseconds,"
	}
	lib := "hashicorp/raft"
	if len(key) > 0 && key[0] == "memberlist" {
		lib = "hashicorp/memberlist"
	}
	return what + " reported by " + lib + " as " + strings.Join(key, ".") + "."
}

func newLibMetric(kind byte, name, help string, labels []gometrics.Label) libMetric {
	var constLabels prometheus.Labels
	if len(labels) > 0 {
		constLabels = prometheus.Labels{}
		for _, l := range snakeLabels(labels) {
			constLabels[l.Name] = l.Value
		}
	}
	switch kind {
	case kindGauge:
		return prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: constLabels})
	case kindCounter:
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: constLabels})
	}
	return prometheus.NewSummary(prometheus.SummaryOpts{Name: name, Help: help, ConstLabels: constLabels,
		MaxAge: 10 * time.Second, Objectives: map[float64]float64{0.5: 0.05, 0.9: 0.01, 0.99: 0.001}})
}

func (s *libSink) SetGauge(key []string, val float32) { s.SetGaugeWithLabels(key, val, nil) }
func (s *libSink) SetGaugeWithLabels(key []string, val float32, labels []gometrics.Label) {
	ser := s.get(kindGauge, key, labels)
	ser.m.(prometheus.Gauge).Set(float64(val))
	ser.updated.Store(time.Now().UnixNano())
}

// EmitKey has no Prometheus equivalent (go-metrics' sink ignores it too).
func (s *libSink) EmitKey(key []string, val float32) {}

func (s *libSink) IncrCounter(key []string, val float32) { s.IncrCounterWithLabels(key, val, nil) }
func (s *libSink) IncrCounterWithLabels(key []string, val float32, labels []gometrics.Label) {
	ser := s.get(kindCounter, key, labels)
	if val > 0 { // a Prometheus counter only grows (its Add panics otherwise)
		ser.m.(prometheus.Counter).Add(float64(val))
	}
	ser.updated.Store(time.Now().UnixNano())
}

func (s *libSink) AddSample(key []string, val float32) { s.AddSampleWithLabels(key, val, nil) }
func (s *libSink) AddSampleWithLabels(key []string, val float32, labels []gometrics.Label) {
	ser := s.get(kindSummary, key, labels)
	ser.m.(prometheus.Summary).Observe(float64(val))
	ser.updated.Store(time.Now().UnixNano())
}

// Describe describes nothing: the series come and go with what the
// libraries report, so the sink is an unchecked collector.
func (s *libSink) Describe(chan<- *prometheus.Desc) {}

// Collect reports every series reported within expiry and forgets the rest.
func (s *libSink) Collect(c chan<- prometheus.Metric) {
	cutoff := time.Now().Add(-s.expiry).UnixNano()
	s.mu.Lock()
	live := make([]*libSeries, 0, len(s.series))
	for k, ser := range s.series {
		if ser.updated.Load() < cutoff {
			delete(s.series, k)
			continue
		}
		live = append(live, ser)
	}
	s.mu.Unlock()
	for _, ser := range live {
		ser.m.Collect(c)
	}
}

func snakeKey(key []string) []string { return snakeKeyOf(key, false) }

// snakeKeyOf is key's parts in snake case, with the "_total" suffix
// Prometheus expects of counters (promtool check metrics) when counter is
// set.
func snakeKeyOf(key []string, counter bool) []string {
	out := make([]string, len(key))
	for i, part := range key {
		out[i] = snakeCase(part)
	}
	if counter && len(out) > 0 {
		out[len(out)-1] += "_total"
	}
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

// counterKey is a counter's key in snake case with the "_total" suffix.
func counterKey(key []string) []string { return snakeKeyOf(key, true) }

// snakeLabels renames label names to snake case too (raft labels its RPC
// samples "rpcType").
func snakeLabels(labels []gometrics.Label) []gometrics.Label {
	if len(labels) == 0 {
		return labels
	}
	out := make([]gometrics.Label, len(labels))
	for i, l := range labels {
		out[i] = gometrics.Label{Name: snakeKey([]string{l.Name})[0], Value: l.Value}
	}
	return out
}
