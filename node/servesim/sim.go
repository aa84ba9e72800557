package servesim

import (
	"container/heap"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/gpuplane/gpuplane/node/gateway/queue"
)

// The engine model is the sim engine's (node/sim), made exact in
// virtual time: a load or wake copies weights at the card's copy bandwidth,
// split equally among engines copying at once; a running request first
// prefills its prompt, then decodes at TokensPerSecond × the engine's share
// of the card's compute (busy engines split it in proportion to their
// ComputePercent) ÷ (1 + α(C−1)) with C requests in its batch; a request
// starts only when the batch has room (MaxInFlight) and the KV pool holds
// its prompt next to the tokens the batch already holds, prompts and
// generated tokens alike (continuous batching). Between two events every
// rate is constant, so the loop jumps from event to event and integrates
// progress exactly: hours of trace take seconds.

type engState uint8

const (
	off engState = iota
	loading
	up
	goingToSleep
	asleep
	waking
	stopping
)

var engStateNames = [...]string{"off", "loading", "up", "goingToSleep", "asleep", "waking", "stopping"}

func (s engState) String() string { return engStateNames[s] }

// eps absorbs float rounding when progress reaches a threshold.
const eps = 1e-9

// request is one request's life in the simulation.
type request struct {
	a     Arrival
	seq   int
	class queue.Class
	qid   queue.ID
	eng   *engine
	// prefill, first and total are solo-seconds of work: the prompt done,
	// the first token out, the last token out.
	prefill, first, total float64
	// adapterWork is the adapter load included in them (0: none needed at
	// its last start).
	adapterWork float64
	done        float64
	started     float64
	firstAt     float64
	// charged is the output tokens counted for fairness so far.
	charged int
	waiting bool
	ended   bool
	// stream is the closed-loop stream (index+1) that sent it, or 0.
	stream int
	// warmup is true for a request that arrived during the warm-up: it
	// runs but is not measured.
	warmup bool
}

// generated is the output tokens produced so far.
func (r *request) generated(m *ModelConfig) int {
	if r.done <= r.prefill {
		return 0
	}
	g := int((r.done - r.prefill) * m.TokensPerSecond)
	return min(g, r.a.OutputTokens)
}

type engine struct {
	idx      int
	m        *ModelConfig
	state    engState
	mem      int64
	copyLeft float64
	running  []*request
	waiting  []*request
	// epoch invalidates the timer of an operation cut short.
	epoch int
	// maxInFlight is the batch: the model's, or the policy's (ollama's
	// NUM_PARALLEL).
	maxInFlight int
	draining    bool
	// lastUse is when the engine last finished a request or loaded.
	lastUse float64
	// adapters are the LoRA adapters loaded on the engine (Arrival.Adapter
	// numbers), least recently used first.
	adapters []int
	// loadedBefore: the model's weights were read once, so the host's page
	// cache holds them (the baselines' reloads).
	loadedBefore bool
}

func (e *engine) busy() bool { return len(e.running) > 0 }

func (e *engine) idle() bool { return len(e.running) == 0 && len(e.waiting) == 0 }

func (e *engine) copying() bool { return e.state == loading || e.state == waking }

func (e *engine) heldTokens() int {
	n := 0
	for _, r := range e.running {
		n += r.a.PromptTokens + r.generated(e.m)
	}
	return n
}

type timer struct {
	at  float64
	seq int
	fn  func()
}

type timerHeap []timer

func (h timerHeap) Len() int { return len(h) }
func (h timerHeap) Less(i, j int) bool {
	if h[i].at != h[j].at {
		return h[i].at < h[j].at
	}
	return h[i].seq < h[j].seq
}
func (h timerHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *timerHeap) Push(x any)   { *h = append(*h, x.(timer)) }
func (h *timerHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	*h = old[:len(old)-1]
	return t
}

// policy is what decides: which engines load, sleep and stop, and which
// request runs where and when. The simulator runs the engines.
type policy interface {
	start()
	arrive(r *request)
	// finished: r completed on its engine (already off it).
	finished(r *request)
	// copied: e's load or wake completed; it is up.
	copied(e *engine)
	// settled: e's sleep or stop completed.
	settled(e *engine)
	tick()
}

type sim struct {
	cfg     *Config
	seed    uint64
	now     float64
	end     float64
	hardEnd float64
	engines []*engine
	timers  timerHeap
	tseq    int
	pol     policy
	met     *metrics
	nreq    int
	// outstanding counts requests arrived and not ended.
	outstanding int
	closedRng   []*rand.Rand
	closedFails []int
	// closedSent counts each closed-loop stream's sends.
	closedSent []int
	usable     int64
	overMemory bool
	// observe, when set, runs after every step (tests).
	observe func(*sim)
	// overhead, when set, is each model's fixed per-request overhead
	// draws (replay.go): a closed-loop request reaches the node one draw
	// after its client sent it. onEnd, when set, hears of every request's
	// end (a request lost in the drain as failed).
	overhead [][]float64
	// livePaths delays a replayed live request by its own measured path
	// to the engine and adds its path back to its TTFT.
	livePaths bool
	ovRng     *rand.Rand
	onEnd     func(r *request, o outcome)
	// agentPriors gives the controller the deployments as the agent
	// does: shares without load, wake or memory priors.
	agentPriors bool
	// fronted sends requests as a replica's front does (replay.go): no
	// gateway queue before the engine (no in-flight cap, no token
	// reservation), the engine's own KV pool the only limit.
	fronted bool
	// alone, when > 0, replays only model alone-1's arrivals and
	// closed loops (ideal: each model on a card of its own).
	alone int
}

// drainAfter is how long the run continues after the last arrival for the
// requests still outstanding.
const drainAfter = 600.0

func newSim(cfg *Config, seed uint64, end float64) *sim {
	s := &sim{cfg: cfg, seed: seed, end: end, hardEnd: end + drainAfter, usable: cfg.usableBytes(), agentPriors: !cfg.ExactPriors}
	for i := range cfg.Models {
		s.engines = append(s.engines, &engine{idx: i, m: &cfg.Models[i], maxInFlight: cfg.Models[i].MaxInFlight})
	}
	s.met = newMetrics(cfg)
	for i := range cfg.Synthetic {
		s.closedRng = append(s.closedRng, rand.New(rand.NewPCG(seed, 0xc105ed00+uint64(i))))
		s.closedFails = append(s.closedFails, 0)
		s.closedSent = append(s.closedSent, 0)
	}
	return s
}

func (s *sim) after(d float64, fn func()) {
	s.tseq++
	heap.Push(&s.timers, timer{at: s.now + d, seq: s.tseq, fn: fn})
}

// shares returns the busy engines' total compute weight and the number of
// engines copying weights.
func (s *sim) shares() (busyWeight float64, copies int) {
	for _, e := range s.engines {
		if e.busy() {
			busyWeight += e.m.ComputePercent
		}
		if e.copying() {
			copies++
		}
	}
	return
}

// rate is the solo-seconds of work per second each of e's requests gets.
func (s *sim) rate(e *engine, busyWeight float64) float64 {
	return e.m.ComputePercent / busyWeight / (1 + *e.m.BatchSlowdown*float64(len(e.running)-1))
}

// engineNext is the earliest time an engine reaches a threshold: a copy
// done, a first token, a request done.
func (s *sim) engineNext() float64 {
	bw, copies := s.shares()
	next := math.Inf(1)
	for _, e := range s.engines {
		if e.copying() && e.state != stopping {
			next = min(next, s.now+max(e.copyLeft, 0)*float64(copies))
		}
		if !e.busy() {
			continue
		}
		rt := s.rate(e, bw)
		for _, r := range e.running {
			target := r.total
			if r.firstAt < 0 && r.first < r.total {
				target = r.first
			}
			next = min(next, s.now+max(target-r.done, 0)/rt)
		}
	}
	return next
}

func (s *sim) advance(dt float64) {
	if dt <= 0 {
		return
	}
	bw, copies := s.shares()
	for _, e := range s.engines {
		if e.copying() {
			e.copyLeft -= dt / float64(copies)
		}
		if e.busy() {
			rt := s.rate(e, bw)
			for _, r := range e.running {
				r.done += dt * rt
			}
		}
	}
}

// settleEngines records first tokens and ends finished requests and
// copies, in engine order.
func (s *sim) settleEngines() {
	for _, e := range s.engines {
		var done []*request
		kept := e.running[:0]
		for _, r := range e.running {
			if r.firstAt < 0 && r.done >= r.first-eps {
				r.firstAt = s.now
			}
			if r.done >= r.total-eps {
				done = append(done, r)
			} else {
				kept = append(kept, r)
			}
		}
		clear(e.running[len(kept):])
		e.running = kept
		for _, r := range done {
			e.lastUse = s.now
			s.complete(r)
		}
		if len(done) > 0 {
			s.admit(e)
		}
		if e.copying() && e.copyLeft <= eps {
			e.copyLeft = 0
			if e.state == loading {
				e.mem = bytesOf(e.m.MemoryGiB)
			}
			e.state = up
			e.lastUse = s.now
			s.pol.copied(e)
			s.admit(e)
		}
	}
}

func (s *sim) complete(r *request) {
	s.charge(r)
	s.endRequest(r, outcomeDone, 0)
	s.pol.finished(r)
}

// load starts a cold load of e.
func (s *sim) load(e *engine) { s.loadIn(e, e.m.LoadSeconds) }

// loadIn starts a load of e that copies for seconds at the card's full
// copy bandwidth (a cold load, or a baseline's reload from the host's page
// cache); either counts as a cold load.
func (s *sim) loadIn(e *engine, seconds float64) {
	if e.state != off {
		panic(fmt.Sprintf("servesim: load of %s in state %s", e.m.Name, e.state))
	}
	e.loadedBefore = true
	e.state, e.mem, e.copyLeft, e.draining = loading, bytesOf(e.m.PeakGiB), seconds, false
	e.epoch++
	s.met.coldLoads++
	s.checkMemory()
}

// wake starts a wake of a sleeping e.
func (s *sim) wake(e *engine) {
	if e.state != asleep {
		panic(fmt.Sprintf("servesim: wake of %s in state %s", e.m.Name, e.state))
	}
	e.state, e.mem, e.copyLeft, e.draining = waking, bytesOf(e.m.MemoryGiB), e.m.WakeSeconds, false
	e.epoch++
	s.met.wakes++
	s.checkMemory()
}

// sleep puts an up e to sleep; its requests are cut off and returned.
func (s *sim) sleep(e *engine) []*request {
	if e.state != up {
		panic(fmt.Sprintf("servesim: sleep of %s in state %s", e.m.Name, e.state))
	}
	cut := s.cutOff(e)
	e.state = goingToSleep
	e.epoch++
	ep := e.epoch
	s.after(e.m.SleepSeconds, func() {
		if e.epoch != ep {
			return
		}
		e.state, e.mem = asleep, bytesOf(e.m.ResidualGiB)
		s.pol.settled(e)
	})
	return cut
}

// stop stops e from any state but off; its requests are cut off and
// returned.
func (s *sim) stop(e *engine) []*request {
	if e.state == off || e.state == stopping {
		panic(fmt.Sprintf("servesim: stop of %s in state %s", e.m.Name, e.state))
	}
	cut := s.cutOff(e)
	e.state = stopping
	e.epoch++
	ep := e.epoch
	s.after(e.m.StopSeconds, func() {
		if e.epoch != ep {
			return
		}
		e.state, e.mem = off, 0
		s.pol.settled(e)
	})
	return cut
}

func (s *sim) cutOff(e *engine) []*request {
	cut := append(append([]*request(nil), e.running...), e.waiting...)
	for _, r := range e.running {
		s.charge(r)
	}
	e.running, e.waiting, e.draining = e.running[:0], e.waiting[:0], false
	// Asleep or stopped, the engine keeps no adapter on the card.
	e.adapters = e.adapters[:0]
	for _, r := range cut {
		r.eng = nil
	}
	return cut
}

// take removes r from its engine (a preemption) and returns whether it was
// running there.
func (s *sim) take(r *request) {
	e := r.eng
	if e == nil {
		return
	}
	if i := slices.Index(e.running, r); i >= 0 {
		s.charge(r)
		e.running = slices.Delete(e.running, i, i+1)
	} else if i := slices.Index(e.waiting, r); i >= 0 {
		e.waiting = slices.Delete(e.waiting, i, i+1)
	}
	r.eng = nil
	r.done, r.firstAt, r.charged = 0, -1, 0
	s.admit(e)
}

// submit gives r to e, which runs it when its batch and KV pool have room.
func (s *sim) submit(e *engine, r *request) {
	if e.state != up {
		panic(fmt.Sprintf("servesim: request for %s dispatched in state %s", e.m.Name, e.state))
	}
	r.eng = e
	e.waiting = append(e.waiting, r)
	s.admit(e)
}

func (s *sim) admit(e *engine) {
	if e.state != up {
		return
	}
	held := -1
	for len(e.waiting) > 0 && len(e.running) < e.maxInFlight {
		r := e.waiting[0]
		if e.m.KVTokens > 0 && len(e.running) > 0 {
			if held < 0 {
				held = e.heldTokens()
			}
			if held+r.a.PromptTokens > e.m.KVTokens {
				return
			}
		}
		e.waiting = e.waiting[1:]
		r.started, r.done, r.firstAt = s.now, 0, -1
		s.useAdapter(e, r)
		s.met.serve(r, float64(r.a.PromptTokens))
		s.setWaiting(r, false)
		e.running = append(e.running, r)
		if held >= 0 {
			held += r.a.PromptTokens
		}
	}
}

// useAdapter makes r's adapter resident on e as r starts: an adapter not
// loaded costs the model's AdapterLoadSeconds of the request's time before
// its prefill (the engine loads it while the batch runs on, as vLLM's
// runtime LoRA loading does), and the least recently used one leaves when
// more than MaxAdapters would be loaded. Adapters share the base model's
// weights; their memory is neglected.
func (s *sim) useAdapter(e *engine, r *request) {
	need := 0.0
	if a := r.a.Adapter; a > 0 {
		if i := slices.Index(e.adapters, a); i >= 0 {
			e.adapters = append(slices.Delete(e.adapters, i, i+1), a)
		} else {
			need = e.m.AdapterLoadSeconds
			s.met.adapterLoads++
			e.adapters = append(e.adapters, a)
			if len(e.adapters) > e.m.MaxAdapters {
				e.adapters = slices.Delete(e.adapters, 0, 1)
			}
		}
	}
	d := need - r.adapterWork
	r.prefill, r.first, r.total, r.adapterWork = r.prefill+d, r.first+d, r.total+d, need
}

// newRequest makes the request of an arrival; its work follows the model.
func (s *sim) newRequest(a Arrival) *request {
	m := &s.cfg.Models[a.Model]
	if a.Adapter == 0 {
		a.Adapter = s.cfg.tenantAdapter(a.Model, a.Tenant)
	}
	s.nreq++
	r := &request{a: a, seq: s.nreq, class: m.class, firstAt: -1, warmup: a.Time < s.cfg.WarmupSeconds || a.aside}
	if a.aside {
		r.class = queue.Background
	}
	if m.PrefillTokensPerSecond > 0 {
		r.prefill = float64(a.PromptTokens) / m.PrefillTokensPerSecond
	}
	r.total = r.prefill + float64(a.OutputTokens)/m.TokensPerSecond
	r.first = r.total
	if a.OutputTokens > 0 {
		r.first = r.prefill + 1/m.TokensPerSecond
	}
	return r
}

// arrive hands an arrival to the policy.
func (s *sim) arrive(r *request) {
	s.outstanding++
	s.met.arrive(r)
	s.setWaiting(r, true)
	s.pol.arrive(r)
}

func (s *sim) setWaiting(r *request, w bool) {
	if r.waiting != w {
		// Service so far was served under the backlog before this change.
		for _, x := range s.engines[r.a.Model].running {
			s.charge(x)
		}
		r.waiting = w
		s.met.backlog(r, w)
	}
}

// charge counts r's newly generated tokens for fairness.
func (s *sim) charge(r *request) {
	g := r.generated(&s.cfg.Models[r.a.Model])
	if g > r.charged {
		s.met.serve(r, float64(g-r.charged))
		r.charged = g
	}
}

type outcome uint8

const (
	outcomeDone outcome = iota
	outcomeRejected
	outcomeFailed
)

// endRequest records how r ended; a closed-loop stream sends its next.
func (s *sim) endRequest(r *request, o outcome, status int) {
	if r.ended {
		return
	}
	r.ended = true
	s.setWaiting(r, false)
	s.outstanding--
	s.met.end(r, o, status, s.now)
	if s.onEnd != nil {
		s.onEnd(r, o)
	}
	if r.stream > 0 && s.now < s.end {
		// A batch client resends at once after an answer and backs off
		// after a failure: 1 s, doubling to a minute.
		delay := 0.0
		if o == outcomeDone {
			s.closedFails[r.stream-1] = 0
		} else {
			delay = min(60, math.Pow(2, float64(s.closedFails[r.stream-1])))
			s.closedFails[r.stream-1]++
		}
		st := r.stream
		s.after(delay, func() { s.closedSend(st - 1) })
	}
}

// closedSend sends the next request of closed-loop stream i.
func (s *sim) closedSend(i int) {
	st := s.cfg.Synthetic[i]
	if s.now >= s.end || st.until > 0 && s.now >= st.until {
		return
	}
	rng := s.closedRng[i]
	a := Arrival{Time: s.now, Model: s.cfg.model(st.Model), Tenant: pickTenant(s.cfg, st.Tenants, rng),
		PromptTokens: around(rng, st.PromptTokens), OutputTokens: around(rng, st.OutputTokens), aside: st.aside}
	ov := -1.0
	if n := len(st.sent); n > 0 {
		// A replayed live loop: the n-th send is the live n-th one.
		lr := st.sent[s.closedSent[i]%n]
		a.PromptTokens, a.OutputTokens = lr.PromptTokens, lr.OutputTokens
		if lr.Tenant != "" {
			a.Tenant = lr.Tenant
		}
		if lr.Timed && s.livePaths {
			ov, a.back = max(lr.In, 0), max(lr.Out, 0)
		}
	}
	s.closedSent[i]++
	if ov < 0 {
		ov = s.drawOverhead(a.Model)
	}
	if ov > 0 {
		a.Time, a.lag = a.Time+ov, ov
		r := s.newRequest(a)
		r.stream = i + 1
		s.after(ov, func() { s.arrive(r) })
		return
	}
	r := s.newRequest(a)
	r.stream = i + 1
	s.arrive(r)
}

// drawOverhead is one draw of model m's per-request overhead (0 without).
func (s *sim) drawOverhead(m int) float64 {
	if m >= len(s.overhead) || len(s.overhead[m]) == 0 {
		return 0
	}
	return s.overhead[m][s.ovRng.IntN(len(s.overhead[m]))]
}

// checkMemory is the simulator's own I1 check, for every policy: the
// engines never hold more than the card's usable memory.
func (s *sim) checkMemory() {
	var sum int64
	for _, e := range s.engines {
		sum += e.mem
	}
	over := sum > s.usable
	if over && !s.overMemory {
		s.met.memoryViolations++
	}
	s.overMemory = over
}

// run drives the simulation over the arrivals until every request ended
// (or drainAfter past the end).
func (s *sim) run(arrivals []Arrival) {
	if s.alone > 0 {
		var mine []Arrival
		for _, a := range arrivals {
			if a.Model == s.alone-1 {
				mine = append(mine, a)
			}
		}
		arrivals = mine
	}
	s.pol.start()
	for i, st := range s.cfg.Synthetic {
		if s.alone > 0 && s.cfg.model(st.Model) != s.alone-1 {
			continue
		}
		for range st.Concurrency {
			s.after(st.from, func() { s.closedSend(i) })
		}
	}
	ai := 0
	nextTick := 1.0
	for {
		t := nextTick
		if ai < len(arrivals) {
			t = min(t, arrivals[ai].Time)
		}
		if len(s.timers) > 0 {
			t = min(t, s.timers[0].at)
		}
		t = min(t, s.engineNext())
		if t > s.hardEnd || (s.now >= s.end && ai == len(arrivals) && s.outstanding == 0 && len(s.timers) == 0) {
			break
		}
		s.advance(t - s.now)
		s.now = t
		s.settleEngines()
		for len(s.timers) > 0 && s.timers[0].at <= s.now {
			tm := heap.Pop(&s.timers).(timer)
			tm.fn()
		}
		for ai < len(arrivals) && arrivals[ai].Time <= s.now {
			s.arrive(s.newRequest(arrivals[ai]))
			ai++
		}
		if nextTick <= s.now {
			s.met.sample(s)
			s.pol.tick()
			nextTick++
		}
		s.checkMemory()
		if s.observe != nil {
			s.observe(s)
		}
	}
	s.met.finish(s)
}
