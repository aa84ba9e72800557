package archtest

import (
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/gpuplane/gpuplane"

// rule forbids imports from the packages From matches to the packages To
// matches, except those Allow matches. A pattern is a path relative to the
// module: "fsm" matches fsm itself, "fsm/..." matches fsm and everything
// under it. Only the imports of non-test files count: a test may reach
// wherever its fixture lives.
type rule struct {
	From, To []string
	Allow    []string // imports (To side) exempt from the rule
	Why      string
}

// rules is the table of docs/architecture.md's "never" rules.
var rules = []rule{
	{From: []string{"fsm/..."}, To: []string{"cluster/...", "node/...", "rpc/...", "cmd/...", "bench/...", "jepsen/..."},
		Why: "the state machine is pure: it depends on the wire types and leaves only"},
	{From: []string{"cluster/scheduler/..."}, To: []string{"fsm/...", "node/...", "rpc/...", "cmd/...", "cluster"},
		Why: "the scheduler is a library of placement: it sees its own model of cards, not the store or the node"},
	{From: []string{"rpc/..."}, To: []string{"node/...", "cmd/..."},
		Why: "rpc declares the interfaces it needs of a node (ResidencyJournal, LogReader); the agent wires them"},
	{From: []string{"node/residency"}, To: []string{"..."}, Allow: []string{"internal/class", "internal/cardfit"},
		Why: "the residency controller is pure: it imports nothing of the project but the shared vocabulary (priority classes, residency)"},
	{From: []string{"node/engine/...", "node/executor/...", "node/inventory/...", "node/watchdog/...", "node/procfs/...",
		"node/gateway/...", "node/residency/...", "node/cardmanager/..."}, To: []string{"node/sim/...", "node/servesim/..."},
		Why: "the node's running and serving rooms never depend on its simulation room (the sim engine, the serving simulator); their tests may"},
	{From: []string{"node/..."}, To: []string{"fsm/...", "cluster/...", "rpc/...", "cmd/..."},
		Why: "the node runs engines and serves requests; it learns the cluster's state through the agent, not by importing it"},
	{From: []string{"cluster/..."}, To: []string{"node/...", "rpc/...", "cmd/..."},
		Why: "the cluster layer replicates state; nodes and the API sit above it"},
	{From: []string{"internal/..."}, To: []string{"..."},
		Allow: []string{"internal/...", "proto/..."},
		Why:   "internal/ holds leaves every room may import; a leaf that imports a room runs the arrow back up"},
	{From: []string{"proto/..."}, To: []string{"..."}, Allow: []string{"proto/..."},
		Why: "the wire types are generated leaves"},
}

func match(pattern, pkg string) bool {
	if pattern == "..." {
		return true
	}
	if base, ok := strings.CutSuffix(pattern, "/..."); ok {
		return pkg == base || strings.HasPrefix(pkg, base+"/")
	}
	return pkg == pattern
}

func matchAny(patterns []string, pkg string) bool {
	return slices.ContainsFunc(patterns, func(p string) bool { return match(p, pkg) })
}

// imports lists each of the module's packages with the module's packages
// its non-test files import, paths relative to the module.
func imports(t *testing.T) map[string][]string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "list", "-json=ImportPath,Imports", "./...")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go list: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("go list: %v", err)
	}
	got := map[string][]string{}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p struct {
			ImportPath string
			Imports    []string
		}
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("go list output: %v", err)
		}
		from, ok := rel(p.ImportPath)
		if !ok {
			continue
		}
		got[from] = []string{}
		for _, imp := range p.Imports {
			if to, ok := rel(imp); ok {
				got[from] = append(got[from], to)
			}
		}
	}
	return got
}

func rel(path string) (string, bool) {
	if path == module {
		return "", true
	}
	return strings.CutPrefix(path, module+"/")
}

// violations are the forbidden arrows in imps, one line each, naming the
// arrow and the rule it breaks.
func violations(imps map[string][]string) []string {
	var out []string
	for from, tos := range imps {
		for _, to := range tos {
			for _, r := range rules {
				if matchAny(r.From, from) && matchAny(r.To, to) && !matchAny(r.Allow, to) && !matchAny(r.From, to) {
					out = append(out, from+" -> "+to+": "+r.Why)
					break
				}
			}
		}
	}
	slices.Sort(out)
	return out
}

// TestImportArrows fails on an import that runs the wrong way, naming it.
func TestImportArrows(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list over the module")
	}
	imps := imports(t)
	for _, must := range []string{"fsm", "rpc", "node/residency", "node/inventory"} {
		if _, ok := imps[must]; !ok {
			t.Fatalf("go list did not report %s: the test reads the wrong tree", must)
		}
	}
	for _, v := range violations(imps) {
		t.Errorf("forbidden import %s (docs/architecture.md)", v)
	}
}

// TestRulesCatchWrongWayImports checks the table against the arrows issue
// 35 removed: each must be reported if it came back.
func TestRulesCatchWrongWayImports(t *testing.T) {
	for _, arrow := range [][2]string{
		{"rpc", "node/residency"},
		{"node/residency", "node/gateway/queue"},
		{"node/inventory", "fsm/catalog"},
		{"internal/replaylog", "cluster"},
		{"fsm", "cluster"},
		{"cluster/scheduler", "node/inventory"},
		{"node/gateway", "node/sim"},
		{"node/cardmanager", "node/servesim"},
		{"fsm/descriptor", "cmd/gpuplane/cli"},
	} {
		if v := violations(map[string][]string{arrow[0]: {arrow[1]}}); len(v) != 1 {
			t.Errorf("%s -> %s: got %q, want one violation", arrow[0], arrow[1], v)
		}
	}
	for _, arrow := range [][2]string{
		{"node/residency", "internal/class"},
		{"node/residency", "internal/cardfit"},
		{"node/inventory", "internal/catalog"},
		{"fsm", "internal/catalog"},
		{"fsm", "internal/cardfit"},
		{"cluster/scheduler", "internal/cardfit"},
		{"cmd/gpuplane/agent", "rpc"},
		{"node/servesim", "node/residency"},
		{"node/sim", "node/inventory"},
		{"fsm/descriptor", "fsm"},
	} {
		if v := violations(map[string][]string{arrow[0]: {arrow[1]}}); len(v) != 0 {
			t.Errorf("%s -> %s is allowed, got %q", arrow[0], arrow[1], v)
		}
	}
}
