package sim

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gpuplane/gpuplane/node/inventory"
)

// phase is where the engine is in its life: the residency states that
// vLLM's sleep mode, llama.cpp's router and Ollama's keep_alive expose.
type phase string

const (
	// phStarting is runtime initialisation: the port is open, the CUDA
	// context (the overhead) is on the card, no weights yet.
	phStarting phase = "starting"
	// phLoading copies the weights onto the card.
	phLoading phase = "loading"
	phAwake   phase = "awake"
	// phAsleep holds only the residual (and, after a partial wake, the
	// weights); level 1 keeps the weights in host RAM, level 2 drops them.
	phAsleep phase = "asleep"
	// phWaking copies the weights back (level 1) or reloads them (level 2).
	phWaking phase = "waking"
	// phUnloaded holds nothing on the card: llama.cpp's router unloaded the
	// model or Ollama's keep_alive expired.
	phUnloaded phase = "unloaded"
)

// tick is how often an engine re-reads its card's shared state and
// re-reports its memory; it also bounds how late a rate change is noticed.
const tick = 20 * time.Millisecond

// idleEvery is how many ticks an idle engine lets pass between reads of
// its card.
const idleEvery = 10

// errAborted is the cause given to requests cut off by a sleep or unload.
var errAborted = errors.New("request aborted: the engine was put to sleep or unloaded")

// state is the engine's residency state, guarded by server.mu.
type state struct {
	phase phase
	// level is the sleep level while asleep or waking (1 or 2).
	level int
	// weightsOn and kvOn say which parts are on the card; vLLM's
	// /wake_up?tags= can restore one without the other.
	weightsOn, kvOn bool
	// stale says the weights' memory is back on the card after a level-2
	// sleep but holds nothing yet (vllm dialect): vLLM's wake_up only
	// reallocates it, and POST /collective_rpc reload_weights reads the
	// weights from disk again. reloads counts those reloads.
	stale   bool
	reloads int
	// auto says a request loads or wakes the engine (llama.cpp, Ollama)
	// instead of being refused (vLLM's sleep mode).
	auto bool
	// progress is the fraction done of the copy in progress.
	progress float64
	copying  bool
	inflight int
	// waiting counts requests queued for room in the KV pool.
	waiting int
	// tokens is the KV cache held by requests in flight: their prompts and
	// what they generated so far.
	tokens int
	// expire, when set, is when an idle engine sleeps (llama.cpp's
	// --sleep-idle-seconds) or unloads (Ollama's keep_alive).
	expire       time.Time
	expireUnload bool
	// keepAlive is Ollama's keep_alive for the loaded model; negative keeps
	// it loaded forever.
	keepAlive time.Duration
	// computeFrac and copyFrac are this engine's shares of the card's
	// compute (while busy) and copy bandwidth (while copying).
	computeFrac, copyFrac float64
	lastLoad, lastWake    time.Duration
}

// isSleeping is vLLM's is_sleeping: anything but a fully awake engine.
func (st *state) isSleeping() bool {
	return st.phase == phAsleep || st.phase == phWaking || st.phase == phUnloaded
}

// footprintMiB is what the engine holds on each card now.
func (s *server) footprintMiB() uint64 {
	st := &s.st
	c := s.cfg
	switch st.phase {
	case phStarting:
		return c.OverheadMiB
	case phLoading:
		// The weights count once loaded, as the sim always reported them:
		// the watchdog then judges an engine by what it holds when serving.
		return c.OverheadMiB
	case phAwake:
		if s.sizedMiB > 0 {
			return s.sizedMiB
		}
		return c.OverheadMiB + s.weightsMiB + s.kvMiB() + s.loraMiB() + s.overshootMiB()
	case phAsleep:
		if st.weightsOn {
			return c.ResidualMiB + s.weightsMiB
		}
		return c.ResidualMiB
	case phWaking:
		return c.ResidualMiB
	}
	return 0
}

// kvMiB is the KV cache of the tokens in flight, up to the pool.
func (s *server) kvMiB() uint64 {
	if s.cfg.KVKiBPerToken == 0 || s.st.tokens <= 0 {
		return 0
	}
	mib := (uint64(s.st.tokens)*s.cfg.KVKiBPerToken + 1023) / 1024
	return min(mib, s.kvPoolMiB())
}

// hostMiB is host RAM the engine holds: the weights during a level-1
// sleep, and llama-server's host-RAM prompt cache (hostcache.go).
func (s *server) hostMiB() uint64 {
	mib := s.host.mib()
	if (s.st.phase == phAsleep || s.st.phase == phWaking) && s.st.level == 1 && !s.st.weightsOn {
		mib += s.weightsMiB
	}
	return mib
}

// report writes the engine's memory and its record for its neighbours to
// the simulated card when either changed. Callers must not hold s.mu.
func (s *server) report() {
	if s.cfg.Usage == nil {
		return
	}
	// The state is read under pubMu, so that two reports (the watch's and
	// a transition's) write in the order they read: otherwise a report
	// that read the state before a load finished could write after the
	// load's own report and unregister the loaded weights.
	s.pubMu.Lock()
	defer s.pubMu.Unlock()
	s.mu.Lock()
	mib := s.footprintMiB()
	rec := inventory.SimEngine{
		PID: s.pid, Model: s.cfg.ServedModelName, ComputeWeight: s.computeWeight(),
		Busy: s.st.inflight > 0, Copying: s.st.copying, State: string(s.st.phase), HostMiB: s.hostMiB(),
	}
	s.mu.Unlock()

	for _, card := range s.cfg.CardUUIDs {
		if mib != s.lastMiB || !s.reported {
			var err error
			if mib == 0 {
				err = s.cfg.Usage.Unregister(card, s.pid)
			} else {
				err = s.cfg.Usage.Register(card, s.pid, mib)
			}
			if err != nil {
				s.cfg.Logger.Warn("report GPU memory", "card", card, "err", err)
			}
		}
		if rec != s.lastRec || !s.reported {
			if err := s.cfg.Usage.SetEngine(card, rec); err != nil {
				s.cfg.Logger.Warn("record sim engine", "card", card, "err", err)
			}
		}
	}
	s.lastMiB, s.lastRec, s.reported = mib, rec, true
}

// unreport removes the engine from its cards as it exits.
func (s *server) unreport() {
	if s.cfg.Usage == nil {
		return
	}
	s.pubMu.Lock()
	defer s.pubMu.Unlock()
	for _, card := range s.cfg.CardUUIDs {
		if err := s.cfg.Usage.Unregister(card, s.pid); err != nil {
			s.cfg.Logger.Warn("unregister GPU memory", "card", card, "err", err)
		}
		if err := s.cfg.Usage.RemoveEngine(card, s.pid); err != nil {
			s.cfg.Logger.Warn("forget sim engine", "card", card, "err", err)
		}
	}
}

func (s *server) computeWeight() uint32 {
	if s.cfg.ComputePercent == 0 {
		return 100
	}
	return s.cfg.ComputePercent
}

// refreshShares reads the neighbours' records and sets this engine's share
// of compute (weighted by compute share among busy engines, counting
// itself busy) and of copy bandwidth (equal among copying engines). An
// engine on several cards gets its smallest share, as the slowest card
// paces a tensor-parallel step.
func (s *server) refreshShares() {
	compute, copyShare := 1.0, 1.0
	if s.cfg.Usage != nil {
		mine := float64(s.computeWeight())
		for _, card := range s.cfg.CardUUIDs {
			engines, err := s.cfg.Usage.Engines(card)
			if err != nil {
				s.cfg.Logger.Warn("read sim engines", "card", card, "err", err)
				continue
			}
			busy, copies := mine, 1.0
			for _, e := range engines {
				if e.PID == s.pid {
					continue
				}
				if e.Busy {
					w := e.ComputeWeight
					if w == 0 {
						w = 100
					}
					busy += float64(w)
				}
				if e.Copying {
					copies++
				}
			}
			compute, copyShare = min(compute, mine/busy), min(copyShare, 1/copies)
		}
	}
	s.mu.Lock()
	s.st.computeFrac, s.st.copyFrac = compute, copyShare
	s.mu.Unlock()
}

// watch keeps the shares and the reported memory (KV grows per token)
// current, and sleeps or unloads an engine idle past its expiry.
func (s *server) watch(ctx context.Context) {
	t := time.NewTicker(tick)
	defer t.Stop()
	for n := 0; ; {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		// An idle engine's shares do not matter and its memory does not
		// change, so it reads the card less often; admit and copyWeights
		// refresh at once when that changes.
		s.mu.Lock()
		active := s.st.inflight > 0 || s.st.copying
		s.mu.Unlock()
		if n++; active || n%idleEvery == 0 {
			s.refreshShares()
			s.report()
		}
		s.mu.Lock()
		expired := !s.st.expire.IsZero() && time.Now().After(s.st.expire) && s.st.inflight == 0 && s.st.phase == phAwake
		unload := s.st.expireUnload
		if expired {
			s.st.expire = time.Time{}
		}
		s.mu.Unlock()
		if !expired {
			continue
		}
		if unload {
			s.cfg.Logger.Info("keep_alive expired; unloading")
			go s.unload(ctx, false)
		} else {
			s.cfg.Logger.Info("idle; sleeping", "after", s.cfg.SleepIdle)
			go func() {
				if err := s.sleep(ctx, 2, "wait", true); err != nil {
					s.cfg.Logger.Warn("idle sleep", "err", err)
				}
			}()
		}
	}
}

// copyWeights performs seconds of exclusive copy work (loading, waking),
// sharing the card's copy bandwidth with the other copies in progress:
// progress advances by elapsed time × this engine's copy share.
func (s *server) copyWeights(ctx context.Context, seconds float64) error {
	s.mu.Lock()
	s.st.progress, s.st.copying = 0, true
	s.mu.Unlock()
	s.report()
	s.refreshShares()
	defer func() {
		s.mu.Lock()
		s.st.copying = false
		s.mu.Unlock()
		s.report()
	}()
	last := time.Now()
	for seconds > 0 {
		t := time.NewTimer(tick)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		now := time.Now()
		s.mu.Lock()
		s.st.progress += now.Sub(last).Seconds() / seconds * s.st.copyFrac
		done := s.st.progress >= 1
		s.mu.Unlock()
		last = now
		if done {
			break
		}
	}
	s.mu.Lock()
	s.st.progress = 1
	s.mu.Unlock()
	return nil
}

// sleepFor waits d unless ctx ends first.
func sleepFor(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// load brings the engine from nothing to awake: runtime initialisation,
// then the weights. The caller holds s.ctl.
func (s *server) load(ctx context.Context) error {
	start := time.Now()
	s.setPhase(phStarting)
	// vLLM profiles the card's free memory from its start to its KV
	// allocation (vllmmemory.go).
	var before map[string]uint64
	if s.cfg.vllmMemory() {
		before = s.othersMiB()
	}
	if err := sleepFor(ctx, s.cfg.InitTime); err != nil {
		return err
	}
	s.setPhase(phLoading)
	if err := s.copyWeights(ctx, s.cfg.LoadTime.Seconds()); err != nil {
		return err
	}
	if before != nil {
		if err := s.profiled(before); err != nil {
			return err
		}
	}
	sized := s.ollamaSizeMiB()
	if sized == 0 {
		var err error
		if sized, err = s.sglangSizeMiB(); err != nil {
			return err
		}
	}
	s.mu.Lock()
	s.sizedMiB = sized
	s.st.phase, s.st.level, s.st.weightsOn, s.st.kvOn = phAwake, 0, true, true
	s.st.lastLoad = time.Since(start)
	s.armExpiry()
	s.cond.Broadcast()
	s.mu.Unlock()
	s.report()
	s.cfg.Logger.Info("sim engine loaded", "model", s.cfg.ServedModelName, "took", time.Since(start).Round(time.Millisecond))
	return nil
}

func (s *server) setPhase(p phase) {
	s.mu.Lock()
	s.st.phase = p
	s.mu.Unlock()
	s.report()
}

// sleep puts an awake engine to sleep. Mode "abort" cuts off requests in
// flight, "wait" lets them finish first. auto marks an idle sleep that the
// next request ends (llama.cpp) rather than one that refuses requests
// (vLLM). Sleeping a sleeping engine does nothing, as in vLLM.
func (s *server) sleep(ctx context.Context, level int, mode string, auto bool) error {
	s.ctl.Lock()
	defer s.ctl.Unlock()
	// vLLM measures the card's free memory around its sleep
	// (vllmmemory.go).
	var before map[string]uint64
	var mine uint64
	if s.cfg.vllmMemory() && !auto {
		before = s.othersMiB()
		s.mu.Lock()
		mine = s.footprintMiB()
		s.mu.Unlock()
	}
	s.mu.Lock()
	switch s.st.phase {
	case phAsleep, phUnloaded:
		s.mu.Unlock()
		return nil
	case phAwake:
	default:
		ph := s.st.phase
		s.mu.Unlock()
		return fmt.Errorf("cannot sleep while %s", ph)
	}
	if mode == "abort" {
		for _, cancel := range s.cancels {
			cancel(errAborted)
		}
	}
	if err := s.waitIdle(ctx); err != nil {
		s.mu.Unlock()
		return err
	}
	s.st.phase, s.st.level, s.st.weightsOn, s.st.kvOn, s.st.auto = phAsleep, level, false, false, auto
	s.sleepAdapters()
	s.st.expire = time.Time{}
	s.cache.clear() // the KV cache is freed
	s.slots.clear()
	// Requests queued for KV room learn that the engine sleeps.
	s.cond.Broadcast()
	s.mu.Unlock()
	s.report()
	if before != nil {
		if err := s.vllmSleepOffload(ctx, level, before, mine); err != nil {
			return err
		}
	}
	s.cfg.Logger.Info("sim engine asleep", "level", level, "residual_mib", s.cfg.ResidualMiB)
	return nil
}

// waitIdle waits, holding s.mu, until no request is in flight.
func (s *server) waitIdle(ctx context.Context) error {
	for s.st.inflight > 0 {
		if err := s.waitCtx(ctx); err != nil {
			return err
		}
	}
	return nil
}

// waitCtx waits, holding s.mu, for the next change of the engine's state
// (a request ending, a wake) or for ctx to end.
func (s *server) waitCtx(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() {
		s.mu.Lock()
		s.cond.Broadcast()
		s.mu.Unlock()
	})
	defer stop()
	s.cond.Wait()
	return ctx.Err()
}

// fits says a request with this prompt can start now: the KV pool has room
// for its prompt beside the requests in flight. A request alone always
// starts; its KV stops growing at the pool. Callers hold s.mu.
func (s *server) fits(promptTokens int) bool {
	if s.cfg.KVKiBPerToken == 0 || s.st.inflight == 0 {
		return true
	}
	capacity := int(s.kvPoolMiB() * 1024 / s.cfg.KVKiBPerToken)
	return s.st.tokens+promptTokens <= capacity
}

// wake restores the weights and/or the KV cache of a sleeping engine:
// from level 1 the weights are copied back from host RAM (WakeTime), from
// level 2 they are reloaded (LoadTime). Waking an awake engine does nothing.
func (s *server) wake(ctx context.Context, weights, kv bool) error {
	s.ctl.Lock()
	defer s.ctl.Unlock()
	return s.wakeLocked(ctx, weights, kv)
}

func (s *server) wakeLocked(ctx context.Context, weights, kv bool) error {
	s.mu.Lock()
	ph, level, weightsOn := s.st.phase, s.st.level, s.st.weightsOn
	s.mu.Unlock()
	switch ph {
	case phAwake:
		return nil
	case phUnloaded:
		// A load outlives the request that asked for it, as llama.cpp's
		// router and Ollama finish a load whose client went away.
		if err := s.load(s.life); err != nil {
			s.setPhase(phUnloaded)
			return err
		}
		return nil
	case phAsleep:
	default:
		return fmt.Errorf("cannot wake while %s", ph)
	}
	start := time.Now()
	if weights && !weightsOn {
		s.setPhase(phWaking)
		seconds := s.cfg.WakeTime.Seconds()
		switch {
		case level == 2 && s.cfg.Dialect == DialectVLLM:
			// Only the memory comes back; reload_weights fills it.
			seconds = 0
			s.mu.Lock()
			s.st.stale = true
			s.mu.Unlock()
		case level == 2:
			seconds = s.cfg.LoadTime.Seconds()
		}
		if err := s.copyWeights(ctx, seconds); err != nil {
			s.setPhase(phAsleep)
			return err
		}
		s.mu.Lock()
		s.st.weightsOn = true
		s.mu.Unlock()
	}
	s.mu.Lock()
	if kv {
		s.st.kvOn = true
	}
	s.st.phase = phAsleep
	if s.st.weightsOn && s.st.kvOn {
		s.st.phase, s.st.level = phAwake, 0
		s.st.lastWake = time.Since(start)
		s.armExpiry()
		s.cond.Broadcast()
	}
	awake := s.st.phase == phAwake
	s.mu.Unlock()
	s.report()
	if awake {
		s.cfg.Logger.Info("sim engine awake", "from_level", level, "took", time.Since(start).Round(time.Millisecond))
	}
	return nil
}

// unload drops everything from the card (llama.cpp's router unload,
// Ollama's keep_alive 0), cutting off requests in flight; the next request
// or load brings it back through runtime init and a weight load.
func (s *server) unload(ctx context.Context, abort bool) {
	s.ctl.Lock()
	defer s.ctl.Unlock()
	s.mu.Lock()
	if s.st.phase == phUnloaded {
		s.mu.Unlock()
		return
	}
	if abort {
		for _, cancel := range s.cancels {
			cancel(errAborted)
		}
	}
	if err := s.waitIdle(ctx); err != nil {
		s.mu.Unlock()
		return
	}
	s.st.phase, s.st.level, s.st.weightsOn, s.st.kvOn, s.st.auto = phUnloaded, 0, false, false, true
	s.dropAdapters()
	s.st.expire = time.Time{}
	s.cache.clear()
	s.slots.clear()
	s.cond.Broadcast()
	s.mu.Unlock()
	s.report()
	s.cfg.Logger.Info("sim engine unloaded")
}

// ensureLoaded loads or wakes the engine for a request when that is the
// engine's behaviour (llama.cpp, Ollama).
func (s *server) ensureLoaded(ctx context.Context) error {
	s.ctl.Lock()
	defer s.ctl.Unlock()
	return s.wakeLocked(ctx, true, true)
}

// armExpiry sets when an idle engine sleeps or unloads. Callers hold s.mu.
func (s *server) armExpiry() {
	s.st.expire = time.Time{}
	switch {
	case s.st.keepAlive > 0:
		s.st.expire, s.st.expireUnload = time.Now().Add(s.st.keepAlive), true
	case s.st.keepAlive == 0 && s.cfg.SleepIdle > 0:
		s.st.expire, s.st.expireUnload = time.Now().Add(s.cfg.SleepIdle), false
	}
}

// request is one admitted request: its context ends when the client goes
// or a sleep or unload cuts it off.
type request struct {
	id     uint64
	ctx    context.Context
	cancel context.CancelCauseFunc
	// held is the KV cache it holds, in tokens.
	held int
	// admitted is when it was let in: its prefill starts then.
	admitted time.Time
	// firstDue is when its first token was due (set as it is emitted).
	firstDue time.Time
	// decodeFrom is when its prefill was done (zero: when it began
	// decoding).
	decodeFrom time.Time
	// turn is its place in the priority order (--scheduling-policy
	// priority); paused: a request of higher priority took its place in the
	// batch, and it waits (its KV freed, as vLLM's recompute preemption
	// frees it) until it is the first of the waiting again. Guarded by
	// server.mu.
	turn   *turn
	paused bool
}

// turn is a request's place in vLLM's priority order: lower priority
// first, then earlier arrival.
type turn struct {
	priority int
	seq      uint64
}

func (t *turn) before(u *turn) bool {
	return t.priority < u.priority || t.priority == u.priority && t.seq < u.seq
}

// prioritized: the engine orders its batch by the requests' `priority`
// (vLLM's --scheduling-policy priority).
func (s *server) prioritized() bool { return s.cfg.SchedulingPolicy == "priority" }

// firstWaiting is the waiting request (new or paused) that runs next under
// priority scheduling; callers hold s.mu.
func (s *server) firstWaiting() *turn {
	var first *turn
	for t := range s.waiters {
		if first == nil || t.before(first) {
			first = t
		}
	}
	return first
}

// room says a request with this prompt may join the batch now; callers
// hold s.mu.
func (s *server) room(promptTokens int) bool {
	return s.fits(promptTokens) && (s.cfg.MaxNumSeqs == 0 || s.st.inflight < s.cfg.MaxNumSeqs)
}

// displaceFor pauses the running request last in the priority order if it
// comes after t (strictly lower priority): vLLM preempts the lowest
// priority, latest request of its batch for a waiting one of higher
// priority. Callers hold s.mu; false: none to pause.
func (s *server) displaceFor(t *turn) bool {
	var last *request
	for _, r := range s.running {
		if r.turn.priority > t.priority && (last == nil || last.turn.before(r.turn)) {
			last = r
		}
	}
	if last == nil {
		return false
	}
	delete(s.running, last.id)
	last.paused = true
	s.st.inflight--
	s.st.tokens -= last.held
	s.st.waiting++
	s.preempted++
	s.waiters[last.turn] = true
	return true
}

// resumeWait holds a paused request until it is the first of the waiting
// and the batch has room, then puts it back in the batch; it reports
// whether it paused (the stream's clock then restarts). Callers hold no
// lock.
func (s *server) resumeWait(r *request) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !r.paused {
		return false, nil
	}
	for {
		if s.firstWaiting() == r.turn && s.room(r.held) {
			delete(s.waiters, r.turn)
			r.paused = false
			s.st.waiting--
			s.st.inflight++
			s.st.tokens += r.held
			s.running[r.id] = r
			return true, nil
		}
		if err := s.waitCtx(r.ctx); err != nil {
			return true, context.Cause(r.ctx)
		}
	}
}

// admit lets a request in: where requests load the engine (llama.cpp,
// Ollama) it waits for the load; otherwise it says why it is refused.
//
// Under --scheduling-policy priority the batch is ordered as vLLM orders
// it: a request waits while one before it (lower priority, or as low and
// earlier) waits, and one of higher priority than a running request takes
// that request's place at once (displaceFor).
func (s *server) admit(ctx context.Context, promptTokens, priority int) (*request, error) {
	var t *turn
	if s.prioritized() {
		s.mu.Lock()
		t = &turn{priority: priority, seq: s.nextTurn}
		s.nextTurn++
		s.mu.Unlock()
		defer func() {
			s.mu.Lock()
			delete(s.waiters, t)
			s.mu.Unlock()
		}()
	}
	for {
		s.mu.Lock()
		st := &s.st
		if t != nil && st.phase == phAwake {
			s.waiters[t] = true
			displaced := false
			for s.firstWaiting() == t && !s.room(promptTokens) && s.displaceFor(t) {
				displaced = true
			}
			if displaced {
				s.cond.Broadcast()
			}
		}
		switch {
		case st.phase == phAwake && (!s.room(promptTokens) || t != nil && s.firstWaiting() != t):
			// Continuous batching within the KV pool and --max-num-seqs: a
			// request whose prompt does not fit, or that would run past
			// the batch, waits for others to finish.
			st.waiting++
			err := s.waitCtx(ctx)
			st.waiting--
			s.mu.Unlock()
			if err != nil {
				return nil, err
			}
			continue
		case st.phase == phAwake && st.stale:
			// vLLM would answer from uninitialised weights; the sim
			// refuses, so that a wake missing its reload shows (SGLang
			// would, resumed without its weights' CPU backup).
			s.mu.Unlock()
			if s.cfg.Dialect == DialectSGLang {
				return nil, errNoWeightsBackup
			}
			return nil, errStale
		case st.phase == phAwake:
			r := &request{id: s.nextReq, held: promptTokens, admitted: time.Now(), turn: t}
			s.nextReq++
			if t != nil {
				delete(s.waiters, t)
				s.running[r.id] = r
			}
			r.ctx, r.cancel = context.WithCancelCause(ctx)
			s.cancels[r.id] = r.cancel
			st.inflight++
			st.tokens += promptTokens
			first := st.inflight == 1
			s.mu.Unlock()
			if first {
				// The neighbours learn that this engine is busy, and it
				// learns its share, before the request runs. (Doing it
				// off the request's path saved about a millisecond of
				// first token, but a report left running could land after
				// a sleep's report and undo it.)
				s.report()
				s.refreshShares()
			}
			return r, nil
		case !s.loadedOnce:
			s.mu.Unlock()
			return nil, errLoading
		case !st.auto:
			ph := st.phase
			s.mu.Unlock()
			if ph == phWaking {
				return nil, errWaking
			}
			return nil, errSleeping
		}
		s.mu.Unlock()
		if err := s.ensureLoaded(ctx); err != nil {
			return nil, err
		}
	}
}

var (
	errLoading  = errors.New("is still loading")
	errSleeping = errors.New("is sleeping; POST /wake_up first")
	errWaking   = errors.New("is waking up")
	errStale    = errors.New("has no weights: a level-2 sleep discarded them and no POST /collective_rpc {\"method\":\"reload_weights\"} reloaded them")
)

// release ends a request: its KV cache is freed.
func (s *server) release(r *request) {
	r.cancel(nil)
	s.mu.Lock()
	delete(s.cancels, r.id)
	if r.paused {
		delete(s.waiters, r.turn)
		s.st.waiting--
	} else {
		delete(s.running, r.id)
		s.st.inflight--
		s.st.tokens -= r.held
	}
	if s.st.inflight == 0 {
		s.armExpiry()
	}
	last := s.st.inflight == 0
	s.cond.Broadcast()
	s.mu.Unlock()
	if last {
		s.report()
	}
}

// hold records n more tokens of KV cache for r.
func (s *server) hold(r *request, n int) {
	s.mu.Lock()
	s.st.tokens += n
	r.held += n
	s.mu.Unlock()
}

// rate is the tokens per second of one stream now: the solo speed times
// speed().
func (s *server) rate() float64 { return s.cfg.TokensPerSecond * s.speed() }

// speed is the fraction of its solo speed a stream runs at now: the
// engine's share of the card's compute, slowed by its own batch.
func (s *server) speed() float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	batch := 1 + s.cfg.BatchSlowdown*float64(max(s.st.inflight-1, 0))
	return s.st.computeFrac / batch
}
