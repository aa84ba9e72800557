package residency_test

import (
	"strings"
	"testing"
	"time"
)

// TestPlantedBugIsCaught runs only with the residency_plantbug build tag,
// which removes the I3 guard from the controller and its own check: the
// world's independent checker must catch busy engines being stopped.
//
//	go test -tags residency_plantbug -run TestPlantedBugIsCaught ./node/residency/
func TestPlantedBugIsCaught(t *testing.T) {
	if !plantedBug {
		t.Skip("needs -tags residency_plantbug")
	}
	for seed := uint64(1); seed <= 20; seed++ {
		w, _ := chaos(t, seed, 20*time.Minute)
		for _, v := range w.violations {
			if strings.Contains(v, "I3") {
				t.Logf("seed %d: caught %s", seed, v)
				if len(w.ctrlViolations) != 0 {
					t.Fatalf("the controller's own check reported %v although the tag skips it", w.ctrlViolations[0])
				}
				return
			}
		}
	}
	t.Fatal("20 seeds with the I3 guard removed and the world saw no I3 violation: the checker is blind")
}
