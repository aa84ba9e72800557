package agent_test

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"

	"github.com/gpuplane/gpuplane/cmd/gpuplane/agent"
	"github.com/gpuplane/gpuplane/internal/testutil"
)

// TestMetricsLint scrapes a --dev agent's /metrics after it served a
// pinned and an onDemand model and answered API calls: the series the
// dashboard and docs/operations.md rely on are there, and the whole exposition passes promlint (the checks of
// `promtool check metrics`).
func TestMetricsLint(t *testing.T) {
	n := devNode(t, "metrics", agent.GatewayConfig{})
	deploySim(t, n, "chat", "pinned", "--tokens-per-second", "0")
	deploySim(t, n, "embed", "onDemand", "--tokens-per-second", "0", "--load-seconds", "0.2")
	waitServed(t, n.a.GatewayURL(), "chat")
	waitCold(t, n, "embed")
	waitServed(t, n.a.GatewayURL(), "embed")
	gpuplane(t, n, "models", "list")
	if _, err := tryCLI(n, "models", "get", "no-such-model"); err == nil {
		t.Fatal("models get no-such-model succeeded")
	}

	for _, want := range []struct {
		name  string
		match []string
	}{
		{"gpuplane_card_memory_bytes", []string{`state="usable"`}},
		{"gpuplane_card_memory_bytes", []string{`state="resident"`}},
		{"gpuplane_residency_decisions_total", []string{`action="load"`, `trigger="request"`}},
		{"gpuplane_residency_transitions_total", []string{`from="Loading"`, `to="Resident"`}},
		{"gpuplane_api_calls_total", []string{`procedure="/gpuplane.v1.ModelService/ListModels"`, `code="ok"`}},
		{"gpuplane_api_calls_total", []string{`procedure="/gpuplane.v1.ModelService/GetModel"`, `code="not_found"`}},
		{"gpuplane_api_call_seconds_count", []string{`procedure="/gpuplane.v1.ModelService/ListModels"`}},
		{"gpuplane_gateway_tokens_total", []string{`model="embed"`, `kind="generated"`}},
		{"gpuplane_gateway_ttft_seconds_count", []string{`model="chat"`}},
		{"gpuplane_raft_commit_time_count", nil},
	} {
		testutil.Eventually(t, 30*time.Second, want.name+" "+strings.Join(want.match, ","), func() error {
			if metric(t, n, want.name, want.match...) <= 0 {
				return errNoSample
			}
			return nil
		})
	}

	// The engine's own gauges, read from its /metrics (the sim speaks
	// vLLM's series): present for the running engine, idle now.
	testutil.Eventually(t, 30*time.Second, "gpuplane_engine_requests of chat's engine", func() error {
		resp, err := http.Get(n.url() + "/metrics")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		for _, state := range []string{"running", "waiting"} {
			if !strings.Contains(string(body), `gpuplane_engine_requests{model="chat",replica="0",state="`+state+`"} 0`) {
				return errString("no idle " + state + " series for chat/0")
			}
		}
		return nil
	})

	resp, err := http.Get(n.url() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	problems, err := promlint.New(resp.Body).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
}

var errNoSample = errString("no sample above 0")

type errString string

func (e errString) Error() string { return string(e) }
