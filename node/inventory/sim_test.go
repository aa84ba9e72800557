package inventory

import (
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/gpuplane/gpuplane/internal/catalog"
)

func TestParseSimSpec(t *testing.T) {
	good := map[string][]SimEntry{
		"l4=2,h100=1":       {{"l4", 2}, {"h100", 1}},
		" L4 = 2 , H100=1 ": {{"l4", 2}, {"h100", 1}},
		"a100-40gb=8":       {{"a100-40gb", 8}},
		"t4=64":             {{"t4", 64}},
	}
	for spec, want := range good {
		got, err := ParseSimSpec(spec)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("ParseSimSpec(%q) = %v, %v; want %v", spec, got, err, want)
		}
	}
	known := strings.Join(catalog.Slugs(), ", ")
	bad := map[string]string{
		"":            `sim GPUs: empty spec; want KIND=COUNT[,KIND=COUNT...] such as l4=2,h100=1`,
		"  ":          `sim GPUs: empty spec; want KIND=COUNT[,KIND=COUNT...] such as l4=2,h100=1`,
		"l4=2,":       `sim GPUs "l4=2,": entry 2 is empty`,
		"l4":          `sim GPUs "l4": entry "l4" is not KIND=COUNT`,
		"l5=2":        `sim GPUs "l5=2": unknown device kind "l5"; known kinds: ` + known,
		"l4=two":      `sim GPUs "l4=two": count "two" for l4 is not a whole number from 1 to 64`,
		"l4=0":        `sim GPUs "l4=0": count "0" for l4 is not a whole number from 1 to 64`,
		"l4=-1":       `sim GPUs "l4=-1": count "-1" for l4 is not a whole number from 1 to 64`,
		"l4=65":       `sim GPUs "l4=65": count "65" for l4 is not a whole number from 1 to 64`,
		"l4=1,L4=2":   `sim GPUs "l4=1,L4=2": device kind "l4" is listed twice`,
		"h100=1;l4=1": `sim GPUs "h100=1;l4=1": count "1;l4=1" for h100 is not a whole number from 1 to 64`,
	}
	for spec, want := range bad {
		if _, err := ParseSimSpec(spec); err == nil || err.Error() != want {
			t.Errorf("ParseSimSpec(%q) error = %v, want %q", spec, err, want)
		}
	}
	if !strings.Contains(known, "a100-40gb, a100-80gb") {
		t.Errorf("known kinds %q are not listed sorted and comma-separated", known)
	}
}

var realUUID = regexp.MustCompile(`^GPU-[0-9a-f]{8}-[0-9a-f]{4}-8[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

func TestSimulated(t *testing.T) {
	cards, err := Simulated("node-a", "l4=2,h100=1")
	if err != nil {
		t.Fatal(err)
	}
	if len(cards) != 3 {
		t.Fatalf("got %d cards, want 3", len(cards))
	}
	for i, c := range cards {
		kind := []string{"l4", "l4", "h100"}[i]
		d, _ := catalog.BySlug(kind)
		if c.GetIndex() != uint32(i) || c.GetDevice() != kind || c.GetProduct() != d.Product ||
			c.GetMemoryMib() != d.MemoryMiB || c.GetArchitecture() != d.Architecture || c.GetFp8() != d.FP8 || !c.GetHealthy() {
			t.Errorf("card %d = %v, want index %d and the catalog's %s", i, c, i, kind)
		}
		if !realUUID.MatchString(c.GetUuid()) {
			t.Errorf("card %d UUID %q is not shaped like an NVML UUID", i, c.GetUuid())
		}
	}
	// Pinned: a simulated node must report the same cards after an upgrade.
	if got, want := cards[0].GetUuid(), pinnedSimUUID; got != want {
		t.Errorf("node-a card 0 UUID = %q, want %q", got, want)
	}

	again, _ := Simulated("node-a", "l4=2,h100=1")
	other, _ := Simulated("node-b", "l4=2,h100=1")
	kindChanged, _ := Simulated("node-a", "h100=1")
	seen := map[string]bool{}
	for i := range cards {
		if again[i].GetUuid() != cards[i].GetUuid() {
			t.Errorf("card %d UUID changed between calls: %q then %q", i, cards[i].GetUuid(), again[i].GetUuid())
		}
		for _, u := range []string{cards[i].GetUuid(), other[i].GetUuid()} {
			if seen[u] {
				t.Errorf("UUID %q appears twice across node-a and node-b", u)
			}
			seen[u] = true
		}
	}
	if kindChanged[0].GetUuid() == cards[0].GetUuid() {
		t.Errorf("an h100 at index 0 kept the UUID of the l4 that was there")
	}

	if _, err := Simulated("", "l4=1"); err == nil || err.Error() != "simulated cards need a node name: their UUIDs derive from it" {
		t.Errorf("Simulated without a node name: error %v", err)
	}
	if _, err := Simulated("n", "l4=x"); err == nil || err.Error() != `sim GPUs "l4=x": count "x" for l4 is not a whole number from 1 to 64` {
		t.Errorf("Simulated with a bad spec: error %v", err)
	}
}

const pinnedSimUUID = "GPU-de22448e-d5e5-8c91-a0d9-10e7557df315"
