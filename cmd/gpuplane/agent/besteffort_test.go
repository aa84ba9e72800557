package agent_test

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/gpuplane/gpuplane/internal/testutil"
)

// TestLiveAgentServesTheCoderBestEffort is the 32 GiB case on a
// --dev agent's simulated L4 (24 GiB; the controller's clock 30 times
// faster): chat warm (44 % of the card), coder onDemand (62 %) and vision
// onDemand (44 %), all interactive and kept busy. The card cannot hold
// chat and coder at once; it can hold chat and vision. The agent protects
// chat and vision and serves the coder best-effort, and says so in
// numbers everywhere: `residency plan` (its SET column, a line with why,
// -o json's bestEffort), the decision log (a best-effort decision for
// coder/0 with trigger pressure), `gpuplane ps` and
// gpuplane_model_best_effort. Chat stays served and neither the coder nor
// vision is starved. `residency protect coder` puts the operator's choice
// in force (vision best-effort, a decision with trigger operator), and
// --clear gives the choice back.
func TestLiveAgentServesTheCoderBestEffort(t *testing.T) {
	n := newNode(t, "be", true, "l4=1")
	n.cfg.Dev, n.cfg.BootstrapExpect = true, 0
	n.cfg.ResidencyTimeScale = 30
	n.start(t)
	gpuplane(t, n, "accelerators", "create", "shared", "--device", "l4", "--tenancy", "shared", "--max-models", "4")
	for _, m := range []struct{ name, residency, percent string }{
		{"chat", "warm", "44"}, {"coder", "onDemand", "62"}, {"vision", "onDemand", "44"},
	} {
		applySpec(t, n, m.name, fmt.Sprintf(`resource: ModelDeployment
resourceVersion: v1
metadata: {name: %s}
spec:
  model: /models/%s
  residency: %s
  priority: interactive
  placement: {accelerator: shared}
  engine: {kind: sim, memoryPercent: %s, args: ["--tokens-per-second", "100", "--load-seconds", "0.3"]}
`, m.name, m.name, m.residency, m.percent))
	}
	waitServed(t, n.a.GatewayURL(), "chat")

	c := openaiClient(n)
	models := []string{"chat", "coder", "vision"}
	var offered, served [3]atomic.Int64
	var halts []func()
	for i, m := range models {
		halts = append(halts, keepBusy(c, m, 2, 45*time.Second, func(err error) {
			offered[i].Add(1)
			if err == nil {
				served[i].Add(1)
			} else {
				time.Sleep(200 * time.Millisecond)
			}
		}))
	}
	halt := func() {
		for _, h := range halts {
			h()
		}
	}
	defer halt()

	type entry struct {
		Model, BestEffort string
	}
	plan := func() (map[string]string, error) {
		out, err := tryCLI(n, "residency", "plan", "-o", "json")
		if err != nil {
			return nil, err
		}
		var cards []struct{ Entries []entry }
		if err := json.Unmarshal([]byte(out), &cards); err != nil {
			return nil, fmt.Errorf("%v: %s", err, out)
		}
		be := map[string]string{}
		for _, card := range cards {
			for _, e := range card.Entries {
				be[e.Model] = e.BestEffort
			}
		}
		return be, nil
	}
	// The coder is best-effort, with its numbers; chat and vision are
	// protected.
	var why string
	testutil.Eventually(t, 60*time.Second, "coder best-effort in the plan", func() error {
		be, err := plan()
		if err != nil {
			return err
		}
		if be["coder/0"] == "" || be["chat/0"] != "" || be["vision/0"] != "" {
			return fmt.Errorf("best-effort: %q", be)
		}
		why = be["coder/0"]
		return nil
	})
	t.Logf("coder: %s", why)
	if !regexp.MustCompile(`^coder/0: needs [0-9.]+Gi; with the protected set on the card it can lend [0-9.]+Gi; .*→ best-effort$`).MatchString(why) {
		t.Errorf("coder's why: %q, want what it needs and what the card can lend", why)
	}
	out := gpuplane(t, n, "residency", "plan")
	t.Logf("residency plan:\n%s", out)
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)^\S+\s+\S+\s+coder/0\s.*\sbest-effort\s`),
		regexp.MustCompile(`(?m)^\S+\s+\S+\s+chat/0\s.*\sprotected\s`),
		regexp.MustCompile(`(?m)^\S+\s+\S+\s+vision/0\s.*\sprotected\s`),
		regexp.MustCompile(`(?m)^best-effort on be card \S+: coder/0: needs `),
	} {
		if !want.MatchString(out) {
			t.Errorf("residency plan: no line matching %s", want)
		}
	}
	// The decision log: coder/0's own best-effort decision, with why.
	testutil.Eventually(t, 10*time.Second, "coder's best-effort decision", func() error {
		out, err := tryCLI(n, "residency", "decisions", "--model", "coder/0", "-o", "json")
		if err != nil {
			return err
		}
		var ds []struct{ Action, Trigger, Reason string }
		if err := json.Unmarshal([]byte(out), &ds); err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		for _, d := range ds {
			if d.Action == "best-effort" && d.Trigger == "pressure" && strings.HasPrefix(d.Reason, "best-effort: coder/0: needs ") {
				return nil
			}
		}
		return fmt.Errorf("no best-effort decision for coder/0 with trigger pressure:\n%s", out)
	})
	ps := gpuplane(t, n, "ps")
	t.Logf("gpuplane ps:\n%s", ps)
	if !regexp.MustCompile(`(?m)^coder/0\s+be\s+0\s+\S+ \(best-effort\)`).MatchString(ps) || strings.Contains(lineOr(ps, "chat/0"), "best-effort") {
		t.Errorf("gpuplane ps: want coder/0 marked best-effort, chat/0 not")
	}
	if v := metric(t, n, "gpuplane_model_best_effort", `model="coder"`, `node="be"`); v != 1 {
		t.Errorf("gpuplane_model_best_effort{model=coder} = %v, want 1", v)
	}
	if v := metric(t, n, "gpuplane_model_best_effort", `model="chat"`); v != 0 {
		t.Errorf("gpuplane_model_best_effort{model=chat} = %v, want 0", v)
	}

	// The dashboard marks the coder best-effort, with why on hover.
	t.Run("dashboard", func(t *testing.T) {
		ctx := browser(t, 1280, 800)
		if err := chromedp.Do(ctx, chromedp.Navigate(n.url()), chromedp.WaitVisible(`tr[data-model="coder"]`)); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, 15*time.Second, "coder marked best-effort on the dashboard", func() error {
			var rows map[string]struct{ BE, Text, Title string }
			err := evaluate(ctx, `Object.fromEntries([...document.querySelectorAll('tr[data-model]')].map(r => {
  const c = r.querySelectorAll('td')[1]; const s = c.querySelector('.besteffort');
  return [r.dataset.model, {be: c.dataset.bestEffort || "", text: c.textContent, title: s ? s.title : ""}]; }))`, &rows)
			if err != nil {
				return err
			}
			c, chat := rows["coder"], rows["chat"]
			if c.BE != "true" || !strings.Contains(c.Text, "best-effort") || !strings.Contains(c.Title, "coder/0: needs ") || chat.BE != "false" || strings.Contains(chat.Text, "best-effort") {
				return fmt.Errorf("rows %+v: want coder marked best-effort with why, chat not", rows)
			}
			return nil
		})
		screenshot(t, ctx, shots(t), "besteffort")
	})

	// 20 s more (10 minutes of the controller's clock, two best-effort
	// waits): chat stays served,
	// neither the coder nor vision is starved.
	o0 := [3]int64{offered[0].Load(), offered[1].Load(), offered[2].Load()}
	s0 := [3]int64{served[0].Load(), served[1].Load(), served[2].Load()}
	time.Sleep(20 * time.Second)
	for i, m := range models {
		o, s := offered[i].Load()-o0[i], served[i].Load()-s0[i]
		t.Logf("%s: %d of %d requests served in 20 s", m, s, o)
		min := 0.1
		if m == "chat" {
			min = 0.8
		}
		if float64(s) < min*float64(o) || s == 0 {
			t.Errorf("%s: %d of %d requests served, want at least %.0f%%", m, s, o, min*100)
		}
	}

	// The node's record replayed through the simulator: its controller
	// chooses the same best-effort models as the live one.
	var replay struct {
		Chosen     []string `json:"chosenBestEffort"`
		Live       []string `json:"liveBestEffort"`
		SameChoice bool     `json:"sameChoice"`
	}
	out = gpuplane(t, n, "simulate", "serve", "--from-node", "be", "-o", "json")
	if err := json.Unmarshal([]byte(out), &replay); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	t.Logf("replay: %s", lineOr(gpuplane(t, n, "simulate", "serve", "--from-node", "be"), "protected set"))
	if !replay.SameChoice || len(replay.Chosen) != 1 || !strings.HasPrefix(replay.Chosen[0], "coder: needs ") {
		t.Errorf("replay: chose %q, the live agent %q; want the coder alone in both", replay.Chosen, replay.Live)
	}

	// The operator's choice: the coder with chat (warm, always protected)
	// does not fit the card, refused with the numbers. Vision, the
	// controller's own set now pinned by the operator: the coder stays
	// best-effort, by the operator's choice.
	if _, err := tryCLI(n, "residency", "protect", "coder"); err == nil || !strings.Contains(err.Error(), "cannot hold chat/0 (warm") {
		t.Errorf("protect coder: %v, want a refusal naming what the card cannot hold", err)
	}
	out = gpuplane(t, n, "residency", "protect", "vision")
	t.Logf("residency protect vision:\n%s", out)
	if !strings.Contains(out, "protects vision/0") || !strings.Contains(out, "coder/0: needs ") {
		t.Errorf("residency protect vision: want the card protecting vision/0 and coder/0 best-effort with why:\n%s", out)
	}
	be, err := plan()
	if err != nil {
		t.Fatal(err)
	}
	if be["vision/0"] != "" || !strings.Contains(be["coder/0"], "not in the operator's choice (anonymous)") {
		t.Errorf("after protect vision: best-effort %q, want coder/0 alone, by the operator's choice", be)
	}
	testutil.Eventually(t, 10*time.Second, "coder's decision by the operator", func() error {
		out, err := tryCLI(n, "residency", "decisions", "--model", "coder/0")
		if err != nil {
			return err
		}
		if !regexp.MustCompile(`best-effort\s+coder/0\s+operator \(anonymous\)\s+best-effort: coder/0: needs .*not in the operator's choice \(anonymous\)`).MatchString(out) {
			return fmt.Errorf("decisions for coder/0: no best-effort decision by the operator:\n%s", out)
		}
		return nil
	})
	for _, bad := range []struct {
		args []string
		want string
	}{
		{[]string{"nope"}, `model "nope" not found`},
		{[]string{"coder/0"}, `"coder/0" is not a deployment name`},
		{[]string{"--clear", "coder"}, "--clear takes no MODEL"},
		{nil, "name at least one MODEL to protect, or give --clear"},
	} {
		if _, err := tryCLI(n, append([]string{"residency", "protect"}, bad.args...)...); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("protect %q: %v, want %q", bad.args, err, bad.want)
		}
	}
	gpuplane(t, n, "residency", "protect", "--clear")
	testutil.Eventually(t, 30*time.Second, "the controller's choice again", func() error {
		be, err := plan()
		if err != nil {
			return err
		}
		if be["coder/0"] == "" || be["vision/0"] != "" || strings.Contains(be["coder/0"], "operator") {
			return fmt.Errorf("best-effort: %q", be)
		}
		return nil
	})
	halt()
}

// lineOr is the first line of out that contains s, or "".
func lineOr(out, s string) string {
	l, _ := lineOf(out, s)
	return l
}
