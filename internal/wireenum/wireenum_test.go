package wireenum

import (
	"testing"

	"github.com/gpuplane/gpuplane/internal/cardfit"
	"github.com/gpuplane/gpuplane/internal/class"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// TestEveryWireValueMapsBack checks that each named residency and priority
// reads back as itself, that unspecified reads as the default, and that
// every internal value has a wire value: a value added on one side only
// fails here.
func TestEveryWireValueMapsBack(t *testing.T) {
	for v := range pb.Residency_name {
		r := pb.Residency(v)
		want := r
		if r == pb.Residency_RESIDENCY_UNSPECIFIED {
			want = pb.Residency_RESIDENCY_PINNED
		}
		if got := ResidencyPB(Residency(r)); got != want {
			t.Errorf("residency %v reads back as %v, want %v", r, got, want)
		}
	}
	for _, r := range []cardfit.Residency{cardfit.Pinned, cardfit.Warm, cardfit.OnDemand} {
		if got := Residency(ResidencyPB(r)); got != r {
			t.Errorf("residency %v reads back as %v", r, got)
		}
	}
	for v := range pb.Priority_name {
		p := pb.Priority(v)
		want := p
		if p == pb.Priority_PRIORITY_UNSPECIFIED {
			want = pb.Priority_PRIORITY_STANDARD
		}
		if got := Priority(Class(p)); got != want {
			t.Errorf("priority %v reads back as %v, want %v", p, got, want)
		}
	}
	for c := range class.Count {
		if got := Class(Priority(c)); got != c {
			t.Errorf("class %v reads back as %v", c, got)
		}
	}
}
