package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// simFiles writes a YAML cluster of two l4 cards and a workload of five
// 45% replicas on a shared accelerator: four fit (two per card), the fifth
// fails with 90% of the GPU capacity allocated, whatever the policy.
func simFiles(t *testing.T) (nodes, workload string) {
	t.Helper()
	dir := t.TempDir()
	nodes, workload = filepath.Join(dir, "nodes.yaml"), filepath.Join(dir, "workload.yaml")
	write := func(path, content string) {
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(nodes, "nodes:\n- name: gpu\n  cards: {l4: 2}\n")
	write(workload, `accelerators:
- {name: small, device: l4, tenancy: shared, maxModels: 2}
arrivals:
- {deployment: chat, accelerator: small, replicas: 5, memoryPercent: 45}
`)
	return nodes, workload
}

// openbFiles writes a tiny trace in the openb CSV format under the file
// names the real trace uses.
func openbFiles(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	files := map[string]string{
		"openb_node_list_gpu_node.csv": "sn,cpu_milli,memory_mib,gpu,model\nn0,32000,131072,2,T4\nn1,32000,131072,1,T4\n",
		"openb_pod_list_default.csv": "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n" +
			"p0,1000,1024,1,500,,LS,Running,1,,\n" +
			"p1,1000,1024,2,1000,,LS,Running,2,,\n" +
			"p2,1000,1024,1,1000,,LS,Running,3,,\n" +
			"p3,1000,1024,1,600,,LS,Running,4,,\n",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// simResult is the part of simulate's JSON that the tests check.
type simResult struct {
	Policy                     string   `json:"policy"`
	Arrivals                   int      `json:"arrivals"`
	Placed                     int      `json:"placed"`
	Failed                     int      `json:"failed"`
	GPUAllocatedAtFirstFailure float64  `json:"gpuAllocatedAtFirstFailure"`
	GPUAllocatedAtEnd          float64  `json:"gpuAllocatedAtEnd"`
	Seconds                    *float64 `json:"seconds"`
}

func TestSimulate(t *testing.T) {
	nodes, workload := simFiles(t)

	r := run(t, "", nil, "simulate", "--nodes", nodes, "--workload", workload)
	if r.code != exitOK || r.stderr != "" {
		t.Fatalf("simulate: %+v", r)
	}
	lines := strings.Split(r.stdout, "\n")
	for i, want := range []string{"POLICY gpuplane", "ARRIVALS 5", "PLACED 4", "FAILED 1", "FIRST FAILURE #4", "GPU ALLOC AT FIRST FAILURE 90.00%", "GPU ALLOC AT END 90.00%"} {
		if got := strings.Join(strings.Fields(lines[i]), " "); got != want {
			t.Errorf("simulate line %d = %q, want %q\n%s", i, got, want, r.stdout)
		}
	}

	r = run(t, "", nil, "-o", "json", "simulate", "--nodes", nodes, "--workload", workload, "--policy", "bestfit")
	var one simResult
	if err := json.Unmarshal([]byte(r.stdout), &one); err != nil || r.code != exitOK {
		t.Fatalf("simulate -o json: %v, %+v", err, r)
	}
	if one.Policy != "bestfit" || one.Arrivals != 5 || one.Placed != 4 || one.Failed != 1 ||
		one.GPUAllocatedAtFirstFailure != 0.9 || one.GPUAllocatedAtEnd != 0.9 || one.Seconds == nil {
		t.Errorf("simulate -o json = %+v\n%s", one, r.stdout)
	}

	r = run(t, "", nil, "-o", "json", "simulate", "--nodes", nodes, "--workload", workload, "--policy", "all")
	var all []simResult
	if err := json.Unmarshal([]byte(r.stdout), &all); err != nil || r.code != exitOK {
		t.Fatalf("simulate --policy all -o json: %v, %+v", err, r)
	}
	var policies []string
	for _, res := range all {
		policies = append(policies, res.Policy)
		if res.Placed != 4 || res.Failed != 1 {
			t.Errorf("policy %s: %+v", res.Policy, res)
		}
	}
	if got := strings.Join(policies, ","); got != "gpuplane,fgd,bestfit,spread" {
		t.Errorf("--policy all ran %s", got)
	}

	r = run(t, "", nil, "-o", "yaml", "simulate", "--nodes", nodes, "--workload", workload, "--policy", "FGD")
	if r.code != exitOK || !strings.Contains(r.stdout, "policy: fgd\n") || !strings.Contains(r.stdout, "placed: 4\n") {
		t.Errorf("simulate -o yaml: %+v", r)
	}
}

func TestSimulateAllPoliciesSideBySide(t *testing.T) {
	dir := openbFiles(t)
	r := run(t, "", nil, "simulate", "--policy", "all",
		"--nodes", filepath.Join(dir, "openb_node_list_gpu_node.csv"), "--workload", filepath.Join(dir, "openb_pod_list_default.csv"))
	if r.code != exitOK || r.stderr != "" {
		t.Fatalf("simulate --policy all: %+v", r)
	}
	lines := strings.Split(r.stdout, "\n")
	if got := strings.Join(strings.Fields(lines[0]), " "); got != "POLICY gpuplane fgd bestfit spread" {
		t.Errorf("header %q, want the four policies side by side\n%s", got, r.stdout)
	}
	if got := strings.Fields(lines[1]); len(got) != 5 || got[0] != "ARRIVALS" || got[1] != "4" || got[4] != "4" {
		t.Errorf("arrivals row %q", lines[1])
	}
}

func TestSimulateDefaultsToOpenB(t *testing.T) {
	dir := openbFiles(t)
	t.Setenv("GPUPLANE_OPENB_DIR", dir)
	r := run(t, "", nil, "-o", "json", "simulate", "--policy", "gpuplane")
	var one simResult
	if err := json.Unmarshal([]byte(r.stdout), &one); err != nil || r.code != exitOK {
		t.Fatalf("simulate on the default trace: %v, %+v", err, r)
	}
	if want := "simulate: no --nodes or --workload given: using the openb trace in " + dir + "\n"; r.stderr != want {
		t.Errorf("stderr %q, want %q", r.stderr, want)
	}
	if one.Arrivals != 4 || one.Placed+one.Failed != 4 {
		t.Errorf("result %+v", one)
	}

}

// TestSimulateRunsTheExampleFromAFreshClone checks a fresh clone: with no
// files and no openb trace, `simulate --policy all` runs the example the
// repository ships (examples/simulate, built into the binary) and says so;
// the files on disk give the same result when named, and the format the
// help shows parses.
func TestSimulateRunsTheExampleFromAFreshClone(t *testing.T) {
	t.Setenv("GPUPLANE_OPENB_DIR", t.TempDir()) // no trace there
	r := run(t, "", nil, "-o", "json", "simulate", "--policy", "all")
	var builtIn []simResult
	if err := json.Unmarshal([]byte(r.stdout), &builtIn); err != nil || r.code != exitOK {
		t.Fatalf("simulate --policy all without files or trace: %v, %+v", err, r)
	}
	if want := "using the example in examples/simulate/nodes.yaml and examples/simulate/workload.yaml"; !strings.Contains(r.stderr, want) {
		t.Errorf("stderr %q, want it to say %q", r.stderr, want)
	}
	if len(builtIn) != len(policyNames()) || builtIn[0].Arrivals < 10 || builtIn[0].Placed == 0 || builtIn[0].Failed == 0 {
		t.Errorf("the example's results %+v: want every policy, some arrivals placed and some not", builtIn)
	}
	r = run(t, "", nil, "-o", "json", "simulate", "--policy", "all",
		"--nodes", "../../../examples/simulate/nodes.yaml", "--workload", "../../../examples/simulate/workload.yaml")
	var onDisk []simResult
	if err := json.Unmarshal([]byte(r.stdout), &onDisk); err != nil || r.code != exitOK {
		t.Fatalf("simulate with the example's files: %v, %+v", err, r)
	}
	for i := range onDisk {
		onDisk[i].Seconds, builtIn[i].Seconds = nil, nil
	}
	if !reflect.DeepEqual(onDisk, builtIn) {
		t.Errorf("the files on disk give %+v, the built-in example %+v", onDisk, builtIn)
	}

	// The YAML the help shows is a working pair of files.
	help := run(t, "", nil, "simulate", "--help").stdout
	block := func(title string) string {
		_, after, ok := strings.Cut(help, "  # "+title+"\n")
		if !ok {
			t.Fatalf("simulate --help has no %s block:\n%s", title, help)
		}
		var lines []string
		for _, l := range strings.Split(after, "\n") {
			if !strings.HasPrefix(l, "  ") || strings.HasPrefix(l, "  # ") {
				break
			}
			lines = append(lines, strings.TrimPrefix(l, "  "))
		}
		return strings.Join(lines, "\n") + "\n"
	}
	nodes := filepath.Join(t.TempDir(), "nodes.yaml")
	workload := filepath.Join(t.TempDir(), "workload.yaml")
	if err := os.WriteFile(nodes, []byte(block("nodes.yaml")), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(workload, []byte(block("workload.yaml")), 0o600); err != nil {
		t.Fatal(err)
	}
	if r := run(t, "", nil, "simulate", "--nodes", nodes, "--workload", workload); r.code != exitOK {
		t.Errorf("the help's example files do not run: %+v\n%s\n%s", r, block("nodes.yaml"), block("workload.yaml"))
	}
}

func TestSimulateErrors(t *testing.T) {
	nodes, workload := simFiles(t)
	tests := []struct {
		args []string
		code int
		err  string
	}{
		{[]string{"--nodes", nodes, "--workload", workload, "--policy", "firstfit"}, exitUsage,
			`error: invalid --policy "firstfit": want gpuplane, fgd, bestfit, spread, default or all`},
		{[]string{"--nodes", nodes}, exitUsage, "error: required flag --workload not set (it goes with --nodes)"},
		{[]string{"--workload", workload}, exitUsage, "error: required flag --nodes not set (it goes with --workload)"},
		{[]string{"--nodes", nodes, "--workload", workload, "extra"}, exitUsage, `error: unexpected argument "extra"`},
		{[]string{"--nodes", filepath.Join(t.TempDir(), "missing.yaml"), "--workload", workload}, exitFailure, "error: simulate: open "},
		{[]string{"--nodes", workload, "--workload", workload}, exitFailure, "error: simulate: " + workload + ": "},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			r := run(t, "", nil, append([]string{"simulate"}, tt.args...)...)
			if r.code != tt.code || !strings.HasPrefix(r.stderr, tt.err) || r.stdout != "" {
				t.Errorf("code %d, stderr %q; want %d and %q", r.code, r.stderr, tt.code, tt.err)
			}
		})
	}
}

func TestSimulateInflated(t *testing.T) {
	dir := openbFiles(t)
	args := []string{"simulate", "--policy", "all", "--inflate", "150", "--seeds", "3",
		"--nodes", filepath.Join(dir, "openb_node_list_gpu_node.csv"), "--workload", filepath.Join(dir, "openb_pod_list_default.csv")}
	r := run(t, "", nil, args...)
	if r.code != exitOK || r.stderr != "" {
		t.Fatalf("simulate --inflate: %+v", r)
	}
	lines := strings.Split(r.stdout, "\n")
	if !strings.HasPrefix(lines[0], "inflated to 150% of GPU capacity, 3 seeds") ||
		strings.Join(strings.Fields(lines[1]), " ") != "POLICY gpuplane fgd bestfit spread" ||
		!strings.Contains(r.stdout, "GPU UNALLOCATED AT 100% ARRIVED") {
		t.Errorf("table:\n%s", r.stdout)
	}
	r = run(t, "", nil, append([]string{"-o", "json"}, args...)...)
	var sums []struct {
		Policy         string  `json:"policy"`
		Seeds          int     `json:"seeds"`
		InflatePercent float64 `json:"inflatePercent"`
		Runs           []struct {
			Reached100 bool `json:"reached100"`
		} `json:"runs"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &sums); err != nil || r.code != exitOK || len(sums) != 4 {
		t.Fatalf("-o json: %v, %+v", err, r)
	}
	for _, s := range sums {
		if s.Seeds != 3 || s.InflatePercent != 150 || len(s.Runs) != 3 || !s.Runs[0].Reached100 {
			t.Errorf("summary %+v", s)
		}
	}
	r = run(t, "", nil, "simulate", "--seeds", "0", "--nodes", filepath.Join(dir, "openb_node_list_gpu_node.csv"),
		"--workload", filepath.Join(dir, "openb_pod_list_default.csv"))
	if r.code != exitFailure || !strings.Contains(r.stderr, "seeds 0: want at least 1") {
		t.Errorf("--seeds 0: %+v", r)
	}
}
