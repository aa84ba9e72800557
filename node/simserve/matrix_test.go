package simserve

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"
)

// The matrix runs every model alone, every pair and the full set under
// every mix, and its report says which pair hurts whom.
func TestMatrixOnTheHomeCard(t *testing.T) {
	cfg, err := LoadConfig(filepath.Join("..", "..", "examples", "serve", "home.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	res, err := Matrix(cfg, 1, 300)
	if err != nil {
		t.Fatal(err)
	}
	n := len(cfg.Models)
	if want := (n + n*(n-1)/2 + 1) * len(Mixes); len(res.Cells) != want {
		t.Fatalf("%d cells, want %d", len(res.Cells), want)
	}
	for _, c := range res.Cells {
		if c.LedgerViolations != 0 {
			t.Fatalf("cell %v %s: %d ledger violations", c.Models, c.Mix, c.LedgerViolations)
		}
	}
	var txt, html bytes.Buffer
	if err := WriteMatrix(&txt, res); err != nil {
		t.Fatal(err)
	}
	if err := WriteMatrixHTML(&html, res); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + txt.String())
	for _, m := range cfg.Models {
		if !strings.Contains(html.String(), "<th>"+m.Name+"</th>") {
			t.Errorf("report lacks a row for %s", m.Name)
		}
	}
}
