package cardmanager

import (
	"testing"
	"time"
)

// TimeScale runs the controllers' clock and ticks that much faster than
// the wall clock (a dev and benchmark option); without it they run on the
// wall clock.
func TestTimeScaleRunsTheControllersClockFaster(t *testing.T) {
	m := New(Options{TimeScale: 10})
	if m.opts.Tick != 100*time.Millisecond {
		t.Fatalf("tick %v at time scale 10, want 100ms", m.opts.Tick)
	}
	c, ok := m.clock.(scaledClock)
	if !ok {
		t.Fatalf("clock %T at time scale 10, want the scaled clock", m.clock)
	}
	// A second of wall time since the origin is ten on the clock.
	c.origin = time.Now().Add(-time.Second)
	if d := c.Now().Sub(c.origin); d < 10*time.Second {
		t.Fatalf("scaled clock %v after a second of wall time, want ≥ 10s", d)
	}
	for _, scale := range []float64{0, 1} {
		m := New(Options{TimeScale: scale})
		if _, ok := m.clock.(wallClock); !ok || m.opts.Tick != time.Second {
			t.Fatalf("time scale %g: clock %T, tick %v; want the wall clock and 1s", scale, m.clock, m.opts.Tick)
		}
	}
}
