package e2e

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/internal/testutil"
)

// residencyAgent starts a dev agent (l4=2) with flags on a fresh data dir,
// and kills the sim engines of models when the test ends (a killed agent
// leaves its engines behind).
func residencyAgent(t *testing.T, models []string, flags ...string) *agentProc {
	t.Helper()
	requireBinary(t)
	dataDir := filepath.Join(t.TempDir(), "data")
	a := newAgent(t, dataDir)
	a.flags = flags
	a.start()
	t.Cleanup(func() {
		a.kill()
		for _, m := range models {
			for _, pid := range enginePIDs(t, dataDir, m) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	return a
}

// replicaRows returns `replicas list` by model.
func replicaRows(t *testing.T, a *agentProc) map[string]map[string]string {
	t.Helper()
	out := map[string]map[string]string{}
	for _, r := range parseTable(t, mustGpuplane(t, a.url(), "replicas", "list")) {
		out[r["MODEL"]] = r
	}
	return out
}

// ask sends one chat completion for model to endpoint, as a user would with
// curl, and fails the test unless it is answered 200 with the sim's reply.
func ask(t *testing.T, endpoint, model string) {
	t.Helper()
	body := `{"model":"` + model + `","messages":[{"role":"user","content":"hello"}],"max_tokens":4}`
	client := &http.Client{Timeout: 4 * time.Minute}
	resp, err := client.Post(endpoint+"/v1/chat/completions", "application/json", bytes.NewBufferString(body))
	if err != nil {
		t.Fatalf("POST %s/v1/chat/completions (%s): %v", endpoint, model, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var answer struct {
		Model   string `json:"model"`
		Choices []struct {
			Message struct{ Content string } `json:"message"`
		} `json:"choices"`
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal(data, &answer) != nil || answer.Model != model || len(answer.Choices) != 1 {
		t.Fatalf("POST %s/v1/chat/completions (%s): %s %s", endpoint, model, resp.Status, data)
	}
}

// TestOnDemandModelsShareOneCard checks onDemand residency through the
// real binary on `agent --dev` (l4=2): three onDemand sim models whose
// shares sum to 160 % of a card are all placed on one card of a shared
// accelerator with maxModels 3, reserving nothing; none is loaded until
// it is requested; a request sent straight to each replica's ENDPOINT in
// turn is answered, the node loading the model on demand and putting
// another to sleep to make room; `replicas list` shows the residency
// change, the card never holds more than it has, and `audit log --resource
// model/NAME` shows the transitions with the reasons that decided them.
func TestOnDemandModelsShareOneCard(t *testing.T) {
	names := []string{"chat", "embed", "asr"}
	a := residencyAgent(t, names)
	shares := map[string]string{"chat": "60", "embed": "55", "asr": "45"}
	mustGpuplane(t, a.url(), "accelerators", "create", "home", "--device", "l4", "--tenancy", "shared", "--max-models", "3")
	for _, m := range names {
		mustGpuplane(t, a.url(), "models", "deploy", m, "--accelerator", "home", "--model", "/models/"+m, "--engine", "sim",
			"--memory-percent", shares[m], "--residency", "onDemand")
	}
	// Placed, Cold, each with an endpoint (the node's front): nothing is
	// loaded before it is requested.
	var rows map[string]map[string]string
	testutil.Until(t, 90*time.Second, "three Cold replicas with endpoints", func() bool {
		rows = replicaRows(t, a)
		n := 0
		for _, r := range rows {
			if r["STATE"] == "Placed" && r["RESIDENCY"] == "Cold" && strings.HasPrefix(r["ENDPOINT"], "http://") {
				n++
			}
		}
		return n == 3
	})
	for _, m := range names {
		if r := rows[m]; r["CARDS"] != "0" {
			t.Fatalf("replica %s not on card 0: %v", m, r)
		}
		if pids := enginePIDs(t, a.dataDir, m); len(pids) != 0 {
			t.Fatalf("%s has engine processes %v before any request", m, pids)
		}
	}
	list := parseTable(t, mustGpuplane(t, a.url(), "models", "list"))
	for _, r := range list {
		if r["RESIDENCY"] != "onDemand" || r["PRIORITY"] != "standard" {
			t.Errorf("models list row %v: want RESIDENCY onDemand, PRIORITY standard", r)
		}
	}

	for i, m := range names {
		ask(t, rows[m]["ENDPOINT"], m)
		now := replicaRows(t, a)
		if now[m]["RESIDENCY"] != "Resident" || now[m]["ENDPOINT"] != rows[m]["ENDPOINT"] {
			t.Errorf("after a request, %s is %v; want Resident at the same endpoint %s", m, now[m], rows[m]["ENDPOINT"])
		}
		if i > 0 {
			// Any two of the three exceed the card: the previous one
			// made room (asleep or unloaded).
			prev := names[i-1]
			if res := now[prev]["RESIDENCY"]; res != "Sleeping" && res != "Cold" {
				t.Errorf("after a request for %s, %s is %s; want Sleeping or Cold: %v", m, prev, res, now)
			}
		}
		cards := parseTable(t, detailPart(t, mustGpuplane(t, a.url(), "devices", "get", "l4"), "Cards"))
		if c := cards[0]; c["ACCELERATOR"] != "home" || c["RESERVED"] != "0Mi" || mib(t, c["USED"])+mib(t, c["SLEEPING"])+mib(t, c["FREE"]) != mib(t, c["MEMORY"]) {
			t.Errorf("card 0 after a request for %s: %v; want bound to home, nothing reserved, USED + SLEEPING + FREE = MEMORY", m, c)
		}
		if c := cards[1]; c["ACCELERATOR"] != "-" || c["REPLICAS"] != "-" {
			t.Errorf("card 1: %v, want unbound", c)
		}
	}

	log := mustGpuplane(t, a.url(), "audit", "log", "--resource", "model/chat")
	for _, want := range []string{"ApplyModel chat", "placed, cold (not loaded: its node loads it on demand)",
		"placed, loading (load chat/0: 1 request waiting;", "running, resident (engine running: loaded on demand)",
		"running, draining (sleep chat/0: ", "running, sleeping"} {
		if !strings.Contains(log, want) {
			t.Errorf("audit log --resource model/chat lacks %q:\n%s", want, log)
		}
	}
	// The sleep's reason gives the numbers that decided it.
	if re := regexp.MustCompile(`draining \(sleep chat/0: [^;]*value[^;]*[0-9]+\.[0-9]{2}[^;]*; frees [0-9.]+Gi, embed/0 needs [0-9.]+Gi`); !re.MatchString(log) {
		t.Errorf("audit log --resource model/chat: the sleep's reason lacks its numbers (%s):\n%s", re, log)
	}
	if strings.Contains(log, "embed") && !strings.Contains(log, "embed/0 needs") {
		t.Errorf("audit log --resource model/chat shows another model's entries:\n%s", log)
	}
	// The sleeping model wakes for its next request: a wake, not a cold
	// load.
	ask(t, rows["chat"]["ENDPOINT"], "chat")
	log = mustGpuplane(t, a.url(), "audit", "log", "--resource", "model/chat")
	if !strings.Contains(log, "running, waking (wake chat/0:") {
		t.Errorf("audit log --resource model/chat lacks the wake:\n%s", log)
	}
	// The controller's own ledger check found nothing either.
	resp, err := http.Get(a.url() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(metrics), "\ngpuplane_residency_violations 0\n") {
		t.Errorf("/metrics: want gpuplane_residency_violations 0:\n%s", metrics)
	}
}

// mib parses a `devices get` memory column ("12668Mi").
func mib(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(strings.TrimSuffix(s, "Mi"))
	if err != nil {
		t.Fatalf("memory column %q: %v", s, err)
	}
	return n
}

// TestPinnedModelIsNeverUnloaded: a pinned model shares the card with two
// onDemand models that cannot be resident together; requests that swap
// them never touch the pinned model's engine (same process, Resident
// throughout, no residency transition but its load).
func TestPinnedModelIsNeverUnloaded(t *testing.T) {
	names := []string{"base", "left", "right"}
	a := residencyAgent(t, names)
	mustGpuplane(t, a.url(), "accelerators", "create", "home", "--device", "l4", "--tenancy", "shared", "--max-models", "3")
	mustGpuplane(t, a.url(), "models", "deploy", "base", "--accelerator", "home", "--model", "/models/base", "--engine", "sim",
		"--memory-percent", "30")
	for _, m := range names[1:] {
		mustGpuplane(t, a.url(), "models", "deploy", m, "--accelerator", "home", "--model", "/models/"+m, "--engine", "sim",
			"--memory-percent", "45", "--residency", "onDemand")
	}
	var rows map[string]map[string]string
	testutil.Until(t, 90*time.Second, "base Resident, left and right Cold", func() bool {
		rows = replicaRows(t, a)
		return rows["base"]["RESIDENCY"] == "Resident" && rows["left"]["RESIDENCY"] == "Cold" && rows["right"]["RESIDENCY"] == "Cold"
	})
	pids := enginePIDs(t, a.dataDir, "base")
	if len(pids) != 1 {
		t.Fatalf("base engines: %v", pids)
	}
	for _, m := range []string{"left", "right", "left"} {
		ask(t, rows[m]["ENDPOINT"], m)
		now := replicaRows(t, a)
		if now[m]["RESIDENCY"] != "Resident" || now["base"]["RESIDENCY"] != "Resident" || now["base"]["STATE"] != "Running" {
			t.Errorf("after a request for %s: %v; want %s and base Resident", m, now, m)
		}
		// 30 % pinned leaves 65 % of the 95 % usable: left and right
		// (45 % each) take turns.
		other := map[string]string{"left": "right", "right": "left"}[m]
		if now[other]["RESIDENCY"] == "Resident" {
			t.Errorf("after a request for %s, %s is still Resident: %v", m, other, now)
		}
		ask(t, rows["base"]["ENDPOINT"], "base")
	}
	if now := enginePIDs(t, a.dataDir, "base"); len(now) != 1 || now[0] != pids[0] {
		t.Errorf("base engine was %v, now %v: the pinned engine was restarted", pids, now)
	}
	log := mustGpuplane(t, a.url(), "audit", "log", "--resource", "model/base")
	for _, unwanted := range []string{"draining", "sleeping", "cold"} {
		if strings.Contains(log, unwanted) {
			t.Errorf("audit log --resource model/base shows %q:\n%s", unwanted, log)
		}
	}
}

// TestResidencyAdvise: with `agent --residency advise` every onDemand model
// is loaded when placed, as without a controller, and requests change
// nothing on the card, but the controller records what it would have done
// (the agent logs each decision; the journal holds them for the API).
func TestResidencyAdvise(t *testing.T) {
	names := []string{"chat", "embed", "asr"}
	a := residencyAgent(t, names, "--residency", "advise")
	shares := map[string]string{"chat": "60", "embed": "55", "asr": "45"}
	mustGpuplane(t, a.url(), "accelerators", "create", "home", "--device", "l4", "--tenancy", "shared", "--max-models", "3")
	for _, m := range names {
		mustGpuplane(t, a.url(), "models", "deploy", m, "--accelerator", "home", "--model", "/models/"+m, "--engine", "sim",
			"--memory-percent", shares[m], "--residency", "onDemand")
	}
	var rows map[string]map[string]string
	allResident := func() bool {
		rows = replicaRows(t, a)
		n := 0
		for _, r := range rows {
			if r["STATE"] == "Running" && r["RESIDENCY"] == "Resident" {
				n++
			}
		}
		return n == 3
	}
	testutil.Until(t, 90*time.Second, "three Resident replicas", allResident)
	pids := map[string][]int{}
	for _, m := range names {
		pids[m] = enginePIDs(t, a.dataDir, m)
	}
	for _, m := range names {
		ask(t, rows[m]["ENDPOINT"], m)
	}
	if !allResident() {
		t.Errorf("advise changed the card: %v", rows)
	}
	for _, m := range names {
		if now := enginePIDs(t, a.dataDir, m); len(now) != 1 || now[0] != pids[m][0] {
			t.Errorf("%s engine was %v, now %v", m, pids[m], now)
		}
	}
	testutil.Until(t, 30*time.Second, "an advised load in the agent's log", func() bool {
		return strings.Contains(a.out.String(), `msg="residency decision" card=0 action=load model=chat/0 trigger=request advised=true`)
	})
	if log := mustGpuplane(t, a.url(), "audit", "log", "--resource", "model/chat"); strings.Contains(log, "sleeping") || strings.Contains(log, "load chat/0") {
		t.Errorf("advise reported a transition it only advised:\n%s", log)
	}
}

// TestOnDemandEndpointSurvivesAgentRestart: after a kill -9 of the agent,
// an onDemand replica keeps its endpoint, a request there is answered, and
// the replica never has two engines.
func TestOnDemandEndpointSurvivesAgentRestart(t *testing.T) {
	a := residencyAgent(t, []string{"chat"})
	mustGpuplane(t, a.url(), "accelerators", "create", "home", "--device", "l4", "--tenancy", "shared", "--max-models", "3")
	mustGpuplane(t, a.url(), "models", "deploy", "chat", "--accelerator", "home", "--model", "/models/chat", "--engine", "sim",
		"--memory-percent", "60", "--residency", "onDemand")
	var before map[string]string
	testutil.Until(t, 90*time.Second, "chat Cold with an endpoint", func() bool {
		before = replicaRows(t, a)["chat"]
		return before["RESIDENCY"] == "Cold" && strings.HasPrefix(before["ENDPOINT"], "http://")
	})
	ask(t, before["ENDPOINT"], "chat")

	a.kill()
	a.start()
	// The node serves the endpoint again once its executor has caught up.
	testutil.Until(t, 60*time.Second, "the endpoint to be served again", func() bool {
		resp, err := http.Get(before["ENDPOINT"] + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	ask(t, before["ENDPOINT"], "chat")
	after := replicaRows(t, a)["chat"]
	if after["ENDPOINT"] != before["ENDPOINT"] || after["RESIDENCY"] != "Resident" {
		t.Errorf("after the agent restarted, chat is %v; want Resident at %s", after, before["ENDPOINT"])
	}
	if pids := enginePIDs(t, a.dataDir, "chat"); len(pids) != 1 {
		t.Errorf("chat has engines %v, want exactly one", pids)
	}
}
