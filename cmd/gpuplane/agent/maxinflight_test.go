package agent_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/gpuplane/gpuplane/cmd/gpuplane/agent"
	"github.com/gpuplane/gpuplane/internal/testutil"
)

// TestDeploymentMaxInFlight: spec.engine.maxInFlight overrides what the
// gateway learns from the engine's arguments (--max-num-seqs 8 here): one
// request runs on the engine, the others wait in the gateway's queue.
func TestDeploymentMaxInFlight(t *testing.T) {
	n := devNode(t, "mif", agent.GatewayConfig{})
	gpuplane(t, n, "accelerators", "create", "shared", "--device", "l4", "--tenancy", "shared", "--max-models", "4")
	spec := `resource: ModelDeployment
resourceVersion: v1
metadata: {name: one}
spec:
  model: /models/one
  placement: {accelerator: shared}
  engine: {kind: sim, memoryPercent: 20, maxInFlight: 1, args: ["--max-num-seqs", "8", "--tokens-per-second", "5"]}
`
	path := filepath.Join(t.TempDir(), "one.yaml")
	if err := os.WriteFile(path, []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	gpuplane(t, n, "apply", "-f", path)
	waitServed(t, n.a.GatewayURL(), "one")

	c := openaiClient(n)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			if _, err := c.Completions.New(ctx, openai.CompletionNewParams{Model: "one",
				Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("x")}, MaxTokens: openai.Int(20)}); err != nil {
				t.Errorf("a request: %v", err)
			}
		})
	}
	testutil.Eventually(t, 30*time.Second, "one request in flight and two queued", func() error {
		q, f := metric(t, n, "gpuplane_gateway_queue_depth", `replica="one/0"`), metric(t, n, "gpuplane_gateway_in_flight", `replica="one/0"`)
		if q != 2 || f != 1 {
			return fmt.Errorf("queued %v, in flight %v", q, f)
		}
		return nil
	})
	wg.Wait()
}
