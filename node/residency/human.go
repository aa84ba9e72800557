package residency

import (
	"fmt"
	"time"
)

// dur is a duration as people read it in a reason: tenths of a second
// under ten seconds (3.1s), whole seconds above (42s, 6m29s).
func dur(d time.Duration) string {
	switch {
	case d <= 0:
		return "0s"
	case d < 10*time.Second:
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

// count is n and its noun, plural unless n is 1 ("1 request", "3 requests").
func count(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// wakeIn says what a wake costs: its time, or that none was measured or
// declared yet.
func wakeIn(d time.Duration) string {
	if d <= 0 {
		return "wake time not measured yet"
	}
	return "wake takes " + dur(d)
}
