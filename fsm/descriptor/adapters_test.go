package descriptor

import (
	"errors"
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// TestParseAdapters: spec.adapters and engine.maxAdapters reach the API's
// form as written.
func TestParseAdapters(t *testing.T) {
	f, err := Parse([]byte(`resource: ModelDeployment
resourceVersion: v1
metadata: {name: chat}
spec:
  model: /m
  placement: {accelerator: home}
  engine: {kind: sim, memoryPercent: 50, maxAdapters: 8}
  adapters:
    - {name: sql, source: /adapters/sql, rank: 16}
    - {name: legal, source: /adapters/legal, rank: 64, tenants: [acme]}
`))
	if err != nil {
		t.Fatal(err)
	}
	got := f.Resources[0].ModelDeployment.Proto()
	want := []*pb.Adapter{{Name: "sql", Source: "/adapters/sql", Rank: 16},
		{Name: "legal", Source: "/adapters/legal", Rank: 64, Tenants: []string{"acme"}}}
	if len(got.Adapters) != 2 || !proto.Equal(got.Adapters[0], want[0]) || !proto.Equal(got.Adapters[1], want[1]) {
		t.Errorf("adapters = %v, want %v", got.Adapters, want)
	}
	if got.Engine.MaxAdapters != 8 {
		t.Errorf("maxAdapters = %d, want 8", got.Engine.MaxAdapters)
	}
}

// TestParseAdapterProblems: every bad adapter field is named with its path
// and rule, and the file is refused.
func TestParseAdapterProblems(t *testing.T) {
	_, err := Parse([]byte(`resource: ModelDeployment
resourceVersion: v1
metadata: {name: chat}
spec:
  model: /m
  placement: {accelerator: home}
  engine: {kind: ollama, memoryPercent: 50, maxAdapters: 0}
  adapters:
    - {name: sql, source: /adapters/sql, rank: 16}
    - {name: sql, source: /adapters/sql2, rank: 600}
    - {name: "a:b", source: /x}
`))
	var perr *Error
	if !errors.As(err, &perr) {
		t.Fatalf("Parse = %v, want problems", err)
	}
	var got []string
	for _, p := range perr.Problems {
		got = append(got, p.String())
	}
	want := []string{
		"document 1 (modeldeployment/chat): spec.engine.maxAdapters: must be between 1 and 256, got 0",
		"document 1 (modeldeployment/chat): spec.adapters[2].rank: required: the adapter's LoRA rank, 1..512",
		"document 1 (modeldeployment/chat): spec.adapters: engine ollama cannot load LoRA adapters at run time (an adapter is a separate Ollama model): use kind vllm, sglang, llamacpp or sim, or deploy the adapter as its own model",
		`document 1 (modeldeployment/chat): spec.adapters[1].name: "sql" is already the name of spec.adapters[0]: adapter names are unique per deployment`,
		"document 1 (modeldeployment/chat): spec.adapters[1].rank: must be between 1 and 512, got 600",
		`document 1 (modeldeployment/chat): spec.adapters[2].name: "a:b" must be letters, digits, '.', '_' or '-', starting with a letter or digit (requests name it as model NAME:ADAPTER)`,
	}
	if !slices.Equal(got, want) {
		t.Errorf("problems:\n%q\nwant\n%q", got, want)
	}
}

// TestParseAliases: spec.aliases reach the API's form as written; an alias
// that could not tell the deployment's endpoints apart is refused with its
// path and rule.
func TestParseAliases(t *testing.T) {
	f, err := Parse([]byte(`resource: ModelDeployment
resourceVersion: v1
metadata: {name: chat}
spec:
  model: /m
  placement: {accelerator: home}
  engine: {kind: sim, memoryPercent: 50}
  aliases: [helpdesk, support]
`))
	if err != nil {
		t.Fatal(err)
	}
	if got := f.Resources[0].ModelDeployment.Proto().GetAliases(); !slices.Equal(got, []string{"helpdesk", "support"}) {
		t.Errorf("aliases = %q, want [helpdesk support]", got)
	}
	_, err = Parse([]byte(`resource: ModelDeployment
resourceVersion: v1
metadata: {name: chat}
spec:
  model: /m
  placement: {accelerator: home}
  engine: {kind: sim, memoryPercent: 50}
  adapters: [{name: sql, source: /a/sql, rank: 8}]
  aliases: [chat, help, help, sql, "a:b"]
`))
	var perr *Error
	if !errors.As(err, &perr) {
		t.Fatalf("Parse = %v, want problems", err)
	}
	var got []string
	for _, p := range perr.Problems {
		got = append(got, p.String())
	}
	want := []string{
		`document 1 (modeldeployment/chat): spec.aliases[2]: "help" is already spec.aliases[1]: aliases are unique per deployment`,
		`document 1 (modeldeployment/chat): spec.aliases[3]: "sql" is the name of one of the deployment's adapters: requests could not tell the alias from the adapter`,
		`document 1 (modeldeployment/chat): spec.aliases[4]: "a:b" must be letters, digits, '.', '_' or '-', starting with a letter or digit (requests name it as model ALIAS or ALIAS:ADAPTER)`,
		`document 1 (modeldeployment/chat): spec.aliases[0]: "chat" is the deployment's served model name already`,
	}
	if !slices.Equal(got, want) {
		t.Errorf("problems:\n%q\nwant\n%q", got, want)
	}
}
