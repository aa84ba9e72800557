package cli

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/cmd/gpuplane/agent"
	"github.com/gpuplane/gpuplane/internal/porttest"
)

// startDevAgent runs a real single-node agent in-process (Raft on disk,
// simulated l4=2 cards, the API on a free port) and returns a function that
// runs the CLI against it.
func startDevAgent(t *testing.T) func(args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a, err := agent.Start(ctx, agent.Config{
		Dev: true, DataDir: t.TempDir(), NodeName: "live", SimGPUs: "l4=2",
		APIPort: 0, RaftPort: freePort(t), GossipPort: freePort(t),
	})
	if err != nil {
		t.Fatalf("start agent: %v", err)
	}
	t.Cleanup(func() { a.Close() })
	return func(args ...string) (string, string, int) {
		var out, errb bytes.Buffer
		code := Run(context.Background(), append([]string{"--addr", a.APIURL()}, args...), strings.NewReader(""), &out, &errb)
		return out.String(), errb.String(), code
	}
}

// freePort returns a loopback port (TCP and UDP) no other test, in this
// binary or another running beside it, is given (see porttest).
func freePort(t *testing.T) int {
	t.Helper()
	return porttest.Free(t)
}

// fields splits a table into rows of whitespace-separated cells.
func fields(table string) [][]string {
	var rows [][]string
	for _, line := range strings.Split(strings.TrimSpace(table), "\n") {
		rows = append(rows, strings.Fields(line))
	}
	return rows
}

// TestLiveSharedPlacement checks shared placement against a real agent:
// four 45% replicas fill two shared l4 cards (two models each), the fifth
// waits with a reason naming 45%, and a dedicated accelerator created
// afterwards is READY with nothing to place.
func TestLiveSharedPlacement(t *testing.T) {
	run := startDevAgent(t)
	mustRun := func(args ...string) string {
		t.Helper()
		out, errOut, code := run(args...)
		if code != 0 {
			t.Fatalf("gpuplane %s: exit %d: %s", strings.Join(args, " "), code, errOut)
		}
		return out
	}
	mustRun("accelerators", "create", "small", "--device", "l4", "--tenancy", "shared", "--max-models", "2")
	mustRun("models", "deploy", "chat", "--accelerator", "small", "--model", "/models/llama", "--engine", "sim", "--replicas", "5", "--memory-percent", "45")

	// The leader's placer places asynchronously: wait for four replicas to
	// have a node (their engines may be starting by then).
	placed := func(table string) int {
		n := 0
		for _, row := range fields(table)[1:] {
			if row[2] != "-" {
				n++
			}
		}
		return n
	}
	var replicas string
	deadline := time.Now().Add(15 * time.Second)
	for {
		replicas = mustRun("replicas", "list", "--model", "chat")
		if placed(replicas) == 4 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	rows := fields(replicas)
	if got := placed(replicas); got != 4 {
		t.Fatalf("want 4 placed replicas, got %d:\n%s", got, replicas)
	}
	pending := rows[len(rows)-1]
	if pending[1] != "4" || !strings.Contains(replicas, "Pending") || !strings.Contains(replicas, "no l4 card has 45% free") {
		t.Fatalf("replica 4 should be pending with a reason naming 45%%:\n%s", replicas)
	}

	accs := fields(mustRun("accelerators", "list"))
	if got := strings.Join(accs[1], " "); got != "small l4 Shared 1 11517Mi 4 0 True" {
		t.Fatalf("accelerators list row = %q, want IN USE 4 and CAN PLACE 0", got)
	}
	mustRun("accelerators", "create", "fast", "--device", "l4")
	got := strings.Join(strings.Fields(mustRun("accelerators", "get", "fast")), " ")
	if want := "Name: fast Device: l4 Tenancy: Dedicated Cards/replica: 1 Memory/model: 23034Mi In use: 0 Can place: 0 Ready: True"; got != want {
		t.Fatalf("accelerators get fast = %q, want %q (READY True and CAN PLACE 0)", got, want)
	}
	model := mustRun("models", "get", "chat")
	if !strings.Contains(model, "1 of 5 replicas pending: no l4 card has 45% free") {
		t.Fatalf("models get should explain the pending replica:\n%s", model)
	}
	devices := fields(mustRun("devices", "list"))
	// PRODUCT ("NVIDIA L4") has a space: FREE is the next-to-last column.
	if got := devices[1][len(devices[1])-2]; got != "0" {
		t.Fatalf("devices list FREE = %s, want 0 (both cards bound to small)", got)
	}
}

// TestLiveRulesRefuseAndChangeNothing checks the descriptor rules live: each
// invalid deployment exits 1 naming its rule, and the state is unchanged;
// deleting an accelerator in use is refused and lists its deployments, and
// --force leaves them pending with the reason docs/descriptors.md rule 12 gives.
func TestLiveRulesRefuseAndChangeNothing(t *testing.T) {
	run := startDevAgent(t)
	for _, args := range [][]string{
		{"accelerators", "create", "small", "--device", "l4", "--tenancy", "shared"},
		{"accelerators", "create", "fast", "--device", "l4"},
	} {
		if _, errOut, code := run(args...); code != 0 {
			t.Fatalf("%v: %s", args, errOut)
		}
	}
	before, _, _ := run("models", "list", "-o", "json")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"models", "deploy", "a", "--accelerator", "small", "--model", "m"}, "rule 8"},
		{[]string{"models", "deploy", "b", "--accelerator", "fast", "--model", "m", "--tensor-parallel", "2"}, "rule 9"},
		{[]string{"models", "deploy", "c", "--accelerator", "nope", "--model", "m"}, "rule 7"},
		{[]string{"models", "deploy", "d", "--accelerator", "fast", "--model", "m", "--compute-percent", "50"}, "memory share"},
		{[]string{"models", "deploy", "e", "--accelerator", "small", "--model", "m", "--memory", "30Gi"}, "rule 10"},
	} {
		_, errOut, code := run(tc.args...)
		if code != 1 || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit 1 naming %q", tc.args, code, errOut, tc.want)
		}
	}
	if after, _, _ := run("models", "list", "-o", "json"); after != before {
		t.Fatalf("refused deployments changed the state:\nbefore %s\nafter %s", before, after)
	}

	if _, errOut, code := run("models", "deploy", "chat", "--accelerator", "small", "--model", "m", "--memory-percent", "30"); code != 0 {
		t.Fatal(errOut)
	}
	_, errOut, code := run("accelerators", "delete", "small")
	if code != 1 || !strings.Contains(errOut, "used by deployments chat") {
		t.Fatalf("delete in use: exit %d, %q", code, errOut)
	}
	if _, errOut, code := run("accelerators", "delete", "small", "--force"); code != 0 {
		t.Fatal(errOut)
	}
	reps, _, _ := run("replicas", "list", "--model", "chat")
	if !strings.Contains(reps, "accelerator small was deleted") {
		t.Fatalf("replicas should wait with the rule 12 reason:\n%s", reps)
	}
}

// TestLiveApplyAndRefusals checks apply and its refusals against a real
// agent: apply prints created then unchanged; re-applying with
// another tenancy exits 0, warns that accelerators are immutable naming the
// field, and changes nothing; each invalid request exits 1 naming its rule or
// field and leaves the state as it was.
func TestLiveApplyAndRefusals(t *testing.T) {
	run := startDevAgent(t)
	dir := t.TempDir()
	write := func(name, body string) string {
		path := dir + "/" + name
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	doc := "resource: Accelerator\nresourceVersion: v1\nmetadata: {name: small}\nspec: {device: l4, tenancy: shared, maxModels: 2}\n"
	file := write("small.yaml", doc)
	for _, want := range []string{"accelerator/small created", "accelerator/small unchanged"} {
		out, errOut, code := run("apply", "-f", file)
		if code != 0 || strings.TrimSpace(out) != want {
			t.Fatalf("apply: exit %d, stdout %q, stderr %q; want %q", code, out, errOut, want)
		}
	}
	before, _, _ := run("accelerators", "list", "-o", "json")
	changed := write("dedicated.yaml", strings.Replace(doc, "tenancy: shared, maxModels: 2", "tenancy: dedicated", 1))
	out, errOut, code := run("apply", "-f", changed)
	if code != 0 || !strings.Contains(out, "unchanged") || !strings.Contains(errOut, "immutable") || !strings.Contains(errOut, "spec.tenancy") {
		t.Fatalf("re-apply with another tenancy: exit %d, stdout %q, stderr %q", code, out, errOut)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"accelerators", "create", "wide", "--device", "l4", "--tenancy", "shared", "--devices-per-replica", "2"}, "a shared accelerator splits a single device"},
		{[]string{"accelerators", "create", "odd", "--device", "tpu9"}, "rule 2"},
		{[]string{"accelerators", "create", "small", "--device", "l4"}, "already exists"},
		{[]string{"apply", "-f", write("typo.yaml", strings.Replace(doc, "maxModels", "maxModles", 1))}, "spec.maxModles: unknown field"},
		{[]string{"apply", "-f", write("v2.yaml", strings.Replace(doc, "resourceVersion: v1", "resourceVersion: v2", 1))}, "resourceVersion: must be v1"},
	} {
		_, errOut, code := run(tc.args...)
		if code != 1 || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit 1 naming %q", tc.args, code, errOut, tc.want)
		}
	}
	if after, _, _ := run("accelerators", "list", "-o", "json"); after != before {
		t.Fatalf("refused requests changed the accelerators:\nbefore %s\nafter %s", before, after)
	}
}

// TestLiveMetricsAndUI checks that /metrics on the API port reports the
// node's view of the cluster in Prometheus' text format, and that / serves
// the web UI.
func TestLiveMetricsAndUI(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a, err := agent.Start(ctx, agent.Config{
		Dev: true, DataDir: t.TempDir(), NodeName: "metrics", SimGPUs: "l4=2",
		APIPort: 0, RaftPort: freePort(t), GossipPort: freePort(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	// A write, so that Raft's own metrics have a commit to report.
	resp, err := http.Post(a.APIURL()+"/gpuplane.v1.AcceleratorService/CreateAccelerator", "application/json",
		strings.NewReader(`{"name":"m","spec":{"device":"l4"}}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("CreateAccelerator = %d", resp.StatusCode)
	}
	// memberlist reports its first gossip round one gossip interval after
	// the start, so the page is read until every series has been reported.
	wants := []string{`gpuplane_nodes{status="alive"} 1`, `gpuplane_cards{bound="false",device="l4"} 2`, "gpuplane_raft_leader 1", "gpuplane_residency_violations 0", "go_goroutines",
		// Raft's own, through go-metrics, in snake case.
		"gpuplane_raft_commit_time{quantile=", "gpuplane_raft_fsm_apply_batch{quantile=", "gpuplane_memberlist_gossip{quantile=", "gpuplane_raft_state_leader"}
	var missing []string
	var body []byte
	for deadline := time.Now().Add(20 * time.Second); ; {
		resp, err = http.Get(a.APIURL() + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		missing = missing[:0]
		for _, want := range wants {
			if !strings.Contains(string(body), want) {
				missing = append(missing, want)
			}
		}
		if len(missing) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(missing) > 0 {
		t.Errorf("/metrics lacks %q:\n%s", missing, body)
	}

	// The web UI is one page on the API port, with its script and style
	// sheet, that reads the Connect JSON API; paths that are neither it nor
	// a procedure stay 404.
	resp, err = http.Get(a.APIURL() + "/")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(resp.Header.Get("Content-Type"), "text/html") || !strings.Contains(string(page), `<script src="/ui/app.js">`) {
		t.Errorf("GET / = %d %q, want the UI page", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	resp, err = http.Get(a.APIURL() + "/ui/app.js")
	if err != nil {
		t.Fatal(err)
	}
	script, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(resp.Header.Get("Content-Type"), "javascript") || !strings.Contains(string(script), `call("DashboardService", "Summary"`) {
		t.Errorf("GET /ui/app.js = %d %q, want the UI's script", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	resp, err = http.Post(a.APIURL()+"/gpuplane.v1.NoSuchService/Nothing", "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 404 {
		t.Errorf("unknown procedure = %d, want 404", resp.StatusCode)
	}
}

// TestLiveResourceFigures checks that `cluster status` and /metrics show
// what grows with the cluster's history: the log's size and
// oldest index, the snapshot, and the request-id table, which holds an id
// per applied request.
func TestLiveResourceFigures(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a, err := agent.Start(ctx, agent.Config{
		Dev: true, DataDir: t.TempDir(), NodeName: "figures", SimGPUs: "l4=2",
		APIPort: 0, RaftPort: freePort(t), GossipPort: freePort(t), RequestWindow: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	run := func(args ...string) string {
		var out, errb bytes.Buffer
		if code := Run(context.Background(), append([]string{"--addr", a.APIURL()}, args...), strings.NewReader(""), &out, &errb); code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, errb.String())
		}
		return out.String()
	}
	run("accelerators", "create", "small", "--device", "l4")
	out := run("cluster", "status")
	for _, want := range []string{"Log:", "entries 1..", "Snapshot:", "window 1h0m0s"} {
		if !strings.Contains(out, want) {
			t.Errorf("cluster status lacks %q:\n%s", want, out)
		}
	}
	var held int
	for _, line := range strings.Split(out, "\n") {
		if rest, ok := strings.CutPrefix(line, "Request ids:"); ok {
			fmt.Sscanf(strings.TrimSpace(rest), "%d held", &held)
		}
	}
	if held < 1 {
		t.Errorf("cluster status shows %d request ids held after a create, want at least 1:\n%s", held, out)
	}
	resp, err := http.Get(a.APIURL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{"gpuplane_raft_log_first_index 1", "gpuplane_raft_log_bytes ", "gpuplane_raft_snapshot_bytes ", "gpuplane_request_table_bytes "} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if !strings.Contains(string(body), "gpuplane_request_ids ") || strings.Contains(string(body), "gpuplane_request_ids 0\n") {
		t.Errorf("/metrics lacks a non-zero gpuplane_request_ids:\n%s", body)
	}
}

// TestLivePprofNeedsAdmin: Go's profiles are served on the API port; with
// ACLs on, no token is 401 and a read token 403, an admin token gets them.
func TestLivePprofNeedsAdmin(t *testing.T) {
	a, run := startResidencyAgent(t, agent.Config{Dev: true, NodeName: "pprof", SecurityConfig: agent.SecurityConfig{ACL: true}})
	bootOut, errOut, code := run("acl", "bootstrap", "--name", "root")
	if code != 0 {
		t.Fatalf("bootstrap: %s%s", bootOut, errOut)
	}
	secret := func(out string) string {
		return strings.TrimSpace(strings.SplitN(strings.SplitN(out, "secret: ", 2)[1], "\n", 2)[0])
	}
	root := secret(bootOut)
	readOut, errOut, code := run("--token", root, "acl", "token", "create", "--name", "viewer", "--role", "read")
	if code != 0 {
		t.Fatalf("create read token: %s%s", readOut, errOut)
	}
	get := func(token string) (int, string) {
		req, _ := http.NewRequest("GET", a.APIURL()+"/debug/pprof/goroutine?debug=1", nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	if code, body := get(""); code != 401 || !strings.Contains(body, "ACLs on") {
		t.Errorf("no token: %d %q, want 401 asking for a token", code, body)
	}
	if code, body := get(secret(readOut)); code != 403 || !strings.Contains(body, "needs the admin role") {
		t.Errorf("read token: %d %q, want 403 naming the admin role", code, body)
	}
	if code, body := get(root); code != 200 || !strings.Contains(body, "goroutine profile:") {
		t.Errorf("admin token: %d, want the goroutine profile; got %.200q", code, body)
	}
}

// TestLiveDeleteFileDryRun checks that `delete -f` takes the file `apply -f`
// took and, like apply, --dry-run: a dry run checks each resource, in
// delete's order, against the cluster as it is and leaves both in place;
// the real run then deletes them.
func TestLiveDeleteFileDryRun(t *testing.T) {
	run := startDevAgent(t)
	file := t.TempDir() + "/both.yaml"
	doc := "resource: Accelerator\nresourceVersion: v1\nmetadata: {name: small}\nspec: {device: l4, tenancy: shared, maxModels: 2}\n" +
		"---\nresource: ModelDeployment\nresourceVersion: v1\nmetadata: {name: chat}\n" +
		"spec: {model: /models/chat, replicas: 1, placement: {accelerator: small}, engine: {kind: sim, memoryPercent: 40}}\n"
	if err := os.WriteFile(file, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, errOut, code := run("apply", "-f", file); code != 0 {
		t.Fatalf("apply: exit %d, %s%s", code, out, errOut)
	}
	// Each resource is checked against the cluster as it is: the
	// deployment is still there, so the accelerator is reported in use.
	out, errOut, code := run("delete", "-f", file, "--dry-run")
	if want := "modeldeployment/chat deleted (dry run)\n"; code != 1 || out != want || !strings.Contains(errOut, `accelerator "small" is used by deployments chat`) {
		t.Fatalf("delete --dry-run: exit %d, stdout %q, stderr %q; want exit 1, %q and the accelerator in use", code, out, errOut, want)
	}
	for _, kind := range []string{"accelerators", "models"} {
		if _, errOut, code := run(kind, "get", map[string]string{"accelerators": "small", "models": "chat"}[kind]); code != 0 {
			t.Errorf("%s get after a dry run: exit %d, %s", kind, code, errOut)
		}
	}
	out, errOut, code = run("delete", "-f", file)
	if want := "modeldeployment/chat deleted\naccelerator/small deleted\n"; code != 0 || out != want {
		t.Fatalf("delete: exit %d, stdout %q, stderr %q; want %q", code, out, errOut, want)
	}
	if _, _, code := run("accelerators", "get", "small"); code != 1 {
		t.Errorf("accelerators get after delete -f: exit %d, want 1", code)
	}
}
