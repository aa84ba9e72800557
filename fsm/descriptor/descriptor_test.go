package descriptor

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// The example of docs/descriptors.md, verbatim.
const specExample = `
resource: Accelerator
resourceVersion: v1
metadata: {name: small}
spec:
  device: l4
  tenancy: shared          # dedicated (default) | shared
  maxModels: 2             # shared only: models per card (default 2)
  devicesPerReplica: 1     # dedicated only: whole cards per replica, on one node
---
resource: ModelDeployment
resourceVersion: v1
metadata: {name: chat}
spec:
  model: /models/llama-3.1-8b-instruct   # path or URI of the weights
  servedModelName: chat                  # defaults to metadata.name
  replicas: 2
  placement: {accelerator: small}        # required: the scheduler never picks hardware kinds
  engine:
    kind: vllm               # vllm | llamacpp | ollama | command | sim
    memoryPercent: 45        # share of one card's memory, 1..100
    # memory: 20Gi           # or an absolute share (not both)
    computePercent: 50       # optional SM share, 1..100; needs a memory share
    maxModelLen: 8192
    tensorParallel: 1
    pipelineParallel: 1
    args: []                 # extra engine arguments
    env: {}
`

func TestParseSpecExample(t *testing.T) {
	f, err := Parse([]byte(specExample))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if len(f.Resources) != 2 {
		t.Fatalf("got %d resources, want 2", len(f.Resources))
	}
	acc := f.Resources[0]
	if acc.Kind != KindAccelerator || acc.Name != "small" || acc.Document != 1 || acc.Ref() != "accelerator/small" {
		t.Errorf("first resource = %+v", acc)
	}
	want := &pb.AcceleratorSpec{Device: "l4", Tenancy: pb.Tenancy_TENANCY_SHARED, MaxModels: 2, DevicesPerReplica: 1}
	if got := acc.Accelerator.Proto(); !proto.Equal(got, want) {
		t.Errorf("accelerator proto = %v, want %v", got, want)
	}
	md := f.Resources[1]
	if md.Kind != KindModelDeployment || md.Name != "chat" || md.Document != 2 {
		t.Fatalf("second resource = %+v", md)
	}
	s := md.ModelDeployment
	if s.Model != "/models/llama-3.1-8b-instruct" || *s.Replicas != 2 || s.Placement.Accelerator != "small" ||
		s.Engine.Kind != "vllm" || *s.Engine.MemoryPercent != 45 || *s.Engine.ComputePercent != 50 ||
		*s.Engine.MaxModelLen != 8192 || s.Engine.Memory != nil {
		t.Errorf("deployment spec = %+v, engine %+v", s, s.Engine)
	}
}

func TestParseDefaultsAndOrder(t *testing.T) {
	const file = `
resource: ModelDeployment
resourceVersion: v1
metadata: {name: chat}
spec:
  model: /m
  placement: {accelerator: big}
  engine: {memory: 20Gi}
---
---
resource: Accelerator
resourceVersion: v1
metadata: {name: big}
spec: {device: h100}
---
resource: Accelerator
resourceVersion: v1
metadata: {name: shared-l4}
spec: {device: l4, tenancy: Shared}
`
	f, err := Parse([]byte(file))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	refs := func(rs []Resource) []string {
		var out []string
		for _, r := range rs {
			out = append(out, r.Where())
		}
		return out
	}
	if got, want := refs(f.ApplyOrder()), []string{
		"document 3 (accelerator/big)", "document 4 (accelerator/shared-l4)", "document 1 (modeldeployment/chat)",
	}; !slices.Equal(got, want) {
		t.Errorf("ApplyOrder = %q, want %q", got, want)
	}
	if got, want := refs(f.DeleteOrder()), []string{
		"document 1 (modeldeployment/chat)", "document 3 (accelerator/big)", "document 4 (accelerator/shared-l4)",
	}; !slices.Equal(got, want) {
		t.Errorf("DeleteOrder = %q, want %q", got, want)
	}
	md := f.Resources[0].ModelDeployment
	if md.ServedModelName != "chat" || *md.Replicas != 1 || md.Engine.Kind != "vllm" ||
		*md.Engine.TensorParallel != 1 || *md.Engine.PipelineParallel != 1 || md.Engine.Memory.MiB != 20480 {
		t.Errorf("defaults not applied: %+v engine %+v", md, md.Engine)
	}
	if got, want := f.Resources[1].Accelerator.Proto(), (&pb.AcceleratorSpec{Device: "h100", Tenancy: pb.Tenancy_TENANCY_DEDICATED, DevicesPerReplica: 1}); !proto.Equal(got, want) {
		t.Errorf("dedicated defaults = %v, want %v", got, want)
	}
	if got, want := f.Resources[2].Accelerator.Proto(), (&pb.AcceleratorSpec{Device: "l4", Tenancy: pb.Tenancy_TENANCY_SHARED, MaxModels: 2, DevicesPerReplica: 1}); !proto.Equal(got, want) {
		t.Errorf("shared defaults = %v, want %v", got, want)
	}
}

// accel builds an Accelerator document with the given spec lines.
func accel(name string, spec ...string) string {
	return "resource: Accelerator\nresourceVersion: v1\nmetadata:\n  name: " + name + "\nspec:\n  " + strings.Join(spec, "\n  ") + "\n"
}

func TestParseProblems(t *testing.T) {
	tests := []struct {
		name string
		file string
		want []string // every problem, in order
	}{
		{
			name: "unknown field in spec",
			file: accel("small", "device: l4", "tenacy: shared"),
			want: []string{"document 1 (accelerator/small): spec.tenacy: unknown field"},
		},
		{
			name: "unknown nested field",
			file: `resource: ModelDeployment
resourceVersion: v1
metadata: {name: chat}
spec:
  model: /m
  placement: {accelerator: small, nodeSelecter: {zone: a}}
  engine: {memoryPercent: 40, memoryPercentage: 40}
`,
			want: []string{
				"document 1 (modeldeployment/chat): spec.placement.nodeSelecter: unknown field",
				"document 1 (modeldeployment/chat): spec.engine.memoryPercentage: unknown field",
			},
		},
		{
			name: "unknown top-level and metadata fields",
			file: "resource: Accelerator\nresourceVersion: v1\nkind: x\nmetadata: {name: a, namespace: b}\nspec: {device: l4}\n",
			want: []string{
				"document 1 (accelerator/a): kind: unknown field",
				"document 1 (accelerator/a): metadata.namespace: unknown field",
			},
		},
		{
			name: "a simulate serve config",
			file: "card: {name: home, memoryGiB: 24}\nmodels:\n  - name: chat\n    memoryGiB: 9\n",
			want: []string{"document 1: this is a `gpuplane simulate serve` config (it has card and models, no resource): run `gpuplane simulate serve --config FILE`"},
		},
		{
			name: "resourceVersion v2",
			file: strings.Replace(accel("small", "device: l4"), "v1", "v2", 1),
			want: []string{"document 1 (accelerator/small): resourceVersion: must be v1, got v2"},
		},
		{
			name: "missing header fields",
			file: "spec: {device: l4}\n",
			want: []string{
				"document 1: resource: required: Accelerator or ModelDeployment",
				"document 1: resourceVersion: required: v1",
				"document 1: metadata.name: is required",
			},
		},
		{
			name: "unknown resource kind",
			file: "resource: Cluster\nresourceVersion: v1\nmetadata: {name: a}\nspec: {}\n",
			want: []string{`document 1: resource: must be Accelerator or ModelDeployment, got "Cluster"`},
		},
		{
			name: "bad names",
			file: accel("Small_1", "device: l4") + "---\n" + accel("-a", "device: l4") + "---\n" + accel(strings.Repeat("a", 64), "device: l4"),
			want: []string{
				`document 1 (accelerator/Small_1): metadata.name: "Small_1" must be a DNS label: at most 63 lowercase letters, digits or '-', starting and ending with a letter or digit`,
				`document 2 (accelerator/-a): metadata.name: "-a" must be a DNS label: at most 63 lowercase letters, digits or '-', starting and ending with a letter or digit`,
				`document 3 (accelerator/` + strings.Repeat("a", 64) + `): metadata.name: "` + strings.Repeat("a", 64) + `" must be a DNS label: at most 63 lowercase letters, digits or '-', starting and ending with a letter or digit`,
			},
		},
		{
			name: "duplicate name",
			file: accel("a", "device: l4") + "---\n" + accel("a", "device: h100"),
			want: []string{`document 2 (accelerator/a): metadata.name: accelerator "a" is already defined by document 1`},
		},
		{
			name: "shared with devicesPerReplica 2 (rule 3)",
			file: accel("small", "device: l4", "tenancy: shared", "devicesPerReplica: 2"),
			want: []string{"document 1 (accelerator/small): spec.devicesPerReplica: a shared accelerator splits a single device: must be 1, got 2 (rule 3)"},
		},
		{
			name: "maxModels on dedicated (rule 4)",
			file: accel("big", "device: h100", "maxModels: 3"),
			want: []string{"document 1 (accelerator/big): spec.maxModels: is for shared accelerators only (rule 4); a dedicated replica gets whole cards"},
		},
		{
			name: "maxModels and devicesPerReplica below 1 (rule 4)",
			file: accel("a", "device: l4", "tenancy: shared", "maxModels: 0") + "---\n" + accel("b", "device: l4", "devicesPerReplica: -1"),
			want: []string{
				"document 1 (accelerator/a): spec.maxModels: must be between 1 and 64 models per card, got 0 (rule 4)",
				"document 2 (accelerator/b): spec.devicesPerReplica: must be at least 1, got -1",
			},
		},
		{
			name: "bad tenancy and missing device",
			file: accel("a", "tenancy: exclusive"),
			want: []string{
				"document 1 (accelerator/a): spec.device: is required: the device kind this accelerator places on (see `gpuplane devices list`)",
				`document 1 (accelerator/a): spec.tenancy: must be dedicated or shared, got "exclusive"`,
			},
		},
		{
			name: "wrong types",
			file: accel("a", "device: 4", "tenancy: [shared]", "maxModels: two", "devicesPerReplica: 1.5"),
			want: []string{
				"document 1 (accelerator/a): spec.device: must be a string, got 4 (quote it)",
				"document 1 (accelerator/a): spec.tenancy: must be a string, got a list",
				`document 1 (accelerator/a): spec.maxModels: must be an integer, got "two"`,
				"document 1 (accelerator/a): spec.devicesPerReplica: must be an integer, got 1.5",
			},
		},
		{
			name: "wrong types in deployment",
			file: `resource: ModelDeployment
resourceVersion: v1
metadata: {name: chat}
spec:
  model: /m
  replicas: "2"
  placement: small
  engine:
    args: [--x, 1]
    env: {A: b, B: 2}
`,
			want: []string{
				`document 1 (modeldeployment/chat): spec.replicas: must be an integer, got "2"`,
				`document 1 (modeldeployment/chat): spec.placement: must be a mapping, got "small"`,
				"document 1 (modeldeployment/chat): spec.engine.args[1]: must be a string, got 1 (quote it)",
				"document 1 (modeldeployment/chat): spec.engine.env.B: must be a string, got 2 (quote it)",
			},
		},
		{
			name: "document not a mapping",
			file: "- a\n- b\n",
			want: []string{"document 1: must be a mapping with resource, resourceVersion, metadata and spec, got a list"},
		},
		{
			name: "missing spec",
			file: "resource: Accelerator\nresourceVersion: v1\nmetadata: {name: a}\n",
			want: []string{"document 1 (accelerator/a): spec: required"},
		},
		{
			name: "syntax error stops at its document",
			file: accel("a", "device: l4") + "---\nresource: [\n---\n" + accel("b", "device: l4"),
			want: []string{"document 2: yaml: line 8: did not find expected node content"},
		},
		{
			name: "duplicate key",
			file: accel("a", "device: l4", "device: h100"),
			want: []string{`document 1 (accelerator/a): spec.device: set twice, at lines 6 and 7`},
		},
		{
			name: "empty file",
			file: "---\n# nothing\n",
			want: []string{"no resources found"},
		},
		{
			name: "deployment rules",
			file: `resource: ModelDeployment
resourceVersion: v1
metadata: {name: chat}
spec:
  replicas: -1
  placement: {}
  engine: {kind: tgi, memoryPercent: 0, memory: 1Gi, computePercent: 101, maxModelLen: 0, tensorParallel: 0}
---
resource: ModelDeployment
resourceVersion: v1
metadata: {name: solo}
spec:
  model: /m
  placement: {accelerator: Fast}
  engine: {computePercent: 50}
`,
			want: []string{
				"document 1 (modeldeployment/chat): spec.model: is required: the path or URI of the weights",
				"document 1 (modeldeployment/chat): spec.replicas: must be at least 0, got -1",
				"document 1 (modeldeployment/chat): spec.placement.accelerator: is required: a deployment is placed on an accelerator, never on a device",
				`document 1 (modeldeployment/chat): spec.engine.kind: must be one of vllm, llamacpp, ollama, sglang, command, sim, got "tgi"`,
				"document 1 (modeldeployment/chat): spec.engine.memoryPercent: must be between 1 and 100, got 0",
				"document 1 (modeldeployment/chat): spec.engine.memory: set memoryPercent or memory, not both",
				"document 1 (modeldeployment/chat): spec.engine.computePercent: must be between 1 and 100, got 101",
				"document 1 (modeldeployment/chat): spec.engine.maxModelLen: must be at least 1, got 0",
				"document 1 (modeldeployment/chat): spec.engine.tensorParallel: must be at least 1, got 0",
				`document 2 (modeldeployment/solo): spec.placement.accelerator: "Fast" must be a DNS label: at most 63 lowercase letters, digits or '-', starting and ending with a letter or digit`,
				"document 2 (modeldeployment/solo): spec.engine.computePercent: needs a memory share: set memoryPercent or memory too (rule 10)",
			},
		},
		{
			name: "deployment against an accelerator in the same file (rules 8, 9)",
			file: accel("shared", "device: l4", "tenancy: shared") + "---\n" + accel("pair", "device: h100", "devicesPerReplica: 2") + `---
resource: ModelDeployment
resourceVersion: v1
metadata: {name: a}
spec: {model: /m, placement: {accelerator: shared}}
---
resource: ModelDeployment
resourceVersion: v1
metadata: {name: b}
spec: {model: /m, placement: {accelerator: pair}, engine: {tensorParallel: 1}}
`,
			want: []string{
				`document 3 (modeldeployment/a): spec.engine.memoryPercent: accelerator "shared" is shared: set memoryPercent or memory, or the model would be sized against the whole card (rule 8)`,
				`document 4 (modeldeployment/b): spec.engine.tensorParallel: tensorParallel × pipelineParallel = 1 × 1 = 1 must equal devicesPerReplica 2 of accelerator "pair" (rule 9)`,
			},
		},
		{
			name: "every problem in every document at once",
			file: strings.Replace(accel("A", "device: l4", "tenancy: shared", "devicesPerReplica: 2", "extra: 1"), "v1", "v3", 1) +
				"---\n" + accel("b", "device: l4", "maxModels: '3'"),
			want: []string{
				"document 1 (accelerator/A): spec.extra: unknown field",
				"document 1 (accelerator/A): resourceVersion: must be v1, got v3",
				`document 1 (accelerator/A): metadata.name: "A" must be a DNS label: at most 63 lowercase letters, digits or '-', starting and ending with a letter or digit`,
				"document 1 (accelerator/A): spec.devicesPerReplica: a shared accelerator splits a single device: must be 1, got 2 (rule 3)",
				`document 2 (accelerator/b): spec.maxModels: must be an integer, got "3"`,
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := Parse([]byte(tt.file))
			var perr *Error
			if !errors.As(err, &perr) {
				t.Fatalf("Parse = %v, %v; want *Error", f, err)
			}
			var got []string
			for _, p := range perr.Problems {
				got = append(got, p.String())
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
			}
			if err.Error() != strings.Join(got, "\n") {
				t.Errorf("Error() = %q, want the problems one per line", err.Error())
			}
		})
	}
}

func TestParseQuantity(t *testing.T) {
	tests := []struct {
		in      string
		wantMiB uint64
		wantErr string
	}{
		{in: "20Gi", wantMiB: 20480},
		{in: "512Mi", wantMiB: 512},
		{in: "1Ti", wantMiB: 1 << 20},
		{in: "1.5Gi", wantMiB: 1536},
		{in: "2048Ki", wantMiB: 2},
		{in: "1073741824", wantMiB: 1024},
		// Decimal suffixes are powers of 1000, rounded up to a whole MiB:
		// 20G = 20×10⁹ bytes = 19073.49 MiB.
		{in: "20G", wantMiB: 19074},
		{in: "1G", wantMiB: 954},
		{in: "500M", wantMiB: 477},
		{in: "1.5T", wantMiB: 1430512},
		{in: "2000k", wantMiB: 2},
		{in: "1P", wantMiB: 953674317},
		{in: "1048576000", wantMiB: 1000},
		// Bytes that are not a whole MiB round up too.
		{in: "1000", wantMiB: 1},
		{in: "1048577", wantMiB: 2},
		{in: "0.5Ki", wantMiB: 1},
		{in: "20GB", wantErr: `invalid quantity "20GB": unknown suffix "GB", write 20G (decimal) or 20Gi (binary)`},
		{in: "20K", wantErr: `invalid quantity "20K": unknown suffix "K", write 20k (decimal) or 20Ki (binary)`},
		{in: "20Xi", wantErr: `invalid quantity "20Xi": unknown suffix "Xi", want bytes, or a number with a decimal suffix k, M, G, T, P (20G = 20×10⁹ bytes) or a binary one Ki, Mi, Gi, Ti, Pi (20Gi = 20×2³⁰ bytes)`},
		{in: "0Gi", wantErr: `invalid quantity "0Gi": must be more than 0`},
		{in: "0G", wantErr: `invalid quantity "0G": must be more than 0`},
		{in: "-1Gi", wantErr: `invalid quantity "-1Gi": want bytes, or a number with a decimal suffix k, M, G, T, P (20G = 20×10⁹ bytes) or a binary one Ki, Mi, Gi, Ti, Pi (20Gi = 20×2³⁰ bytes)`},
		{in: "Gi", wantErr: `invalid quantity "Gi": want bytes, or a number with a decimal suffix k, M, G, T, P (20G = 20×10⁹ bytes) or a binary one Ki, Mi, Gi, Ti, Pi (20Gi = 20×2³⁰ bytes)`},
		{in: "1..5Gi", wantErr: `invalid quantity "1..5Gi": want bytes, or a number with a decimal suffix k, M, G, T, P (20G = 20×10⁹ bytes) or a binary one Ki, Mi, Gi, Ti, Pi (20Gi = 20×2³⁰ bytes)`},
		{in: "99999999999E", wantErr: `invalid quantity "99999999999E": too large`},
	}
	for _, tt := range tests {
		q, err := ParseQuantity(tt.in)
		switch {
		case tt.wantErr != "":
			if err == nil || err.Error() != tt.wantErr {
				t.Errorf("ParseQuantity(%q) = %v, %v; want error %q", tt.in, q, err, tt.wantErr)
			}
		case err != nil || q.MiB != tt.wantMiB:
			t.Errorf("ParseQuantity(%q) = %v, %v; want %dMi", tt.in, q, err, tt.wantMiB)
		}
	}
}

func TestMemoryQuantityInDocument(t *testing.T) {
	doc := func(memory string) string {
		return "resource: ModelDeployment\nresourceVersion: v1\nmetadata: {name: m}\nspec:\n  model: /m\n  placement: {accelerator: a}\n  engine: {memory: " + memory + "}\n"
	}
	for in, want := range map[string]uint64{"20Gi": 20480, "512Mi": 512, "1Ti": 1 << 20, "21474836480": 20480, `"1Gi"`: 1024, "20G": 19074, `"80G"`: 76294} {
		f, err := Parse([]byte(doc(in)))
		if err != nil {
			t.Errorf("memory %s: %v", in, err)
			continue
		}
		if got := f.Resources[0].ModelDeployment.Engine.Memory.MiB; got != want {
			t.Errorf("memory %s = %dMi, want %dMi", in, got, want)
		}
	}
	for in, want := range map[string]string{
		"20GB":  `document 1 (modeldeployment/m): spec.engine.memory: invalid quantity "20GB": unknown suffix "GB", write 20G (decimal) or 20Gi (binary)`,
		"0G":    `document 1 (modeldeployment/m): spec.engine.memory: invalid quantity "0G": must be more than 0`,
		"true":  `document 1 (modeldeployment/m): spec.engine.memory: must be a memory quantity such as 20Gi or 512Mi, got true`,
		"[1Gi]": `document 1 (modeldeployment/m): spec.engine.memory: must be a memory quantity such as 20Gi or 512Mi, got a list`,
	} {
		_, err := Parse([]byte(doc(in)))
		if err == nil || err.Error() != want {
			t.Errorf("memory %s: error %v, want %q", in, err, want)
		}
	}
}

func TestAcceleratorSpecCheck(t *testing.T) {
	two := int64(2)
	s := &AcceleratorSpec{Device: "l4", Tenancy: "SHARED", DevicesPerReplica: &two}
	got := s.Check()
	if len(got) != 1 || got[0].Field != "spec.devicesPerReplica" || !strings.Contains(got[0].Description, "a shared accelerator splits a single device") {
		t.Errorf("Check = %v", got)
	}
	s = &AcceleratorSpec{Device: "l4", Tenancy: "Shared", MaxModels: &two}
	if got := s.Check(); len(got) != 0 {
		t.Errorf("Check = %v, want none", got)
	}
	if got := s.Proto(); got.GetTenancy() != pb.Tenancy_TENANCY_SHARED || got.GetMaxModels() != 2 {
		t.Errorf("Proto = %v", got)
	}
}

// TestAnchorsAndMergeKeys checks that documents may share settings with
// YAML anchors and merge keys (<<), the mapping's own keys winning.
func TestAnchorsAndMergeKeys(t *testing.T) {
	file := `resource: ModelDeployment
resourceVersion: v1
metadata: {name: chat}
spec:
  model: /models/a
  placement: {accelerator: small}
  engine: &engine {kind: vllm, memoryPercent: 45, maxModelLen: 8192}
---
resource: ModelDeployment
resourceVersion: v1
metadata: {name: code}
spec:
  model: /models/b
  placement: {accelerator: small}
  engine:
    <<: *engine
    memoryPercent: 30
`
	f, err := Parse([]byte(file))
	if err != nil {
		t.Fatal(err)
	}
	e := f.Resources[1].ModelDeployment.Engine
	if e.Kind != "vllm" || e.MemoryPercent == nil || *e.MemoryPercent != 30 || e.MaxModelLen == nil || *e.MaxModelLen != 8192 {
		t.Errorf("merged engine = %+v, want vllm, memoryPercent 30, maxModelLen 8192", e)
	}
}
