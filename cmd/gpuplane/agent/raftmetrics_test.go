package agent

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	gometrics "github.com/hashicorp/go-metrics/compat"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// TestLibraryMetricNamesStay: a counter keeps its name however often it is
// incremented (the cached key must not grow a "_total" each time), and label
// names are snake case like metric names (promlint refuses raft's "rpcType").
func TestLibraryMetricNamesStay(t *testing.T) {
	key := []string{"raft", "transition", "heartbeatTimeout"}
	want := []string{"raft", "transition", "heartbeat_timeout_total"}
	for range 3 {
		if got := counterKey(key); !slices.Equal(got, want) {
			t.Fatalf("counterKey = %v, want %v", got, want)
		}
	}
	if got := snakeKey(key); !slices.Equal(got, []string{"raft", "transition", "heartbeat_timeout"}) {
		t.Fatalf("snakeKey after counterKey = %v", got)
	}
	got := snakeLabels([]gometrics.Label{{Name: "rpcType", Value: "AppendEntries"}})
	if len(got) != 1 || got[0].Name != "rpc_type" || got[0].Value != "AppendEntries" {
		t.Fatalf("snakeLabels = %v, want rpc_type=AppendEntries", got)
	}
}

// TestLibSinkSeries: the sink exports each kind of go-metrics measurement
// under its snake-case name with its labels (a counter with "_total", a
// timing as a summary with quantiles), adds to one series however often it
// is reported, and drops the series not reported within its expiry.
func TestLibSinkSeries(t *testing.T) {
	s := newLibSink("gpuplane", time.Hour)
	for range 3 {
		s.AddSampleWithLabels([]string{"raft", "replication", "appendEntries", "rpc"}, 2, []gometrics.Label{{Name: "peerId", Value: "s2"}})
		s.IncrCounter([]string{"raft", "transition", "heartbeatTimeout"}, 1)
		s.IncrCounter([]string{"raft", "apply"}, 0) // counted as reported, adds nothing
		s.SetGauge([]string{"raft", "leader", "oldestLogAge"}, 7)
	}
	s.AddSample([]string{"memberlist", "gossip"}, 1)
	s.EmitKey([]string{"raft", "ignored"}, 1)

	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(s)
	got := gather(t, reg)
	want := map[string]string{
		"gpuplane_raft_replication_append_entries_rpc":     `SUMMARY count=3 sum=6 labels=peer_id=s2 quantiles=3`,
		"gpuplane_raft_transition_heartbeat_timeout_total": `COUNTER 3`,
		"gpuplane_raft_apply_total":                        `COUNTER 0`,
		"gpuplane_raft_leader_oldest_log_age":              `GAUGE 7`,
		"gpuplane_memberlist_gossip":                       `SUMMARY count=1 sum=1 labels= quantiles=3`,
	}
	if !maps.Equal(got, want) {
		t.Fatalf("series:\n got %v\nwant %v", got, want)
	}

	expired := newLibSink("gpuplane", -time.Hour) // every report is older than its cutoff
	expired.IncrCounter([]string{"raft", "apply"}, 1)
	reg = prometheus.NewPedanticRegistry()
	reg.MustRegister(expired)
	if got := gather(t, reg); len(got) != 0 {
		t.Fatalf("expired series still exported: %v", got)
	}
	if len(expired.series) != 0 {
		t.Fatalf("expired series still held: %d", len(expired.series))
	}
}

// gather describes each family of reg in one line.
func gather(t *testing.T, reg *prometheus.Registry) map[string]string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, mf := range mfs {
		if len(mf.GetMetric()) != 1 {
			t.Fatalf("%s: %d series, want 1", mf.GetName(), len(mf.GetMetric()))
		}
		m := mf.GetMetric()[0]
		switch mf.GetType() {
		case dto.MetricType_COUNTER:
			out[mf.GetName()] = fmt.Sprintf("COUNTER %g", m.GetCounter().GetValue())
		case dto.MetricType_GAUGE:
			out[mf.GetName()] = fmt.Sprintf("GAUGE %g", m.GetGauge().GetValue())
		case dto.MetricType_SUMMARY:
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			out[mf.GetName()] = fmt.Sprintf("SUMMARY count=%d sum=%g labels=%s quantiles=%d", m.GetSummary().GetSampleCount(),
				m.GetSummary().GetSampleSum(), strings.Join(labels, ","), len(m.GetSummary().GetQuantile()))
		default:
			out[mf.GetName()] = mf.GetType().String()
		}
	}
	return out
}

// BenchmarkLibSinkSample is one of Raft's per-entry samples on a series
// that exists.
func BenchmarkLibSinkSample(b *testing.B) {
	s := newLibSink("gpuplane", time.Hour)
	key, labels := []string{"raft", "replication", "appendEntries", "rpc"}, []gometrics.Label{{Name: "peerId", Value: "s2"}}
	b.ReportAllocs()
	for b.Loop() {
		s.AddSampleWithLabels(key, 1, labels)
	}
}

// TestLibSinkHelp: a library series' HELP says what it measures and its
// unit, not its own name again.
func TestLibSinkHelp(t *testing.T) {
	s := newLibSink("gpuplane", time.Hour)
	s.AddSample([]string{"memberlist", "gossip"}, 1)
	s.SetGauge([]string{"raft", "leader", "oldestLogAge"}, 7)
	s.IncrCounter([]string{"raft", "transition", "heartbeatTimeout"}, 1)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(s)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"gpuplane_memberlist_gossip":                       "milliseconds",
		"gpuplane_raft_leader_oldest_log_age":              "milliseconds",
		"gpuplane_raft_transition_heartbeat_timeout_total": "raft.transition.heartbeatTimeout",
	}
	for _, mf := range mfs {
		help := mf.GetHelp()
		if help == mf.GetName() || !strings.Contains(help, want[mf.GetName()]) {
			t.Errorf("%s HELP = %q, want it to say %q", mf.GetName(), help, want[mf.GetName()])
		}
	}
	if len(mfs) != len(want) {
		t.Errorf("got %d families, want %d", len(mfs), len(want))
	}
}
