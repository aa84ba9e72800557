package residency

import (
	"cmp"
	"slices"
	"time"
)

// Profile is what the controller has learned about a (model, quantization,
// engine, device).
type Profile struct {
	Key ProfileKey
	// LoadTime and WakeTime are EWMAs of observed cold loads and wakes.
	LoadTime time.Duration
	WakeTime time.Duration
	// Footprint is the most memory seen while resident; Peak the most seen
	// while loading; Residual the last seen while asleep.
	Footprint int64
	Peak      int64
	Residual  int64
	// TokensPerSecond is an EWMA over finished requests.
	TokensPerSecond float64
	Loads, Wakes    int
	Failures        int
	// mem are the same memory figures per replica share: an engine sizes
	// its KV pool by its share, so only a replica of the same share takes
	// them for its own (ledger.go). Read and written from the controllers'
	// loop only.
	mem map[int64]*memFigures
}

// memFigures are the memory figures learned at one share.
type memFigures struct{ footprint, peak, residual int64 }

// profileAlpha weighs the newest observation of a time.
const profileAlpha = 0.3

func ewmaDuration(old time.Duration, n int, obs time.Duration) time.Duration {
	if n == 0 {
		return obs
	}
	return time.Duration((1-profileAlpha)*float64(old) + profileAlpha*float64(obs))
}

// profiler learns per ProfileKey. It outlives replicas: a model unloaded and
// placed again keeps what was learned.
type profiler struct {
	m map[ProfileKey]*Profile
}

// Profiler keeps what controllers learn, per variant. A node gives one to
// all of its cards' controllers (Config.Profiler), so that what one card
// learned about a variant serves a replica of it on another card and
// outlives the card's controller. Like a Controller it is not safe for
// concurrent use: the controllers sharing it run from one loop.
type Profiler struct{ p profiler }

// NewProfiler returns an empty Profiler.
func NewProfiler() *Profiler { return &Profiler{} }

// Profiles returns copies of every profile, ordered by key.
func (p *Profiler) Profiles() []Profile { return p.p.all() }

func (p *profiler) get(k ProfileKey) *Profile {
	if p.m == nil {
		p.m = make(map[ProfileKey]*Profile)
	}
	pr := p.m[k]
	if pr == nil {
		pr = &Profile{Key: k}
		p.m[k] = pr
	}
	return pr
}

func (pr *Profile) loaded(d time.Duration) {
	pr.LoadTime = ewmaDuration(pr.LoadTime, pr.Loads, d)
	pr.Loads++
}

func (pr *Profile) woke(d time.Duration) {
	pr.WakeTime = ewmaDuration(pr.WakeTime, pr.Wakes, d)
	pr.Wakes++
}

// memAt returns the figures learned at share, made empty if none.
func (pr *Profile) memAt(share int64) *memFigures {
	if pr.mem == nil {
		pr.mem = make(map[int64]*memFigures)
	}
	m := pr.mem[share]
	if m == nil {
		m = &memFigures{}
		pr.mem[share] = m
	}
	return m
}

// memory learns a sample in state s of a replica whose share's figures are
// m (memAt).
func (pr *Profile) memory(s State, bytes int64, m *memFigures) {
	switch s {
	case Resident, Draining:
		pr.Footprint = max(pr.Footprint, bytes)
		m.footprint = max(m.footprint, bytes)
	case Loading, Waking:
		pr.Peak = max(pr.Peak, bytes)
		m.peak = max(m.peak, bytes)
	case Sleeping:
		pr.Residual = bytes
		m.residual = bytes
	}
}

func (pr *Profile) tokens(tokens int64, elapsed time.Duration) {
	if tokens <= 0 || elapsed <= 0 {
		return
	}
	tps := float64(tokens) / elapsed.Seconds()
	if pr.TokensPerSecond == 0 {
		pr.TokensPerSecond = tps
	} else {
		pr.TokensPerSecond = (1-profileAlpha)*pr.TokensPerSecond + profileAlpha*tps
	}
}

// all returns copies of every profile, ordered by key.
func (p *profiler) all() []Profile {
	out := make([]Profile, 0, len(p.m))
	for _, pr := range p.m {
		out = append(out, *pr)
	}
	slices.SortFunc(out, func(a, b Profile) int { return compareKeys(a.Key, b.Key) })
	return out
}

func compareKeys(a, b ProfileKey) int {
	return cmp.Or(cmp.Compare(a.Model, b.Model), cmp.Compare(a.Quantization, b.Quantization),
		cmp.Compare(a.Engine, b.Engine), cmp.Compare(a.Device, b.Device))
}
