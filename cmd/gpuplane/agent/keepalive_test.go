package agent_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/cmd/gpuplane/agent"
	"github.com/gpuplane/gpuplane/internal/testutil"
)

// TestKeepAliveAtTheFront: a request sent straight to a replica's endpoint
// (its front, without ACLs) takes keep_alive as the gateway does: a bad
// value is a 400 naming the field and loads nothing; keep_alive 0 puts the
// onDemand model to sleep once the request ended, long before the card's
// idle timeout (5 minutes), and the decision names the request's
// keep_alive.
func TestKeepAliveAtTheFront(t *testing.T) {
	n := devNode(t, "kaf", agent.GatewayConfig{})
	deploySim(t, n, "od", "onDemand", "--tokens-per-second", "0", "--load-seconds", "0.2")
	waitCold(t, n, "od")
	var front string
	testutil.Eventually(t, 60*time.Second, "od's endpoint", func() error {
		var reps []struct{ Model, Endpoint string }
		if err := json.Unmarshal([]byte(gpuplane(t, n, "replicas", "list", "-o", "json")), &reps); err != nil {
			return err
		}
		i := slices.IndexFunc(reps, func(r struct{ Model, Endpoint string }) bool { return r.Model == "od" })
		if i < 0 || reps[i].Endpoint == "" {
			return fmt.Errorf("no endpoint for od among %+v", reps)
		}
		front = reps[i].Endpoint
		return nil
	})
	send := func(keepAlive string) (int, string) {
		t.Helper()
		resp, err := http.Post(front+"/v1/completions", "application/json",
			strings.NewReader(fmt.Sprintf(`{"model":"od","prompt":"x","max_tokens":2,"keep_alive":%s}`, keepAlive)))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := send(`"soon"`); code != http.StatusBadRequest || !strings.Contains(body, "keep_alive") {
		t.Fatalf("keep_alive \"soon\" at the front: %d %s, want 400 naming keep_alive", code, body)
	}
	if out := gpuplane(t, n, "residency", "decisions", "--model", "od/0"); strings.Contains(out, "load") {
		t.Fatalf("a refused request loaded its model:\n%s", out)
	}
	if code, body := send(`0`); code != http.StatusOK {
		t.Fatalf("keep_alive 0 at the front: %d %s", code, body)
	}
	testutil.Eventually(t, 60*time.Second, "od asleep after its keep_alive 0", func() error {
		out := gpuplane(t, n, "residency", "decisions", "--model", "od/0")
		for line := range strings.SplitSeq(out, "\n") {
			if strings.Contains(line, "keep_alive") && (strings.Contains(line, " sleep ") || strings.Contains(line, " unload ")) {
				return nil
			}
		}
		return fmt.Errorf("decisions:\n%s", out)
	})
}
