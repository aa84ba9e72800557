package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/cmd/gpuplane/agent"
	"github.com/gpuplane/gpuplane/internal/testutil"
	"github.com/gpuplane/gpuplane/node/residency"
)

const gi = int64(1) << 30

// cardDriver runs a real residency controller for one card in virtual time
// and publishes it to an agent's journal, as the node's residency manager
// does: the decisions the commands show are the controller's own.
type cardDriver struct {
	t       *testing.T
	clock   *residency.ManualClock
	c       *residency.Controller
	journal *residency.Journal
	seen    int
	mode    string
	sizes   map[residency.ModelID]int64
}

func newCardDriver(t *testing.T, j *residency.Journal, card string, mode residency.Mode) *cardDriver {
	t.Helper()
	clock := residency.NewManualClock(time.Now())
	c, err := residency.New(residency.Config{Card: card, Memory: 24 * gi, Mode: mode}, clock)
	if err != nil {
		t.Fatal(err)
	}
	name := "auto"
	if mode == residency.Advise {
		name = "advise"
	}
	return &cardDriver{t: t, clock: clock, c: c, journal: j, mode: name, sizes: map[residency.ModelID]int64{}}
}

// deploy adds an onDemand sim model of size bytes that sleeps (vLLM-style).
func (d *cardDriver) deploy(model string, size int64) {
	d.t.Helper()
	d.sizes[residency.ModelID(model)] = size
	d.handle(residency.DeploymentAdded{Deployment: residency.Deployment{
		Model: residency.ModelID(model), Residency: residency.OnDemand, Priority: residency.Standard,
		Share: size, Footprint: size, Residual: size / 20, CanSleep: true,
		LoadTime: 20 * time.Second, WakeTime: 2 * time.Second, Engine: "sim", Device: "l4",
	}})
}

// handle feeds ev and carries out what the controller asks, the way the
// node's engines would: a load takes 15s of virtual time and the engine then
// holds 95% of its size (as NVML would report), a sleep, wake or stop
// completes at once. Then it publishes to the journal.
func (d *cardDriver) handle(ev residency.Event) {
	d.t.Helper()
	queue := []residency.Event{ev}
	for len(queue) > 0 {
		out := d.c.Handle(queue[0])
		queue = queue[1:]
		if out.Err != nil {
			d.t.Fatal(out.Err)
		}
		if len(out.Violations) > 0 {
			d.t.Fatalf("ledger violations: %v", out.Violations)
		}
		for _, a := range out.Actions {
			switch a.Kind {
			case residency.ActLoad, residency.ActPrewarm:
				d.clock.Advance(15 * time.Second)
				queue = append(queue, residency.LoadDone{Model: a.Model},
					residency.MemorySample{Model: a.Model, Bytes: d.sizes[a.Model] / 20 * 19})
			case residency.ActWake:
				queue = append(queue, residency.WakeDone{Model: a.Model})
			case residency.ActSleep:
				queue = append(queue, residency.SleepDone{Model: a.Model})
			case residency.ActEvict, residency.ActUnload:
				queue = append(queue, residency.Unloaded{Model: a.Model})
			}
		}
	}
	d.publish()
}

// serve sends one request for model that the engine answers: 300 tokens in 2s.
func (d *cardDriver) serve(model string) {
	d.t.Helper()
	m := residency.ModelID(model)
	d.handle(residency.RequestArrived{Model: m})
	d.handle(residency.RequestFinished{Model: m, Tokens: 300, Elapsed: 2 * time.Second})
}

func (d *cardDriver) publish() {
	d.seen = d.journal.Sync(d.c, d.seen)
	d.journal.SetCard(residency.CardView{
		Card: d.c.Ledger().Card, Mode: d.mode, PinnedOnly: d.c.PinnedOnly(), Violations: d.c.ViolationCount(),
		Usable: d.c.Usable(), Plan: d.c.Plan(), Ledger: d.c.Ledger(),
	}, d.c.Profiles())
}

// decision finds the controller's own decision of kind for model.
func (d *cardDriver) decision(kind residency.ActionKind, model string) residency.Decision {
	d.t.Helper()
	for _, dec := range d.c.Decisions() {
		if dec.Action == kind && string(dec.Model) == model {
			return dec
		}
	}
	d.t.Fatalf("the controller decided no %s of %s: %+v", kind, model, d.c.Decisions())
	return residency.Decision{}
}

// startResidencyAgent runs a real dev agent and returns it with a function
// that runs the CLI against it.
func startResidencyAgent(t *testing.T, cfg agent.Config) (*agent.Agent, func(args ...string) (string, string, int)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg.DataDir, cfg.APIPort, cfg.RaftPort = t.TempDir(), 0, freePort(t)
	if cfg.GossipPort == 0 {
		cfg.GossipPort = freePort(t)
	}
	if cfg.SimGPUs == "" {
		cfg.SimGPUs = "l4=1"
	}
	a, err := agent.Start(ctx, cfg)
	if err != nil {
		t.Fatalf("start agent: %v", err)
	}
	t.Cleanup(func() { a.Close() })
	return a, func(args ...string) (string, string, int) {
		var out, errb bytes.Buffer
		code := Run(context.Background(), append([]string{"--addr", a.APIURL()}, args...), strings.NewReader(""), &out, &errb)
		return out.String(), errb.String(), code
	}
}

// lineWith is the first line of out containing every one of parts.
func lineWith(out string, parts ...string) (string, bool) {
	for line := range strings.SplitSeq(out, "\n") {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			return line, true
		}
	}
	return "", false
}

// followDecisions starts `residency decisions --follow` with args and
// returns its output and a function that stops it and returns its exit code.
func followDecisions(url string, args ...string) (*lockedBuffer, func() int) {
	ctx, cancel := context.WithCancel(context.Background())
	out, errb := &lockedBuffer{}, &lockedBuffer{}
	done := make(chan int, 1)
	go func() {
		done <- Run(ctx, append([]string{"--addr", url, "residency", "decisions", "--follow"}, args...), strings.NewReader(""), out, errb)
	}()
	return out, func() int {
		cancel()
		code := <-done
		if code != 0 {
			fmt.Fprint(out, errb.String())
		}
		return code
	}
}

// TestLiveResidencyCommands: a real controller decides loads and an eviction
// on a dev agent's card; decisions, plan and profiles show them with the
// numbers that decided them, filters narrow them, and --follow receives a
// decision taken after it started.
func TestLiveResidencyCommands(t *testing.T) {
	a, run := startResidencyAgent(t, agent.Config{Dev: true, NodeName: "live"})

	// Before any controller runs, every command answers with nothing.
	if out, errOut, code := run("residency", "decisions"); code != 0 || strings.TrimSpace(out) != strings.Join(decisionHeader, "   ") {
		t.Fatalf("decisions with no controller: exit %d, %q %s", code, out, errOut)
	}
	// --follow prints its header at once, before any decision.
	quiet, stopQuiet := followDecisions(a.APIURL())
	testutil.Until(t, 30*time.Second, "the follower's header with no decision yet", func() bool {
		return strings.HasPrefix(quiet.String(), strings.Join(decisionHeader, "  ")+"\n")
	})
	if code := stopQuiet(); code != 0 {
		t.Fatalf("decisions --follow with no decision: exit %d: %s", code, quiet.String())
	}

	// Two 10Gi models fill most of a 24Gi card; after the minimum residency
	// a request for a third makes the controller take memory from one.
	d := newCardDriver(t, a.ResidencyJournal(), "gpu0", residency.Act)
	for _, m := range []string{"chat", "coder", "embed"} {
		d.deploy(m, 10*gi)
	}
	for range 3 {
		d.serve("chat")
		d.clock.Advance(20 * time.Second)
	}
	d.serve("coder")
	d.clock.Advance(2 * time.Minute)
	d.serve("embed")

	load := d.decision(residency.ActLoad, "chat")
	var room residency.Decision
	for _, dec := range d.c.Decisions() {
		if dec.For == "embed" {
			room = dec
			break
		}
	}
	if room.Action == 0 {
		t.Fatalf("the controller made no room for embed: %+v", d.c.Decisions())
	}
	t.Logf("room for embed: %s %s: %s", room.Action, room.Model, room.Reason)

	out, errOut, code := run("residency", "decisions")
	if code != 0 {
		t.Fatalf("decisions: exit %d, %s", code, errOut)
	}
	for _, want := range []residency.Decision{load, room} {
		line, ok := lineWith(out, " "+want.Action.String()+" ", " "+string(want.Model)+" ", " "+want.Trigger.String()+" ", want.Reason)
		if !ok || !strings.Contains(line, " live ") || !strings.Contains(line, " gpu0 ") {
			t.Errorf("decisions lack %s %s (%s) %q on live/gpu0:\n%s", want.Action, want.Model, want.Trigger, want.Reason, out)
		}
	}
	if !strings.ContainsAny(room.Reason, "0123456789") {
		t.Errorf("the reason for making room has no numbers: %q", room.Reason)
	}

	// --model keeps decisions about the model or made for it.
	out, _, _ = run("residency", "decisions", "--model", "embed")
	if _, ok := lineWith(out, room.Reason); !ok {
		t.Errorf("--model embed lacks the decision made for embed:\n%s", out)
	}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n")[1:] {
		if !strings.Contains(line, " embed ") && !strings.Contains(line, room.Reason) {
			t.Errorf("--model embed shows an unrelated decision: %s", line)
		}
	}

	// -o json carries the inputs.
	out, _, _ = run("residency", "decisions", "--model", "embed", "-o", "json")
	var ds []struct {
		Seq                                            uint64
		Node, Action, Model, Trigger, ForModel, Reason string
		Inputs                                         struct{ Bytes, NeedBytes int64 }
	}
	if err := json.Unmarshal([]byte(out), &ds); err != nil {
		t.Fatalf("decisions -o json: %v\n%s", err, out)
	}
	found := false
	for _, x := range ds {
		if x.ForModel == "embed" && x.Reason == room.Reason {
			found = true
			if x.Inputs.Bytes != room.Inputs.Bytes || x.Inputs.Bytes == 0 || x.Node != "live" || x.Seq == 0 {
				t.Errorf("json decision %+v: want bytes %d on node live", x, room.Inputs.Bytes)
			}
		}
	}
	if !found {
		t.Errorf("decisions -o json lacks the decision for embed:\n%s", out)
	}

	// The plan: every model with its state, tier, rate and the value.
	out, errOut, code = run("residency", "plan")
	if code != 0 {
		t.Fatalf("plan: exit %d, %s", code, errOut)
	}
	for _, e := range d.c.Plan() {
		line, ok := lineWith(out, " "+string(e.Model)+" ", " "+e.State.String()+" ", " "+e.Tier+" ",
			fmt.Sprintf(" %.2f/min ", e.Rate), fmt.Sprintf(" %.2f ", e.Value))
		if !ok || !strings.HasPrefix(line, "live ") {
			t.Errorf("plan lacks %s %s %s rate %.2f value %.2f:\n%s", e.Model, e.State, e.Tier, e.Rate, e.Value, out)
		}
	}
	// chat had three requests 35s apart: its next one is predicted.
	if line, _ := lineWith(out, " chat "); !strings.Contains(line, " ago ") && !strings.Contains(line, " in ") {
		t.Errorf("plan: chat has no predicted next request:\n%s", out)
	}

	// Profiles: the loads took 15s of virtual time, the engine held 9.5Gi,
	// requests ran at 150 tokens/s.
	out, errOut, code = run("residency", "profiles")
	if code != 0 {
		t.Fatalf("profiles: exit %d, %s", code, errOut)
	}
	if _, ok := lineWith(out, "live ", " chat ", " sim ", " l4 ", " 15s ", " 9.5Gi ", " 150.0 "); !ok {
		t.Errorf("profiles lack chat loaded in 15s, 9.5Gi, 150 tokens/s:\n%s", out)
	}

	// --follow prints what is there, then a decision taken after it started.
	follow, stop := followDecisions(a.APIURL(), "--model", "coder")
	testutil.Until(t, 30*time.Second, "the follower to print coder's load", func() bool {
		_, ok := lineWith(follow.String(), " load ", " coder ")
		return ok
	})
	before := len(d.c.Decisions())
	d.clock.Advance(10 * time.Minute)
	d.serve("coder")
	if len(d.c.Decisions()) == before {
		t.Fatal("the controller decided nothing for coder's new request")
	}
	latest := d.c.Decisions()[len(d.c.Decisions())-1]
	testutil.Until(t, 30*time.Second, "the follower to print "+latest.Reason, func() bool {
		return strings.Contains(follow.String(), latest.Reason)
	})
	if code := stop(); code != 0 {
		t.Errorf("decisions --follow exit %d: %s", code, follow.String())
	}
}

// TestLiveResidencyAdvised: in advise mode the decisions are marked.
func TestLiveResidencyAdvised(t *testing.T) {
	a, run := startResidencyAgent(t, agent.Config{Dev: true, NodeName: "adv"})
	d := newCardDriver(t, a.ResidencyJournal(), "gpu0", residency.Advise)
	d.deploy("chat", 10*gi)
	d.handle(residency.RequestArrived{Model: "chat"})
	out, _, _ := run("residency", "decisions")
	if _, ok := lineWith(out, " load (advised) ", " chat ", " request "); !ok {
		t.Errorf("advised load not marked:\n%s", out)
	}
	out, _, _ = run("residency", "plan")
	if _, ok := lineWith(out, " chat ", " Cold ", " disk "); !ok {
		t.Errorf("advise mode: chat is not shown still cold:\n%s", out)
	}
}

// TestLiveResidencyACL: with ACLs on, an auditor's token lists residency;
// no token is refused. A tenant's read token lists the decisions about
// deployments, without the adapter decisions (their reasons name other
// tenants' adapters) or the name of the operator who asked; the plan and
// profiles are refused it.
func TestLiveResidencyACL(t *testing.T) {
	a, run := startResidencyAgent(t, agent.Config{Dev: true, NodeName: "acl", SecurityConfig: agent.SecurityConfig{ACL: true}})
	d := newCardDriver(t, a.ResidencyJournal(), "gpu0", residency.Act)
	d.deploy("chat", 10*gi)
	d.serve("chat")
	// A load of an adapter (beta's, say: the journal does not know) and an
	// operator's unload.
	d.handle(residency.AdaptersChanged{Model: "chat", MaxOnCard: 1, MaxInHost: 1,
		Adapters: []residency.Adapter{{Name: "beta-secret", Bytes: gi / 4, LoadTime: time.Second}}})
	d.handle(residency.AdapterRequested{Model: "chat", Adapter: "beta-secret"})
	d.handle(residency.AdapterFinished{Model: "chat", Adapter: "beta-secret"})
	d.handle(residency.OperatorUnload{Model: "chat", By: "root-op"})

	bootOut, errOut, code := run("acl", "bootstrap", "--name", "root")
	if code != 0 {
		t.Fatalf("bootstrap: %s%s", bootOut, errOut)
	}
	root := strings.TrimSpace(strings.SplitN(strings.SplitN(bootOut, "secret: ", 2)[1], "\n", 2)[0])
	readOut, errOut, code := run("--token", root, "acl", "token", "create", "--name", "viewer", "--role", "auditor")
	if code != 0 {
		t.Fatalf("create auditor token: %s%s", readOut, errOut)
	}
	viewer := strings.TrimSpace(strings.SplitN(strings.SplitN(readOut, "secret: ", 2)[1], "\n", 2)[0])
	keyOut, errOut, code := run("--token", root, "acl", "token", "create", "--name", "acme", "--role", "read")
	if code != 0 {
		t.Fatalf("create read token: %s%s", keyOut, errOut)
	}
	key := strings.TrimSpace(strings.SplitN(strings.SplitN(keyOut, "secret: ", 2)[1], "\n", 2)[0])

	for _, cmd := range [][]string{{"residency", "decisions"}, {"residency", "plan"}, {"residency", "profiles"}} {
		if _, errOut, code := run(cmd...); code != 1 || !strings.Contains(errOut, "ACLs on") {
			t.Errorf("%v without a token: exit %d, %s", cmd, code, errOut)
		}
		out, errOut, code := run(append([]string{"--token", viewer}, cmd...)...)
		if code != 0 || !strings.Contains(out, " chat ") {
			t.Errorf("%v with an auditor token: exit %d, %s%s", cmd, code, out, errOut)
		}
		if cmd[1] == "decisions" {
			for _, want := range []string{"beta-secret", "root-op"} {
				if !strings.Contains(out, want) {
					t.Errorf("%v with an auditor token:\n%s\nwant %q named", cmd, out, want)
				}
			}
			// A read token is a tenant's key: the decisions about the
			// deployment, none about an adapter, no operator named.
			out, errOut, code := run(append([]string{"--token", key}, cmd...)...)
			if code != 0 || !strings.Contains(out, " chat ") || !strings.Contains(out, "asked by the operator") {
				t.Errorf("%v with a tenant's read token: exit %d, %s%s; want chat's decisions", cmd, code, out, errOut)
			}
			for _, not := range []string{"beta-secret", "root-op", "adapter"} {
				if strings.Contains(out, not) {
					t.Errorf("%v with a tenant's read token:\n%s\nnames %q", cmd, out, not)
				}
			}
			continue
		}
		// The plan and profiles show every card's memory account: not a
		// tenant's to read.
		if _, errOut, code := run(append([]string{"--token", key}, cmd...)...); code != 1 || !strings.Contains(errOut, "auditor or operator role") {
			t.Errorf("%v with a tenant's read token: exit %d, %s", cmd, code, errOut)
		}
	}
}

// TestLiveResidencyTwoNodes: a dev server and a client node that joined it;
// any node answers for both, --node narrows to one, and --follow on one node
// receives the other node's new decisions.
func TestLiveResidencyTwoNodes(t *testing.T) {
	gossip := freePort(t)
	a1, run1 := startResidencyAgent(t, agent.Config{Dev: true, NodeName: "n1", GossipPort: gossip})
	a2, run2 := startResidencyAgent(t, agent.Config{NodeName: "n2", Bind: "127.0.0.1",
		Join: []string{fmt.Sprintf("127.0.0.1:%d", gossip)}})
	select {
	case <-a2.Registered():
	case <-time.After(60 * time.Second):
		t.Fatal("n2 did not register with n1")
	}
	testutil.Until(t, 30*time.Second, "n1 to know n2's address", func() bool {
		out, _, _ := run1("nodes", "list")
		_, ok := lineWith(out, "n2 ")
		return ok
	})

	d1 := newCardDriver(t, a1.ResidencyJournal(), "gpu0", residency.Act)
	d1.deploy("chat", 10*gi)
	d1.serve("chat")
	d2 := newCardDriver(t, a2.ResidencyJournal(), "gpu0", residency.Act)
	d2.deploy("coder", 10*gi)
	d2.serve("coder")
	chat, coder := d1.decision(residency.ActLoad, "chat"), d2.decision(residency.ActLoad, "coder")

	for name, run := range map[string]func(...string) (string, string, int){"n1": run1, "n2": run2} {
		out, errOut, code := run("residency", "decisions")
		if code != 0 {
			t.Fatalf("decisions on %s: exit %d, %s", name, code, errOut)
		}
		if _, ok := lineWith(out, " n1 ", " chat ", chat.Reason); !ok {
			t.Errorf("decisions on %s lack n1's load of chat:\n%s", name, out)
		}
		if _, ok := lineWith(out, " n2 ", " coder ", coder.Reason); !ok {
			t.Errorf("decisions on %s lack n2's load of coder:\n%s", name, out)
		}
		out, _, _ = run("residency", "profiles")
		if _, ok := lineWith(out, "n1 ", " chat "); !ok {
			t.Errorf("profiles on %s lack n1's chat:\n%s", name, out)
		}
		if _, ok := lineWith(out, "n2 ", " coder "); !ok {
			t.Errorf("profiles on %s lack n2's coder:\n%s", name, out)
		}
	}

	// --node asks only that node, through whichever node the CLI reached.
	out, _, _ := run1("residency", "decisions", "--node", "n2")
	if _, ok := lineWith(out, " n2 ", " coder "); !ok || strings.Contains(out, " chat ") {
		t.Errorf("decisions --node n2 on n1: want coder only:\n%s", out)
	}
	out, _, _ = run1("residency", "plan", "--node", "n2")
	if _, ok := lineWith(out, "n2 ", " coder ", " Resident "); !ok || strings.Contains(out, " chat ") {
		t.Errorf("plan --node n2 on n1: want coder only:\n%s", out)
	}
	out, _, _ = run2("residency", "plan")
	if _, ok := lineWith(out, "n1 ", " chat ", " Resident "); !ok {
		t.Errorf("plan on n2 lacks n1's chat:\n%s", out)
	}
	if _, errOut, code := run1("residency", "plan", "--node", "nosuch"); code != 1 || !strings.Contains(errOut, `node "nosuch" not found`) {
		t.Errorf("plan --node nosuch: exit %d, %s", code, errOut)
	}

	// --node completes with the cluster's nodes, as on other commands.
	out, _, _ = run1("__complete", "residency", "decisions", "--node", "")
	if !strings.Contains(out, "n1\n") || !strings.Contains(out, "n2\n") {
		t.Errorf("--node completion lacks n1 and n2:\n%s", out)
	}

	// Following on n1 receives a decision n2 takes afterwards.
	follow, stop := followDecisions(a1.APIURL())
	testutil.Until(t, 30*time.Second, "the follower to print both nodes' loads", func() bool {
		_, ok1 := lineWith(follow.String(), " chat ")
		_, ok2 := lineWith(follow.String(), " coder ")
		return ok1 && ok2
	})
	d2.deploy("embed", 10*gi)
	d2.serve("embed")
	embed := d2.decision(residency.ActLoad, "embed")
	testutil.Until(t, 30*time.Second, "the follower to print n2's load of embed", func() bool {
		_, ok := lineWith(follow.String(), " n2 ", " embed ", embed.Reason)
		return ok
	})
	if code := stop(); code != 0 {
		t.Errorf("decisions --follow exit %d: %s", code, follow.String())
	}
}
