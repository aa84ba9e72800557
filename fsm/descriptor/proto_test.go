package descriptor

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

func TestModelDeploymentProto(t *testing.T) {
	f, err := Parse([]byte(specExample))
	if err != nil {
		t.Fatal(err)
	}
	want := &pb.ModelSpec{
		Model:           "/models/llama-3.1-8b-instruct",
		ServedModelName: "chat",
		Replicas:        2,
		Placement:       &pb.PlacementSpec{Accelerator: "small"},
		Engine: &pb.EngineSpec{Kind: "vllm", MemoryPercent: 45, ComputePercent: 50, MaxModelLen: 8192,
			TensorParallel: 1, PipelineParallel: 1, Args: []string{}, Env: map[string]string{}},
	}
	if got := f.Resources[1].ModelDeployment.Proto(); !proto.Equal(got, want) {
		t.Errorf("Proto() = %v\nwant %v", got, want)
	}

	// Defaults, an absolute memory share, a node selector and the resources
	// extension.
	f, err = Parse([]byte(`resource: ModelDeployment
resourceVersion: v1
metadata: {name: llm}
spec:
  model: hf://org/llm
  placement: {accelerator: big, nodeSelector: {zone: a}}
  engine: {memory: 20Gi, args: [--foo], env: {A: b}}
  resources: {cpu: 500m, memory: 8Gi}
`))
	if err != nil {
		t.Fatal(err)
	}
	want = &pb.ModelSpec{
		Model:           "hf://org/llm",
		ServedModelName: "llm",
		Replicas:        1,
		Placement:       &pb.PlacementSpec{Accelerator: "big", NodeSelector: map[string]string{"zone": "a"}},
		Engine: &pb.EngineSpec{Kind: "vllm", MemoryMib: 20480, TensorParallel: 1, PipelineParallel: 1,
			Args: []string{"--foo"}, Env: map[string]string{"A": "b"}},
		Resources: &pb.HostResources{CpuMilli: 500, MemoryMib: 8192},
	}
	if got := f.Resources[0].ModelDeployment.Proto(); !proto.Equal(got, want) {
		t.Errorf("Proto() = %v\nwant %v", got, want)
	}

	// replicas: 0 is kept (a deployment scaled to zero), not defaulted.
	f, err = Parse([]byte("resource: ModelDeployment\nresourceVersion: v1\nmetadata: {name: z}\nspec: {model: /m, replicas: 0, placement: {accelerator: a}, resources: {}}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := f.Resources[0].ModelDeployment.Proto(); got.GetReplicas() != 0 || got.Resources != nil {
		t.Errorf("Proto() = %v, want 0 replicas and no resources", got)
	}
}

func TestParseCPU(t *testing.T) {
	for in, want := range map[string]uint32{"500m": 500, "2": 2000, "0.5": 500, "1.25": 1250, " 3 ": 3000, "1m": 1} {
		got, err := ParseCPU(in)
		if err != nil || got.Milli != want {
			t.Errorf("ParseCPU(%q) = %v, %v; want %dm", in, got, err, want)
		}
	}
	for in, want := range map[string]string{
		"":        `invalid CPU quantity "": want cores (2, 0.5) or millicores (500m)`,
		"2 cores": `invalid CPU quantity "2 cores": want cores (2, 0.5) or millicores (500m)`,
		"-1":      `invalid CPU quantity "-1": want cores (2, 0.5) or millicores (500m)`,
		"1/2":     `invalid CPU quantity "1/2": want cores (2, 0.5) or millicores (500m)`,
		"1e3":     `invalid CPU quantity "1e3": want cores (2, 0.5) or millicores (500m)`,
		"0":       `invalid CPU quantity "0": must be more than 0`,
		"0.0005":  `invalid CPU quantity "0.0005": must be a whole number of millicores`,
		"1.5m":    `invalid CPU quantity "1.5m": must be a whole number of millicores`,
		"5000000": `invalid CPU quantity "5000000": too large`,
	} {
		if _, err := ParseCPU(in); err == nil || err.Error() != want {
			t.Errorf("ParseCPU(%q) error %v, want %q", in, err, want)
		}
	}
}

func TestResourcesInDocument(t *testing.T) {
	doc := func(res string) string {
		return "resource: ModelDeployment\nresourceVersion: v1\nmetadata: {name: m}\nspec:\n  model: /m\n  placement: {accelerator: a}\n  resources: " + res + "\n"
	}
	for res, want := range map[string]uint32{"{cpu: 2}": 2000, "{cpu: 0.5}": 500, "{cpu: '1.5'}": 1500, "{cpu: 250m}": 250} {
		f, err := Parse([]byte(doc(res)))
		if err != nil {
			t.Errorf("resources %s: %v", res, err)
			continue
		}
		if got := f.Resources[0].ModelDeployment.Proto().GetResources().GetCpuMilli(); got != want {
			t.Errorf("resources %s: cpu %dm, want %dm", res, got, want)
		}
	}
	for res, want := range map[string][]string{
		"{cpu: 0}":          {`document 1 (modeldeployment/m): spec.resources.cpu: invalid CPU quantity "0": must be more than 0`},
		"{cpu: [1]}":        {`document 1 (modeldeployment/m): spec.resources.cpu: must be a CPU quantity such as 2, 0.5 or 500m, got a list`},
		"{memory: 8GB}":     {`document 1 (modeldeployment/m): spec.resources.memory: invalid quantity "8GB": unknown suffix "GB", write 8G (decimal) or 8Gi (binary)`},
		"{gpu: 1, cpu: 1x}": {`document 1 (modeldeployment/m): spec.resources.gpu: unknown field`, `document 1 (modeldeployment/m): spec.resources.cpu: invalid CPU quantity "1x": want cores (2, 0.5) or millicores (500m)`},
		"2":                 {`document 1 (modeldeployment/m): spec.resources: must be a mapping, got 2`},
	} {
		_, err := Parse([]byte(doc(res)))
		var perr *Error
		if !errors.As(err, &perr) {
			t.Errorf("resources %s: error %v, want problems", res, err)
			continue
		}
		var got []string
		for _, p := range perr.Problems {
			got = append(got, p.String())
		}
		if !slices.Equal(got, want) {
			t.Errorf("resources %s:\n%s\nwant:\n%s", res, strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	}
}

func TestModelDeploymentCheck(t *testing.T) {
	big := int64(1) << 33
	s := &ModelDeploymentSpec{Model: "/m", Replicas: &big, Placement: Placement{Accelerator: "a"}}
	s.SetDefaults("m")
	got := s.Check()
	if len(got) != 1 || got[0].GetField() != "spec.replicas" || got[0].GetDescription() != "must be at most 4294967295, got 8589934592" {
		t.Errorf("Check() = %v", got)
	}
}

// TestResidencyFields: docs/residency.md's deployment fields reach the API, and bad
// values are named with their field and rule.
func TestResidencyFields(t *testing.T) {
	const accs = `resource: Accelerator
resourceVersion: v1
metadata: {name: home}
spec: {device: l4, tenancy: shared, maxModels: 3}
---
resource: Accelerator
resourceVersion: v1
metadata: {name: fast}
spec: {device: l4}
---
`
	f, err := Parse([]byte(accs + `resource: ModelDeployment
resourceVersion: v1
metadata: {name: chat}
spec:
  model: /models/chat
  placement: {accelerator: home}
  residency: onDemand
  priority: interactive
  slo: {ttftMs: 800}
  engine: {kind: sim, memoryPercent: 60, quantization: fp8}
`))
	if err != nil {
		t.Fatal(err)
	}
	got := f.Resources[2].ModelDeployment.Proto()
	if got.Residency != pb.Residency_RESIDENCY_ON_DEMAND || got.Priority != pb.Priority_PRIORITY_INTERACTIVE ||
		got.GetSlo().GetTtftMs() != 800 || got.Engine.Quantization != "fp8" {
		t.Fatalf("Proto() = %v", got)
	}
	for _, tc := range []struct{ spec, want string }{
		{"residency: lazy", `spec.residency: must be pinned, warm or onDemand, got "lazy"`},
		{"priority: urgent", `spec.priority: must be interactive, standard or background, got "urgent"`},
		{"slo: {ttftMs: 0}", `spec.slo.ttftMs: must be at least 1, got 0`},
		{"slo: {ttftMs: -5}", `spec.slo.ttftMs: must be at least 1, got -5`},
		{"slo: {}", `spec.slo.ttftMs: required: the p95 time to first token in milliseconds (leave slo out for no target)`},
		{"slo: {ttftMs: fast}", `spec.slo.ttftMs: must be an integer, got "fast"`},
		{"slo: {ttft: 800}", `spec.slo.ttft: unknown field`},
		{"engine: {kind: sim, memoryPercent: 60, quantization: q4 k m}", `spec.engine.quantization: "q4 k m" must be one word without spaces (e.g. bf16, fp8, awq, q4_k_m)`},
	} {
		doc := accs + "resource: ModelDeployment\nresourceVersion: v1\nmetadata: {name: m}\nspec:\n  model: /m\n  placement: {accelerator: home}\n  " + tc.spec + "\n"
		_, err := Parse([]byte(doc))
		var perr *Error
		if !errors.As(err, &perr) {
			t.Errorf("%s: error %v, want problems", tc.spec, err)
			continue
		}
		var all []string
		for _, p := range perr.Problems {
			all = append(all, p.String())
		}
		if !slices.Contains(all, "document 3 (modeldeployment/m): "+tc.want) {
			t.Errorf("%s: problems %q, want %q", tc.spec, all, tc.want)
		}
	}
	_, err = Parse([]byte(accs + "resource: ModelDeployment\nresourceVersion: v1\nmetadata: {name: m}\nspec: {model: /m, placement: {accelerator: fast}, residency: warm}\n"))
	if err == nil || !strings.Contains(err.Error(), `spec.residency: an onDemand or warm deployment needs a shared accelerator: "fast" is dedicated`) {
		t.Errorf("warm on a dedicated accelerator: %v", err)
	}
}
