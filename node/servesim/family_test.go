package servesim

import (
	"bytes"
	"slices"
	"strings"
	"testing"
)

func TestFamilyIsDrawnFromTheSeedWithinItsDistributions(t *testing.T) {
	a, err := GenerateFamily(3, 12, "")
	if err != nil {
		t.Fatal(err)
	}
	b, err := GenerateFamily(3, 12, "")
	if err != nil {
		t.Fatal(err)
	}
	c, err := GenerateFamily(4, 12, "")
	if err != nil {
		t.Fatal(err)
	}
	same := true
	for i := range a {
		if !bytes.Equal(a[i].YAML, b[i].YAML) {
			t.Fatalf("%s: the same seed drew two configs:\n%s\n%s", a[i].Name, a[i].YAML, b[i].YAML)
		}
		same = same && a[i].Cfg.Card.MemoryGiB == c[i].Cfg.Card.MemoryGiB && len(a[i].Cfg.Models) == len(c[i].Cfg.Models)
	}
	if same {
		t.Fatal("seeds 3 and 4 drew the same family")
	}
	for _, fc := range a {
		cfg := fc.Cfg
		if n := len(cfg.Models); n < 3 || n > 12 {
			t.Errorf("%s: %d models, want 3–12", fc.Name, n)
		}
		if !slices.Contains(familyCards, cfg.Card.MemoryGiB) {
			t.Errorf("%s: a %g GiB card is not one of %v", fc.Name, cfg.Card.MemoryGiB, familyCards)
		}
		var reserved float64
		for _, m := range cfg.Models {
			if m.PeakGiB > cfg.usableGiB() {
				t.Errorf("%s: %s's peak %g GiB does not fit the card alone", fc.Name, m.Name, m.PeakGiB)
			}
			if m.residency.Reserves() {
				reserved += m.MemoryGiB
			}
			if m.Class == "background" && m.Residency != "onDemand" {
				t.Errorf("%s: background %s is %s", fc.Name, m.Name, m.Residency)
			}
		}
		if reserved > 0.7*cfg.usableGiB()+1e-9 {
			t.Errorf("%s: reserved %g GiB > 70%% of usable %g", fc.Name, reserved, cfg.usableGiB())
		}
		// What --family-dir writes runs again with --config.
		again, err := ParseConfig(fc.Name+".yaml", fc.YAML)
		if err != nil || len(again.Models) != len(cfg.Models) {
			t.Fatalf("%s: written config does not parse back: %v", fc.Name, err)
		}
	}
}

func TestFamilyRunPrintsARowPerConfigAndTheGoals(t *testing.T) {
	fam, err := GenerateFamily(5, 2, "")
	if err != nil {
		t.Fatal(err)
	}
	var rows []string
	fr, err := RunFamily(fam, 5, false, func(r FamilyRow) { rows = append(rows, r.Config) })
	if err != nil {
		t.Fatal(err)
	}
	if len(fr.Rows) != 2 || len(rows) != 2 || fr.Summary.Configs != 2 {
		t.Fatalf("rows %v, summary %+v", rows, fr.Summary)
	}
	for _, r := range fr.Rows {
		if r.AtSLO[PolicyIdeal] < r.AtSLO["gpuplane"] || r.AtSLO[PolicyIdeal] < r.AtSLO[PolicyStaticBest] {
			t.Errorf("%s: ideal holds %d, below another policy: %v", r.Config, r.AtSLO[PolicyIdeal], r.AtSLO)
		}
	}
	var sb strings.Builder
	if err := WriteFamilyTable(&sb, fr); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{fam[0].Name, fam[1].Name, "gpuplane ≥ static-best on", "ideal − 2", "median ×"} {
		if !strings.Contains(sb.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, sb.String())
		}
	}
}
