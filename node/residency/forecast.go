package residency

import (
	"math"
	"time"
)

// forecast estimates one model's arrivals from what it has seen: a decayed
// arrival rate (use frequency for eviction value) and an EWMA of
// inter-arrival gaps (when the next request is due, for prewarm).
type forecast struct {
	// count is the decayed number of arrivals as of at.
	count float64
	at    time.Time
	last  time.Time
	// gap and dev are the EWMA of inter-arrival gaps and of their absolute
	// deviation, in seconds; gaps counts the gaps seen.
	gap  float64
	dev  float64
	gaps int
	// hist is the same gaps' distribution (gaps.go).
	hist gapHist
}

// gapAlpha weighs the newest gap: a few arrivals move the estimate, one
// outlier does not.
const gapAlpha = 0.3

func decay(dt, halfLife time.Duration) float64 {
	if dt <= 0 {
		return 1
	}
	return math.Exp2(-dt.Seconds() / halfLife.Seconds())
}

func (f *forecast) observe(now time.Time, halfLife time.Duration) {
	f.count = f.count*decay(now.Sub(f.at), halfLife) + 1
	f.at = now
	if !f.last.IsZero() {
		g := now.Sub(f.last).Seconds()
		f.hist.add(g)
		if f.gaps == 0 {
			f.gap, f.dev = g, g/2
		} else {
			f.dev = (1-gapAlpha)*f.dev + gapAlpha*math.Abs(g-f.gap)
			f.gap = (1-gapAlpha)*f.gap + gapAlpha*g
		}
		f.gaps++
	}
	f.last = now
}

// rate is the decayed arrival rate in requests per minute: the decayed count
// divided by the mean age a half-life decay gives (halfLife / ln 2).
func (f *forecast) rate(now time.Time, halfLife time.Duration) float64 {
	if f.count == 0 {
		return 0
	}
	c := f.count * decay(now.Sub(f.at), halfLife)
	return c * math.Ln2 / halfLife.Minutes()
}

// next is the predicted time of the next request and its tolerance; ok is
// false until two gaps have been seen.
func (f *forecast) next() (at time.Time, tol time.Duration, ok bool) {
	if f.gaps < 2 {
		return time.Time{}, 0, false
	}
	tol = time.Duration(math.Max(2*f.dev, f.gap/4) * float64(time.Second))
	return f.last.Add(time.Duration(f.gap * float64(time.Second))), tol, true
}

// expectedWithin reports whether a request is predicted in [now, now+h]
// (allowing the tolerance on either side).
func (f *forecast) expectedWithin(now time.Time, h time.Duration) bool {
	at, tol, ok := f.next()
	if !ok {
		return false
	}
	return !now.After(at.Add(tol)) && !at.After(now.Add(h))
}

// backWithin is the probability that the model's next request comes
// within h from now: from the idle-time histogram once it has seen enough
// gaps, else from the decayed rate as a Poisson process (1 − e^(−λh)).
func (f *forecast) backWithin(now time.Time, h time.Duration, rate float64) float64 {
	if f.last.IsZero() {
		return 0
	}
	if p, ok := f.hist.within(now.Sub(f.last), h); ok {
		return p
	}
	return 1 - math.Exp(-rate*h.Minutes())
}
