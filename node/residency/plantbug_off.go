//go:build !residency_plantbug

package residency

// skipI3 is false in every real build. The residency_plantbug build tag sets
// it, removing the I3 guard (busy engines are never evicted, slept or
// drained except by higher-priority demand), so a chaos test can show that
// its independent checker catches the planted bug.
const skipI3 = false
