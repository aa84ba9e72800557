package residency

import (
	"math"
	"time"
)

// gapHist is a model's recent inter-arrival gaps as a histogram on a log2
// scale: bucket 0 holds gaps under gapBase, bucket i ≥ 1 those in
// [gapBase·2^(i−1), gapBase·2^i), the last everything longer. Each new gap
// weighs 1 and older ones fade by gapKeep per gap, so the histogram follows
// the model's own pace: a busy model's last few minutes, a rare one's last
// days. From it the controller answers "this model has been idle for t:
// how likely is its next request within h?" (the idle-time histogram of
// "Serverless in the Wild", USENIX ATC'20, in place of a fixed keep-alive): bursty traffic (a coding
// service that goes quiet for minutes) has a long tail, so a long idle
// spell predicts a longer one, which a rate alone cannot tell.
type gapHist struct {
	w     [gapBuckets]float64
	total float64
}

const (
	gapBuckets = 24
	gapBase    = 0.125 // seconds; the last bucket starts at about 12 days
	gapKeep    = 1 - 1.0/128
	// gapMinSeen is the weight of gaps below which the histogram says
	// nothing (the caller falls back to the rate).
	gapMinSeen = 8
)

func gapBucket(g float64) int {
	if g < gapBase {
		return 0
	}
	return min(gapBuckets-1, 1+int(math.Floor(math.Log2(g/gapBase))))
}

// bounds is bucket i's range in seconds (the last is open: +Inf).
func gapBounds(i int) (lo, hi float64) {
	if i == 0 {
		return 0, gapBase
	}
	lo = gapBase * math.Exp2(float64(i-1))
	if i == gapBuckets-1 {
		return lo, math.Inf(1)
	}
	return lo, 2 * lo
}

func (h *gapHist) add(g float64) {
	for i := range h.w {
		h.w[i] *= gapKeep
	}
	h.total = h.total*gapKeep + 1
	h.w[gapBucket(g)]++
}

// survival is the weight of gaps longer than t, taking gaps as spread
// evenly inside their bucket (the open last bucket counts whole).
func (h *gapHist) survival(t float64) float64 {
	i := gapBucket(t)
	s := 0.0
	for j := i + 1; j < gapBuckets; j++ {
		s += h.w[j]
	}
	lo, hi := gapBounds(i)
	if math.IsInf(hi, 1) {
		return s + h.w[i]
	}
	return s + h.w[i]*(hi-t)/(hi-lo)
}

// within is the probability that a model idle for idle gets its next
// request within the following h, and whether enough gaps were seen to
// tell. Idle longer than every gap remembered reads as 0: the model has
// gone quiet in a way its history does not show.
func (h *gapHist) within(idle, horizon time.Duration) (float64, bool) {
	if h.total < gapMinSeen {
		return 0, false
	}
	t := idle.Seconds()
	s := h.survival(t)
	if s <= 1e-9*h.total {
		return 0, true
	}
	return (s - h.survival(t+horizon.Seconds())) / s, true
}
