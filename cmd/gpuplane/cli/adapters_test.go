package cli

import (
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// TestModelsGetShowsAdapterTiers: `models get` lists a deployment's
// adapters with where each is on each placed replica (unreported: disk),
// those on a card first.
func TestModelsGetShowsAdapterTiers(t *testing.T) {
	spec := &pb.ModelSpec{ServedModelName: "chat", Placement: &pb.PlacementSpec{Accelerator: "lora"}, Engine: &pb.EngineSpec{Kind: "sim"},
		Adapters: []*pb.Adapter{{Name: "law", Source: "/a/law", Rank: 16}, {Name: "sql", Source: "/a/sql", Rank: 8},
			{Name: "zed", Source: "/a/zed", Rank: 64, Tenants: []string{"acme", "beta"}}}}
	m := &pb.GetModelResponse{
		Model: &pb.ModelDeployment{Name: "chat", Spec: spec, Status: &pb.ModelStatus{}},
		Replicas: []*pb.Replica{
			{Model: "chat", Index: 0, Node: "vm", Cards: []uint32{0}, Adapters: []*pb.AdapterStatus{
				{Name: "zed", Tier: pb.AdapterTier_ADAPTER_TIER_CARD}, {Name: "law", Tier: pb.AdapterTier_ADAPTER_TIER_HOST}}},
			{Model: "chat", Index: 1, Node: "vm", Cards: []uint32{1}, Adapters: []*pb.AdapterStatus{
				{Name: "sql", Tier: pb.AdapterTier_ADAPTER_TIER_LOADING}}},
		},
	}
	out := printed(t, outputTable, func(g *globals) error { return g.printModel(m) })
	i := strings.Index(out, "ADAPTER")
	if i < 0 {
		t.Fatalf("no adapters section:\n%s", out)
	}
	var rows []string
	for _, l := range strings.Split(strings.TrimSpace(out[i:]), "\n")[1:] {
		rows = append(rows, strings.Join(strings.Fields(l), " "))
	}
	want := []string{
		"zed 64 /a/zed acme,beta 0:card 1:disk",
		"sql 8 /a/sql - 0:disk 1:loading",
		"law 16 /a/law - 0:host 1:disk",
	}
	if strings.Join(rows, "\n") != strings.Join(want, "\n") {
		t.Fatalf("adapters:\n%s\nwant\n%s", strings.Join(rows, "\n"), strings.Join(want, "\n"))
	}
}

// TestModelsDeployAdapterFlags: --adapter, --max-adapters and --alias reach
// the server as the same spec a file would send; every bad one is refused
// naming the flag as typed, and nothing is sent.
func TestModelsDeployAdapterFlags(t *testing.T) {
	f := &fakeAPI{}
	m := sampleModels()
	url := serveModels(t, f, m)
	base := []string{"--addr", url, "models", "deploy", "chat", "--accelerator", "small", "--model", "/m", "--memory-percent", "40", "--engine", "sim"}
	r := run(t, "", nil, append(slices.Clone(base), "--max-adapters", "8", "--adapter", "sql=/a/sql,rank=16",
		"--adapter", "legal=hf://org/legal,rank=64,tenants=acme|beta", "--alias", "helpdesk", "--alias", "support")...)
	if r.code != exitOK || r.stderr != "" {
		t.Fatalf("deploy: %+v", r)
	}
	file := `resource: ModelDeployment
resourceVersion: v1
metadata: {name: chat}
spec:
  model: /m
  placement: {accelerator: small}
  engine: {kind: sim, memoryPercent: 40, maxAdapters: 8}
  adapters:
    - {name: sql, source: /a/sql, rank: 16}
    - {name: legal, source: "hf://org/legal", rank: 64, tenants: [acme, beta]}
  aliases: [helpdesk, support]
`
	if r := run(t, file, nil, "--addr", url, "apply", "-f", "-"); r.code != exitOK || !proto.Equal(m.applies[0], m.applies[1]) {
		t.Fatalf("deploy sent %v\nthe same file sent %v (%+v)", m.applies[0], m.applies[1], r)
	}
	if got := m.applies[0].GetSpec(); len(got.GetAdapters()) != 2 || got.GetEngine().GetMaxAdapters() != 8 || len(got.GetAliases()) != 2 {
		t.Fatalf("deploy sent %v", got)
	}

	tests := []struct {
		args []string
		code int
		err  string // the first line of stderr
	}{
		{[]string{"--adapter", "sql=/a,rank=8", "--adapter", "sql=/b,rank=8"}, exitFailure,
			`error: --adapter "sql=/b,rank=8": name: "sql" is already the name of spec.adapters[0]: adapter names are unique per deployment`},
		{[]string{"--adapter", "sql=/a,rank=0"}, exitFailure, `error: --adapter "sql=/a,rank=0": rank: must be between 1 and 512, got 0`},
		{[]string{"--adapter", "sql=/a,rank=513"}, exitFailure, `error: --adapter "sql=/a,rank=513": rank: must be between 1 and 512, got 513`},
		{[]string{"--adapter", "sql=/a"}, exitFailure, `error: --adapter "sql=/a": rank: required: the adapter's LoRA rank, 1..512`},
		{[]string{"--engine", "ollama", "--adapter", "sql=/a,rank=8"}, exitFailure,
			"error: --adapter: engine ollama cannot load LoRA adapters at run time (an adapter is a separate Ollama model): use kind vllm, sglang, llamacpp or sim, or deploy the adapter as its own model"},
		{[]string{"--max-adapters", "0"}, exitFailure, "error: --max-adapters: must be between 1 and 256, got 0"},
		{[]string{"--max-adapters", "300"}, exitFailure, "error: --max-adapters: must be between 1 and 256, got 300"},
		{[]string{"--adapter", "sql=/a,rank=8,tenants=Acme"}, exitFailure, `error: --adapter "sql=/a,rank=8,tenants=Acme": tenants[0]: "Acme" must be a DNS label: at most 63 lowercase letters, digits or '-', starting and ending with a letter or digit`},
		{[]string{"--alias", "sql", "--adapter", "sql=/a,rank=8"}, exitFailure,
			`error: --alias "sql": "sql" is the name of one of the deployment's adapters: requests could not tell the alias from the adapter`},
		{[]string{"--alias", "a:b"}, exitFailure,
			`error: --alias "a:b": "a:b" must be letters, digits, '.', '_' or '-', starting with a letter or digit (requests name it as model ALIAS or ALIAS:ADAPTER)`},
		{[]string{"--adapter", "sql"}, exitUsage, `error: invalid argument "sql" for "--adapter" flag: want NAME=SOURCE first (such as sql=/adapters/sql,rank=16), got "sql"`},
		{[]string{"--adapter", "sql=/a,rank=x"}, exitUsage, `error: invalid argument "sql=/a,rank=x" for "--adapter" flag: rank: want a whole number, got "x"`},
		{[]string{"--adapter", "sql=/a,size=8"}, exitUsage, `error: invalid argument "sql=/a,size=8" for "--adapter" flag: unknown key "size": want rank=N or tenants=A|B after NAME=SOURCE`},
	}
	sent := len(m.applies)
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			r := run(t, "", nil, append(slices.Clone(base), tt.args...)...)
			if r.code != tt.code || strings.Split(r.stderr, "\n")[0] != tt.err || r.stdout != "" {
				t.Errorf("code %d, stderr:\n%s\nwant %d and %q", r.code, r.stderr, tt.code, tt.err)
			}
		})
	}
	if len(m.applies) != sent {
		t.Errorf("invalid deployments were sent: %v", m.applies[sent:])
	}
}

// TestLiveDeployAdapterFlags: on a real agent, `models deploy` with
// --adapter, --max-adapters and --alias shows them in `models get`; its
// `-o yaml` applied back, or the same flags again, change nothing; bad
// flags are refused and leave the deployment as it was.
func TestLiveDeployAdapterFlags(t *testing.T) {
	run := startDevAgent(t)
	if _, errOut, code := run("accelerators", "create", "shared", "--device", "l4", "--tenancy", "shared"); code != 0 {
		t.Fatal(errOut)
	}
	deploy := []string{"models", "deploy", "chat", "--accelerator", "shared", "--model", "/models/chat", "--engine", "sim",
		"--memory-percent", "30", "--max-adapters", "2", "--adapter", "sql=/adapters/sql,rank=16",
		"--adapter", "law=/adapters/law,rank=64,tenants=acme|beta", "--alias", "helpdesk"}
	if out, errOut, code := run(deploy...); code != 0 || out != "modeldeployment/chat created\n" {
		t.Fatalf("deploy: exit %d, %s%s", code, out, errOut)
	}
	got, errOut, code := run("models", "get", "chat")
	if code != 0 {
		t.Fatal(errOut)
	}
	rows := map[string][]string{}
	for _, f := range fields(got) {
		if len(f) > 0 {
			rows[f[0]] = f
		}
	}
	if r := rows["sql"]; len(r) < 3 || r[1] != "16" || r[2] != "/adapters/sql" {
		t.Errorf("models get: sql row %q\n%s", r, got)
	}
	if r := rows["law"]; len(r) < 4 || r[1] != "64" || r[2] != "/adapters/law" || r[3] != "acme,beta" {
		t.Errorf("models get: law row %q\n%s", r, got)
	}
	if r := rows["Aliases:"]; len(r) != 2 || r[1] != "helpdesk" {
		t.Errorf("models get: aliases %q\n%s", r, got)
	}
	yaml, errOut, code := run("models", "get", "chat", "-o", "yaml")
	if code != 0 || !strings.Contains(yaml, "maxAdapters: 2") {
		t.Fatalf("models get -o yaml: exit %d, %s%s", code, yaml, errOut)
	}
	if out, errOut, code := run(deploy...); code != 0 || out != "modeldeployment/chat unchanged\n" {
		t.Errorf("the same flags again: exit %d, %s%s", code, out, errOut)
	}
	for _, bad := range [][]string{
		{"--adapter", "sql=/a,rank=0"},
		{"--adapter", "x=/a,rank=513"},
		{"--adapter", "law=/b,rank=8"},
		{"--max-adapters", "0"},
	} {
		args := append(slices.Clone(deploy), bad...)
		if out, errOut, code := run(args...); code != exitFailure || out != "" || !strings.HasPrefix(errOut, "error: --") {
			t.Errorf("%v: exit %d, %q %q; want a refusal naming the flag", bad, code, out, errOut)
		}
	}
	ollama := append(slices.Clone(deploy), "--engine", "ollama")
	if _, errOut, code := run(ollama...); code != exitFailure || !strings.Contains(errOut, "engine ollama cannot load LoRA adapters") {
		t.Errorf("adapters on ollama: exit %d, %s", code, errOut)
	}
	// The spec, that is: the status moves on as the replica starts.
	spec := func(doc string) string { s, _, _ := strings.Cut(doc, "\nstatus:"); return s }
	if after, _, _ := run("models", "get", "chat", "-o", "yaml"); spec(after) != spec(yaml) {
		t.Errorf("a refused deploy changed the deployment:\n%s\nwas\n%s", after, yaml)
	}
}
