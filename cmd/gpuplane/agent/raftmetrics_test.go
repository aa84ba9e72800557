package agent

import (
	"slices"
	"testing"

	gometrics "github.com/hashicorp/go-metrics/compat"
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
