package engines

import (
	"flag"
	"os"
	"strings"
	"testing"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

var rewrite = flag.Bool("rewrite", false, "rewrite docs/engines.md's memory table from Rules")

const (
	docs       = "../../docs/engines.md"
	tableStart = "<!-- memory table: go test ./internal/engines -rewrite -->\n"
	tableEnd   = "<!-- end of memory table -->\n"
)

// docs/engines.md shows Rules as they are: the table is made from them.
func TestDocsShowTheRules(t *testing.T) {
	raw, err := os.ReadFile(docs)
	if err != nil {
		t.Fatal(err)
	}
	text := string(raw)
	i, j := strings.Index(text, tableStart), strings.Index(text, tableEnd)
	if i < 0 || j < i {
		t.Fatalf("%s has no memory table between %q and %q", docs, tableStart, tableEnd)
	}
	got, want := text[i+len(tableStart):j], Markdown()
	if got == want {
		return
	}
	if *rewrite {
		if err := os.WriteFile(docs, []byte(text[:i+len(tableStart)]+want+text[j:]), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("%s's memory table differs from Rules; rewrite it with go test ./internal/engines -rewrite", docs)
}

// A share the engine's overshoot alone would fill is refused naming both
// numbers; above it, the knob is the share less the overshoot.
func TestKnobBelowTheShare(t *testing.T) {
	vllm := &pb.EngineSpec{Kind: "vllm"}
	if _, err := For(vllm).KnobMiB(1151); err == nil || !strings.Contains(err.Error(), "1151 MiB") || !strings.Contains(err.Error(), "1434 MiB") {
		t.Errorf("a 1151 MiB vLLM share: %v, want a refusal naming 1151 MiB and 1434 MiB", err)
	}
	if knob, err := For(vllm).KnobMiB(2303); err != nil || knob != 2303-1434 {
		t.Errorf("a 2303 MiB vLLM share: knob %d, %v; want %d", knob, err, 2303-1434)
	}
	sim := &pb.EngineSpec{Kind: "sim", Args: []string{"--dialect", "vllm", "--dialect=llamacpp"}}
	if k := SpeaksKind(sim); k != "llamacpp" {
		t.Errorf("a sim whose last --dialect is llamacpp follows %q's rule", k)
	}
	if knob, err := For(sim).KnobMiB(100); err != nil || knob != 100 {
		t.Errorf("llama.cpp has no overshoot: knob %d, %v; want the share", knob, err)
	}
}
