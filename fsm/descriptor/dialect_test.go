package descriptor

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

// TestSimDialect: spec.engine.dialect travels as the EngineSpec's dialect
// field and reads back as the field (as does the leading --dialect
// argument of a spec stored before the field); it is refused on other
// kinds, with an unknown value, and with what the engine it speaks cannot
// do (adapters on Ollama, sleep levels outside vLLM).
func TestSimDialect(t *testing.T) {
	f, err := Parse([]byte(`resource: ModelDeployment
resourceVersion: v1
metadata: {name: chat}
spec:
  model: llama3.2:1b
  placement: {accelerator: home}
  engine: {kind: sim, memoryPercent: 50, dialect: ollama, args: ["--load-seconds", "2"]}
`))
	if err != nil {
		t.Fatal(err)
	}
	p := f.Resources[0].ModelDeployment.Proto()
	if want := []string{"--load-seconds", "2"}; p.Engine.Dialect != "ollama" || !slices.Equal(p.Engine.Args, want) {
		t.Fatalf("dialect %q, args %v; want ollama, %v", p.Engine.Dialect, p.Engine.Args, want)
	}
	back := ModelDeploymentSpecFromProto(p)
	if back.Engine.Dialect != "ollama" || !slices.Equal(back.Engine.Args, []string{"--load-seconds", "2"}) {
		t.Fatalf("read back: dialect %q, args %v", back.Engine.Dialect, back.Engine.Args)
	}
	p.Engine.Dialect, p.Engine.Args = "", []string{"--dialect", "ollama", "--load-seconds", "2"}
	old := ModelDeploymentSpecFromProto(p)
	if old.Engine.Dialect != "ollama" || !slices.Equal(old.Engine.Args, []string{"--load-seconds", "2"}) {
		t.Fatalf("read back from the arguments: dialect %q, args %v", old.Engine.Dialect, old.Engine.Args)
	}
	for doc, want := range map[string]string{
		`engine: {kind: vllm, memoryPercent: 50, dialect: vllm}`:                                                  `spec.engine.dialect: only a sim engine takes a dialect (kind is "vllm")`,
		`engine: {kind: sim, memoryPercent: 50, dialect: tgi}`:                                                    `spec.engine.dialect: must be one of vllm, llamacpp, ollama, sglang, got "tgi"`,
		"engine: {kind: sim, memoryPercent: 50, dialect: ollama}\n  adapters: [{name: sql, source: /a, rank: 8}]": "spec.adapters: a sim engine speaking ollama cannot serve LoRA adapters, as Ollama cannot",
		"engine: {kind: sim, memoryPercent: 50, dialect: ollama, sleepLevel: 2}\n  residency: warm":               "spec.engine.sleepLevel: only vLLM has sleep levels: a sim engine speaking ollama sleeps as ollama does",
		"engine: {kind: vllm, memoryPercent: 50, sleepLevel: 3}\n  residency: warm":                               "spec.engine.sleepLevel: must be 1 (the weights wait in host RAM) or 2",
		"engine: {kind: vllm, memoryPercent: 50, sleepLevel: 2}":                                                  "spec.engine.sleepLevel: a pinned model never sleeps",
		"engine: {kind: llamacpp, memoryPercent: 50, sleepLevel: 1}\n  residency: warm":                           `spec.engine.sleepLevel: only vLLM has sleep levels (kind is "llamacpp")`,
	} {
		_, err := Parse([]byte("resource: ModelDeployment\nresourceVersion: v1\nmetadata: {name: chat}\nspec:\n  model: /m\n  placement: {accelerator: home}\n  " + doc + "\n"))
		var perr *Error
		if !errors.As(err, &perr) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", doc, err, want)
		}
	}
}
