package agent_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/cmd/gpuplane/agent"
	"github.com/gpuplane/gpuplane/internal/testutil"
)

// TestCardMemoryAddsUpWithModelsAsleep: on a --dev agent with an onDemand
// sim model put to sleep by its idle timeout and a warm one put to sleep
// by the operator, `devices get` counts each sleeping model at its
// residual (what its engine keeps on the card, as the controller's plan
// shows it), not at its share, and USED + SLEEPING + FREE is the card's
// memory; `residency plan` and gpuplane_card_memory_bytes account the
// same way (used + sleeping + free = usable).
func TestCardMemoryAddsUpWithModelsAsleep(t *testing.T) {
	n := devNode(t, "acct", agent.GatewayConfig{})
	deploySim(t, n, "pin", "pinned", "--tokens-per-second", "0")
	deploySim(t, n, "w", "warm", "--tokens-per-second", "0", "--sleep-residual-mib", "300")
	applySpec(t, n, "od", `resource: ModelDeployment
resourceVersion: v1
metadata: {name: od}
spec:
  model: /models/od
  residency: onDemand
  idle: {sleepAfter: 1s, unloadAfter: 1h}
  placement: {accelerator: shared}
  engine: {kind: sim, memoryPercent: 20, args: ["--tokens-per-second", "0", "--load-seconds", "0.2", "--sleep-residual-mib", "200"]}
`)
	waitCold(t, n, "od")
	waitServed(t, n.a.GatewayURL(), "od")
	waitReplica(t, n, "od", "Sleeping")
	waitReplica(t, n, "w", "Resident")
	gpuplane(t, n, "models", "unload", "w")
	waitReplica(t, n, "w", "Sleeping")
	waitReplica(t, n, "od", "Sleeping")

	// What the controller counts for each sleeping model (its residual,
	// once the card's next memory sample measured it: until then a sleep
	// holds its footprint), in MiB rounded up as the node reports it.
	var residuals int
	var plan []map[string]any
	var card map[string]any
	testutil.Eventually(t, 30*time.Second, "the residuals measured", func() error {
		if err := json.Unmarshal([]byte(gpuplane(t, n, "residency", "plan", "-o", "json")), &plan); err != nil || len(plan) != 1 {
			return fmt.Errorf("residency plan: %v, %d cards", err, len(plan))
		}
		card = plan[0]
		for _, e := range card["entries"].([]any) {
			if e := e.(map[string]any); e["state"] == "Sleeping" && (jsonInt(e["costBytes"]) == 0 || jsonInt(e["costBytes"]) >= 1<<30) {
				return fmt.Errorf("%s asleep at cost %d, want its residual (300 or 200 MiB) measured", e["model"], jsonInt(e["costBytes"]))
			}
		}
		return nil
	})
	usable := jsonInt(card["usableBytes"])
	if used, sleeping, free := jsonInt(card["usedBytes"]), jsonInt(card["sleepingBytes"]), jsonInt(card["freeBytes"]); used+sleeping+free != usable || sleeping <= 0 {
		t.Errorf("residency plan: used %d + sleeping %d + free %d = %d, usable %d (want equal, sleeping > 0)", used, sleeping, free, used+sleeping+free, usable)
	}
	for _, e := range card["entries"].([]any) {
		e := e.(map[string]any)
		if e["state"] == "Sleeping" {
			residuals += int((jsonInt(e["costBytes"]) + 1<<20 - 1) >> 20)
		}
	}

	var dev struct{ Cards []cardJSON }
	testutil.Eventually(t, 30*time.Second, "devices get counting the residuals", func() error {
		if err := json.Unmarshal([]byte(gpuplane(t, n, "devices", "get", "l4", "-o", "json")), &dev); err != nil {
			return err
		}
		if len(dev.Cards) != 1 {
			return fmt.Errorf("%d cards", len(dev.Cards))
		}
		if c := dev.Cards[0]; c.SleepingMib != residuals {
			return fmt.Errorf("SLEEPING %d MiB, the plan's residuals %d MiB", c.SleepingMib, residuals)
		}
		return nil
	})
	c := dev.Cards[0]
	t.Logf("devices get: memory %d used %d reserved %d resident %d sleeping %d free %d MiB", c.MemoryMib, c.UsedMib, c.ReservedMib, c.ResidentMib, c.SleepingMib, c.FreeMib)
	// pin is resident, w and od asleep: each share is a fifth of the card.
	shares := c.MemoryMib / 5
	if c.UsedMib+c.SleepingMib+c.FreeMib != c.MemoryMib {
		t.Errorf("USED %d + SLEEPING %d + FREE %d = %d MiB, the card has %d", c.UsedMib, c.SleepingMib, c.FreeMib, c.UsedMib+c.SleepingMib+c.FreeMib, c.MemoryMib)
	}
	if c.SleepingMib <= 0 || c.SleepingMib >= 2*shares || c.ResidentMib != shares || c.UsedMib != shares {
		t.Errorf("SLEEPING %d MiB (want the residuals of two sleeping models, under their shares of %d each), RESIDENT %d and USED %d (want pin's share)",
			c.SleepingMib, shares, c.ResidentMib, c.UsedMib)
	}

	used, sleeping, free := metric(t, n, "gpuplane_card_memory_bytes", `state="used"`),
		metric(t, n, "gpuplane_card_memory_bytes", `state="sleeping"`), metric(t, n, "gpuplane_card_memory_bytes", `state="free"`)
	if used+sleeping+free != float64(usable) || sleeping <= 0 {
		t.Errorf("gpuplane_card_memory_bytes: used %.0f + sleeping %.0f + free %.0f, usable %d (want equal, sleeping > 0)", used, sleeping, free, usable)
	}
}

// applySpec applies one descriptor through n.
func applySpec(t *testing.T, n *node, name, spec string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), name+".yaml")
	if err := os.WriteFile(path, []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	gpuplane(t, n, "apply", "-f", path)
}

// jsonInt reads an integer protojson wrote: int64 fields are strings.
func jsonInt(v any) int64 {
	switch x := v.(type) {
	case string:
		n, _ := strconv.ParseInt(x, 10, 64)
		return n
	case float64:
		return int64(x)
	}
	return 0
}
