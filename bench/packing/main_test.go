package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuplane/gpuplane/cluster/scheduler/placesim"
)

func TestTheSplitIsHalfTheFamily(t *testing.T) {
	if len(PodLists) != 24 {
		t.Fatalf("%d pod lists, want openb's 24", len(PodLists))
	}
	n := 0
	for l := range Tune {
		if !strings.Contains(strings.Join(PodLists, ","), l) {
			t.Errorf("tune list %q is not one of the pod lists", l)
		}
		n++
	}
	if n != 12 {
		t.Errorf("%d lists to tune on, want half of 24", n)
	}
}

// TestTableFromTheListsAtHand runs one seed of the default list against
// whatever openb folder is here, asking for a list and a node list that
// may be absent: the table has the present list's row, marked as a tune
// list, and names what was absent. It skips where no openb folder exists.
func TestTableFromTheListsAtHand(t *testing.T) {
	dir := placesim.OpenBDir()
	if dir == "" {
		t.Skip("no openb folder (set GPUPLANE_OPENB_DIR)")
	}
	out := filepath.Join(t.TempDir(), "table.md")
	cfg := config{dir: dir, seeds: 1, jobs: 2, out: out}
	if err := cfg.parse("130", "default,fgd", "default,cpu300", "gpu,all", "fgd,bestfit"); err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	if err := cfg.run(&log); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	table := string(data)
	if !strings.Contains(table, "| default | tune | gpu | 130 % |") {
		t.Errorf("no row for the default list on the GPU nodes:\n%s", table)
	}
	for _, f := range []string{"openb_pod_list_cpu300.csv", NodeLists["all"]} {
		_, statErr := os.Stat(filepath.Join(dir, f))
		if absent := os.IsNotExist(statErr); absent && !strings.Contains(table, strings.TrimSuffix(strings.TrimPrefix(f, "openb_pod_list_"), ".csv")) {
			t.Errorf("%s is absent from %s but the table does not say so:\n%s", f, dir, table)
		}
	}
}

func TestBadFlagsNameTheFlag(t *testing.T) {
	for _, tc := range []struct{ inflate, policies, lists, nodes, want string }{
		{"90", "default", "", "gpu", "-inflate"},
		{"130", "greedy", "", "gpu", "-policies"},
		{"130", "default", "cpu999", "gpu", "-lists"},
		{"130", "default", "", "cpu", "-nodes"},
	} {
		cfg := config{dir: "x", seeds: 1}
		err := cfg.parse(tc.inflate, tc.policies, tc.lists, tc.nodes, "fgd")
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("parse(%q, %q, %q, %q) = %v, want an error naming %s", tc.inflate, tc.policies, tc.lists, tc.nodes, err, tc.want)
		}
	}
}
