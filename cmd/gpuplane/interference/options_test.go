package interference

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/node/servesim"
)

// Run refuses options it cannot run with, naming the field and the rule,
// before it starts anything (a caller other than the CLI gets the same
// checks as the CLI's flags).
func TestRunRefusesBadOptions(t *testing.T) {
	good := Options{Duration: time.Second, TimeScale: 1, Via: ViaFronts}
	if err := good.Validate(); err != nil {
		t.Fatalf("good options refused: %v", err)
	}
	for _, c := range []struct {
		o     Options
		field string
	}{
		{Options{Duration: 0, TimeScale: 1, Via: ViaFronts}, "Duration"},
		{Options{Duration: time.Second, TimeScale: 0.5, Via: ViaFronts}, "TimeScale"},
		{Options{Duration: time.Second, TimeScale: 1, Via: "nowhere"}, "Via"},
	} {
		_, err := Run(context.Background(), &servesim.Config{}, nil, []servesim.Variant{{Name: "default"}}, c.o, io.Discard, nil)
		if err == nil || !strings.Contains(err.Error(), c.field) {
			t.Errorf("Run with %+v: %v, want an error naming %s", c.o, err, c.field)
		}
	}
	if _, err := Run(context.Background(), &servesim.Config{}, nil, nil, good, io.Discard, nil); err == nil || !strings.Contains(err.Error(), "no variant") {
		t.Errorf("Run with no variant: %v, want an error saying so", err)
	}
}
