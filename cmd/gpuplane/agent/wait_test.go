package agent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/gpuplane/gpuplane/cmd/gpuplane/cli"
	"github.com/gpuplane/gpuplane/internal/testutil"
)

// waitCause splits a wait's text ("4 requests waiting, the oldest for 3s:
// CAUSE; gets the card by 14:32:10 at the latest (in 9m0s)") into its
// cause, less the figures that move from one look to the next, and its
// bound.
var waitCause = regexp.MustCompile(`the oldest for [^:]+: (waits for its background turn: interactive writer/0 holds card \S+) with .*; gets the card by (\d\d:\d\d:\d\d) at the latest`)

// TestBackgroundWaitIsExplainedEverywhere is the batch scenario: a --dev
// agent (the residency controller's clock 30 times faster) whose card holds
// a pinned coder, a warm interactive writer kept busy and an onDemand
// background batch model that does not fit beside them. While four batch
// requests wait, `residency plan`, `models get`, the dashboard and `gpuplane
// ps` give the same cause and bound, and a `wait` decision is recorded once
// with the oldest request's age.
func TestBackgroundWaitIsExplainedEverywhere(t *testing.T) {
	n := newNode(t, "waits", true, "l4=1")
	n.cfg.Dev, n.cfg.BootstrapExpect = true, 0
	n.cfg.ResidencyTimeScale = 30
	n.start(t)
	gpuplane(t, n, "accelerators", "create", "shared", "--device", "l4", "--tenancy", "shared", "--max-models", "4")
	for _, m := range []struct{ name, residency, priority, percent, tps string }{
		{"coder", "pinned", "standard", "30", "50"},
		{"writer", "warm", "interactive", "40", "5"},
		{"batch", "onDemand", "background", "50", "50"},
	} {
		applySpec(t, n, m.name, fmt.Sprintf(`resource: ModelDeployment
resourceVersion: v1
metadata: {name: %s}
spec:
  model: /models/%s
  residency: %s
  priority: %s
  placement: {accelerator: shared}
  engine: {kind: sim, memoryPercent: %s, args: ["--tokens-per-second", %q, "--load-seconds", "0.2"]}
`, m.name, m.name, m.residency, m.priority, m.percent, m.tps))
	}
	waitServed(t, n.a.GatewayURL(), "writer")
	c := openaiClient(n)
	var wg sync.WaitGroup
	ask := func(model string, tokens int64) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, _ = c.Completions.New(ctx, openai.CompletionNewParams{Model: openai.CompletionNewParamsModel(model),
			Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("hi")}, MaxTokens: openai.Int(tokens)})
	}
	halt := keepBusy(c, "writer", 2, time.Minute, nil)
	time.Sleep(time.Second)
	for range 4 {
		wg.Go(func() { ask("batch", 5) })
	}
	defer func() { halt(); wg.Wait() }()

	// The plan explains the wait, with its bound.
	var cause, by string
	testutil.Eventually(t, 20*time.Second, "batch's wait in the plan", func() error {
		out, err := tryCLI(n, "residency", "plan", "-o", "json")
		if err != nil {
			return err
		}
		var cards []struct {
			Entries []struct {
				Model, Wait, Reason string
				Waiting             int
			}
		}
		if err := json.Unmarshal([]byte(out), &cards); err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		for _, card := range cards {
			for _, e := range card.Entries {
				if e.Model != "batch/0" {
					continue
				}
				m := waitCause.FindStringSubmatch(e.Wait)
				if m == nil || e.Waiting != 4 || !strings.Contains(e.Reason, m[1]) {
					return fmt.Errorf("batch/0 waiting %d: wait %q, reason %q", e.Waiting, e.Wait, e.Reason)
				}
				cause, by = m[1], m[2]
				return nil
			}
		}
		return fmt.Errorf("no batch/0 in the plan: %s", out)
	})
	t.Logf("cause %q, bound %s", cause, by)
	same := func(where, text string) {
		t.Helper()
		m := waitCause.FindStringSubmatch(text)
		if m == nil || m[1] != cause || m[2] != by {
			t.Errorf("%s: %q, want the plan's cause %q and bound %s", where, text, cause, by)
		}
	}
	mg := gpuplane(t, n, "models", "get", "batch")
	t.Logf("models get batch:\n%s", mg)
	same("models get batch", mg)
	same("gpuplane ps", gpuplane(t, n, "ps", "-o", "json"))
	t.Logf("gpuplane ps:\n%s", gpuplane(t, n, "ps"))
	if ps := gpuplane(t, n, "ps", "--model", "batch"); !regexp.MustCompile(`batch/0\s+waits\s+0\s+Cold\s+-\s+-\s+4\s+\S+\s+gets the card by ` + by).MatchString(ps) {
		t.Errorf("gpuplane ps:\n%s\nwant batch/0 Cold with 4 queued and the card by %s", ps, by)
	}

	// -w prints the rows, then the rows that change, until interrupted.
	var watched, stderr bytes.Buffer
	wctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	code := cli.Run(wctx, []string{"--addr", n.url(), "ps", "-w", "--interval", "100ms", "-o", "json"}, nil, &watched, &stderr)
	cancel()
	if code != 0 || !strings.Contains(watched.String(), `"model":"batch","replica":0`) || !strings.Contains(watched.String(), `"queue":4`) {
		t.Errorf("ps -w -o json: exit %d, %s\n%s", code, stderr.String(), watched.String())
	}

	resp, err := http.Post(n.url()+"/gpuplane.v1.DashboardService/Summary", "application/json", bytes.NewReader([]byte("{}")))
	if err != nil {
		t.Fatal(err)
	}
	var sum struct {
		Models []struct{ Name, Reason string }
	}
	err = json.NewDecoder(resp.Body).Decode(&sum)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range sum.Models {
		if m.Name == "batch" {
			same("dashboard", m.Reason)
		}
	}

	out := gpuplane(t, n, "residency", "decisions", "--model", "batch/0", "-o", "json")
	var ds []struct{ Action, Trigger, Reason string }
	if err := json.Unmarshal([]byte(out), &ds); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	waits := 0
	for _, d := range ds {
		if d.Action == "wait" {
			waits++
			if d.Trigger != "request" || !strings.Contains(d.Reason, "the oldest for") || !strings.Contains(d.Reason, cause) {
				t.Errorf("wait decision %+v, want trigger request, the oldest's age and the cause", d)
			}
		}
	}
	if waits != 1 {
		t.Errorf("%d wait decisions for batch/0's one wait, want 1:\n%s", waits, out)
	}
}
