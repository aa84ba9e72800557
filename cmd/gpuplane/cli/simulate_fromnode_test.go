package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuplane/gpuplane/node/servesim"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// TestWhatIfAddTakesTheStateMachinesShare checks that a deployment added
// by --add is sized as the state machine sizes a replica on the card:
// memoryPercent 45 of a 23034 MiB card is 10365 MiB, memory 10000Mi is
// 10000 MiB.
func TestWhatIfAddTakesTheStateMachinesShare(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "add.yaml")
	doc := `resource: ModelDeployment
resourceVersion: v1
metadata: {name: extra}
spec:
  model: sim://tiny
  placement: {accelerator: small}
  engine: {kind: sim, memoryPercent: 45}
---
resource: ModelDeployment
resourceVersion: v1
metadata: {name: fixed}
spec:
  model: sim://tiny
  placement: {accelerator: small}
  engine: {kind: sim, memory: 10000Mi}
`
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	base := &servesim.Config{Card: servesim.CardConfig{Name: "n/0", MemoryGiB: 23034.0 / 1024}}
	cfg, what, err := applyWhatIf(base, fromNode{add: []string{path}})
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Models) != 2 || !strings.Contains(strings.Join(what, ";"), "with extra") {
		t.Fatalf("models %+v, what %q", cfg.Models, what)
	}
	for i, want := range []float64{10365.0 / 1024, 10000.0 / 1024} {
		if got := cfg.Models[i].MemoryGiB; got != want {
			t.Errorf("%s: %g GiB, want %g", cfg.Models[i].Name, got, want)
		}
	}
	// A deployment with no replica on the card: its status's share.
	m := &pb.ModelDeployment{Spec: &pb.ModelSpec{Engine: &pb.EngineSpec{TensorParallel: 2}}, Status: &pb.ModelStatus{MemoryPerReplicaMib: 2 * 81559}}
	if got := perCard(m); got != 81559 {
		t.Errorf("perCard of a two-card replica = %d, want 81559", got)
	}
}
