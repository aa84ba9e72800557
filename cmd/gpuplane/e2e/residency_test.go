package e2e

import (
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestOnDemandModelsShareOneCard is issue 13's first must-show as far as the
// replicated part goes, through the real binary on `agent --dev` (l4=2):
// three onDemand sim models whose shares sum to 160 % of a card are all
// placed on one card of a shared accelerator with maxModels 3, reserving
// nothing (devices get: RESERVED 0Mi), the other card left unbound;
// `replicas list` shows each replica's residency, and `audit log
// --resource model/NAME` shows its residency transitions with their reasons.
func TestOnDemandModelsShareOneCard(t *testing.T) {
	requireBinary(t)
	dataDir := filepath.Join(t.TempDir(), "data")
	a := newAgent(t, dataDir)
	a.start()
	defer a.kill()
	models := map[string]string{"chat": "60", "embed": "55", "asr": "45"}
	t.Cleanup(func() {
		for m := range models {
			for _, pid := range enginePIDs(t, dataDir, m) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	mustGpuplane(t, a.url(), "accelerators", "create", "home", "--device", "l4", "--tenancy", "shared", "--max-models", "3")
	for _, m := range []string{"chat", "embed", "asr"} {
		mustGpuplane(t, a.url(), "models", "deploy", m, "--accelerator", "home", "--model", "/models/"+m, "--engine", "sim",
			"--memory-percent", models[m], "--residency", "onDemand")
	}
	// Each engine reaches Running and reports Resident (today every placed
	// replica is loaded: the residency controller is what unloads them).
	var rows []map[string]string
	waitFor(t, "three Resident replicas", 90*time.Second, func() bool {
		rows = parseTable(t, mustGpuplane(t, a.url(), "replicas", "list"))
		n := 0
		for _, r := range rows {
			if r["RESIDENCY"] == "Resident" {
				n++
			}
		}
		return n == 3
	})
	for _, r := range rows {
		if r["NODE"] == "-" || r["CARDS"] != "0" {
			t.Fatalf("replica not on card 0: %v\n%v", r, rows)
		}
	}
	list := parseTable(t, mustGpuplane(t, a.url(), "models", "list"))
	for _, r := range list {
		if r["RESIDENCY"] != "onDemand" || r["PRIORITY"] != "standard" {
			t.Errorf("models list row %v: want RESIDENCY onDemand, PRIORITY standard", r)
		}
	}
	cards := parseTable(t, mustGpuplane(t, a.url(), "devices", "get", "l4"))
	if len(cards) != 2 {
		t.Fatalf("devices get l4: %v", cards)
	}
	// 60 % + 55 % + 45 % of a 23034Mi card loaded at once (nothing evicts
	// yet), none of it reserved; card 1 is not bound.
	if c := cards[0]; c["ACCELERATOR"] != "home" || c["RESERVED"] != "0Mi" || c["RESIDENT"] != "36853Mi" || c["FREE"] != "0Mi" {
		t.Errorf("card 0: %v, want bound to home, RESERVED 0Mi, RESIDENT 36853Mi, FREE 0Mi", c)
	}
	if c := cards[1]; c["ACCELERATOR"] != "-" || c["REPLICAS"] != "-" {
		t.Errorf("card 1: %v, want unbound", c)
	}

	log := mustGpuplane(t, a.url(), "audit", "log", "--resource", "model/chat")
	for _, want := range []string{"ApplyModel chat", "starting, loading (engine starting)", "running, resident (engine running: loaded when placed)"} {
		if !strings.Contains(log, want) {
			t.Errorf("audit log --resource model/chat lacks %q:\n%s", want, log)
		}
	}
	if strings.Contains(log, "embed") {
		t.Errorf("audit log --resource model/chat shows another model:\n%s", log)
	}
}
