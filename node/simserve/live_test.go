package simserve

import (
	"path/filepath"
	"reflect"
	"testing"
)

// The live matrix reports through Summarize; on the simulated matrix's own
// cells it must reach the same ratios, worst mixes and flags as Matrix, so
// that both reports mean the same thing.
func TestSummarizeAgreesWithMatrix(t *testing.T) {
	cfg, err := LoadConfig(filepath.Join("..", "..", "examples", "serve", "home.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	res, err := Matrix(cfg, 1, 300)
	if err != nil {
		t.Fatal(err)
	}
	again := &MatrixResult{Card: res.Card, Models: res.Models, Cells: res.Cells}
	Summarize(cfg, again)
	if !reflect.DeepEqual(again.Relative, res.Relative) || !reflect.DeepEqual(again.WorstMix, res.WorstMix) {
		t.Fatalf("Summarize: relative %v / %v, Matrix: %v / %v", again.Relative, again.WorstMix, res.Relative, res.WorstMix)
	}
	if !reflect.DeepEqual(again.Flags, res.Flags) {
		t.Fatalf("Summarize flags %v, Matrix flags %v", again.Flags, res.Flags)
	}
	if len(res.Flags) == 0 {
		t.Fatal("the home matrix flags no pair: the comparison of flags proves nothing")
	}
	if got, want := len(Sets(len(cfg.Models))), len(res.Cells)/len(Mixes); got != want {
		t.Fatalf("Sets: %d sets, Matrix ran %d", got, want)
	}
}
