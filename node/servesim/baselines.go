package servesim

import (
	"cmp"
	"slices"
)

// The baselines run on the same engines and trace as gpuplane. Each
// follows the tool as it is configured and behaves today (its scheduler's
// source and docs, named below; docs/simulate.md); what a tool leaves to
// chance is made deterministic and said.

// pageCacheStartSeconds is what a reload of a model read before costs
// besides copying its weights: the runner process starting and its CUDA
// context (llama.cpp's server, ~1 s). The weights come from the host's
// page cache at host-RAM speed, the same copy a level-1 wake makes, so a
// reload takes WakeSeconds + this; the host is assumed to have the RAM to
// cache every model's file.
const pageCacheStartSeconds = 1.0

// reload starts e's load: cold the first time, from the page cache after.
func reload(s *sim, e *engine) {
	if e.loadedBefore {
		s.loadIn(e, e.m.WakeSeconds+pageCacheStartSeconds)
		return
	}
	s.load(e)
}

// ollama follows ollama/ollama server/sched.go and envconfig/config.go as
// of v0.33 (the scheduler after ollama/ollama#14578 and PR #15126):
//   - GetRunner's fast path: a request for a runner already loaded (not
//     expiring) goes to it at once and never waits behind the pending
//     queue; the runner serves OLLAMA_NUM_PARALLEL at once (default 1;
//     `ollama-np4` sets 4), the rest wait on its semaphore;
//   - other requests join the pending queue, at most OLLAMA_MAX_QUEUE
//     (512); past it, 503;
//   - processPending takes them in order; loads are asynchronous: a model
//     that fits (fewer than OLLAMA_MAX_LOADED_MODELS, 3 per GPU, loaded and
//     its memory free) starts loading and the queue moves on;
//   - one that does not fit waits for an unload: findRunnerToUnload sorts
//     runners ByDurationAndName (shortest keep_alive, then name), unloads
//     the first idle one and waits for its memory (waitForVRAMRecovery),
//     which holds the queue; with none idle, it waits for the first in
//     that order to go idle;
//   - an idle runner unloads when its keep_alive (OLLAMA_KEEP_ALIVE, 5m)
//     expires;
//   - no sleep tier: a model loaded before reloads from the host's page
//     cache (reload above); a first load is cold.
type ollama struct {
	s           *sim
	numParallel int
	pending     []*request
	// unloading is the runner whose memory the queue waits for, or nil.
	unloading *engine
}

func (p *ollama) start() {
	for _, e := range p.s.engines {
		e.maxInFlight = p.numParallel
	}
}

func (p *ollama) arrive(r *request) {
	if e := p.s.engines[r.a.Model]; e.state == up {
		p.s.submit(e, r)
		return
	}
	if len(p.pending) >= p.s.cfg.Ollama.MaxQueue {
		p.s.endRequest(r, outcomeRejected, 503)
		return
	}
	p.pending = append(p.pending, r)
	p.process()
}

func (p *ollama) finished(r *request) { p.process() }
func (p *ollama) copied(e *engine)    { p.process() }
func (p *ollama) settled(e *engine) {
	if p.unloading == e {
		p.unloading = nil
	}
	p.process()
}

func (p *ollama) tick() {
	for _, e := range p.s.engines {
		if e.state == up && e.idle() && p.s.now-e.lastUse >= e.m.KeepAliveSeconds {
			p.s.stop(e)
		}
	}
	p.process()
}

func (p *ollama) loaded() []*engine {
	var out []*engine
	for _, e := range p.s.engines {
		if e.state != off {
			out = append(out, e)
		}
	}
	return out
}

func (p *ollama) process() {
	s := p.s
	kept := p.pending[:0]
	blocked := p.unloading != nil
	for _, r := range p.pending {
		e := s.engines[r.a.Model]
		switch {
		case e.state == up:
			s.submit(e, r)
			continue
		case e.state == loading || blocked:
			// Its load runs, or the queue waits for memory: it waits.
			kept = append(kept, r)
			continue
		case e.state != off:
			// Stopping after its keep_alive: it reloads once it is off.
			kept = append(kept, r)
			continue
		}
		kept = append(kept, r)
		loaded := p.loaded()
		var used int64
		for _, l := range loaded {
			used += l.mem
		}
		if len(loaded) < s.cfg.Ollama.MaxLoaded && used+bytesOf(e.m.PeakGiB) <= s.usable {
			reload(s, e)
			continue
		}
		// It does not fit: unload one and wait for its memory; the queue
		// behind waits too.
		blocked = true
		slices.SortFunc(loaded, func(a, b *engine) int {
			return cmp.Or(cmp.Compare(a.m.KeepAliveSeconds, b.m.KeepAliveSeconds), cmp.Compare(a.m.Name, b.m.Name))
		})
		for _, l := range loaded {
			if l.state == stopping {
				p.unloading = l
				break
			}
			if l.state == up && l.idle() {
				s.stop(l)
				s.met.evictions++
				p.unloading = l
				break
			}
		}
	}
	clear(p.pending[len(kept):])
	p.pending = kept
}

// llamaSwap follows mostlygeek/llama-swap (proxy/processgroup.go and the
// `groups` section of config.example.yaml, at commit fea99ab) configured as its
// documentation recommends for several models on one card: the small
// models in one `persistent` group (swap: false, never unloaded by other
// groups), the big ones in `swap` groups (one member at a time, exclusive:
// false, so groups run side by side), sized so that the persistent group
// and one member of each swap group always fit (groupsFor); ttl 0 (a
// model stays until its group swaps):
//   - a request for a running model goes to it; concurrencyLimit (default
//     10) requests per model in flight at the proxy, waiting ones
//     included; past it, 429;
//   - a request for another member of a swap group waits, in arrival order
//     within the group, until the running member's in-flight requests
//     finish; that member stops and the requested one starts (from the
//     page cache once loaded before: llama-server reads its GGUF through
//     mmap).
type llamaSwap struct {
	s *sim
	// group[model] is its swap group, or -1 for the persistent group.
	group    []int
	groups   int
	pending  [][]*request // per swap group, FIFO
	waitP    []*request   // persistent models' requests during their load
	inFlight []int
}

func (p *llamaSwap) start() {
	p.group, p.groups = groupsFor(p.s.cfg, p.s.usable)
	p.pending = make([][]*request, p.groups)
	p.inFlight = make([]int, len(p.s.engines))
}

func (p *llamaSwap) arrive(r *request) {
	if p.inFlight[r.a.Model] >= p.s.cfg.LlamaSwap.ConcurrencyLimit {
		p.s.endRequest(r, outcomeRejected, 429)
		return
	}
	p.inFlight[r.a.Model]++
	e := p.s.engines[r.a.Model]
	g := p.group[r.a.Model]
	if g < 0 {
		if e.state == up {
			p.s.submit(e, r)
			return
		}
		p.waitP = append(p.waitP, r)
		if e.state == off {
			reload(p.s, e)
		}
		return
	}
	p.pending[g] = append(p.pending[g], r)
	p.process(g)
}

func (p *llamaSwap) finished(r *request) {
	p.inFlight[r.a.Model]--
	if g := p.group[r.a.Model]; g >= 0 {
		p.process(g)
	}
}

func (p *llamaSwap) copied(e *engine) {
	if g := p.group[e.idx]; g >= 0 {
		p.process(g)
		return
	}
	kept := p.waitP[:0]
	for _, r := range p.waitP {
		if r.a.Model == e.idx {
			p.s.submit(e, r)
		} else {
			kept = append(kept, r)
		}
	}
	p.waitP = kept
}

func (p *llamaSwap) settled(e *engine) {
	if g := p.group[e.idx]; g >= 0 {
		p.process(g)
	}
}

func (p *llamaSwap) tick() {}

func (p *llamaSwap) process(g int) {
	s := p.s
	for len(p.pending[g]) > 0 {
		r := p.pending[g][0]
		e := s.engines[r.a.Model]
		if e.state == up {
			p.pending[g] = p.pending[g][1:]
			s.submit(e, r)
			continue
		}
		for _, o := range s.engines {
			if o == e || p.group[o.idx] != g || o.state == off {
				continue
			}
			// Another member holds the group: stop it once it is idle.
			if o.state == up && o.idle() {
				s.stop(o)
				s.met.evictions++
			}
			return
		}
		if e.state == off {
			reload(s, e)
		}
		return
	}
}

// groupsFor writes the llama-swap `groups` an operator would for the
// config's models on a card of usable bytes: the persistent group takes
// the smallest models, the rest are spread over as many swap groups as
// fit beside it (k groups cost the k largest peaks), and the split that
// keeps the most models on the card at once wins (ties: the larger
// persistent group). Members go to the group with the fewest, largest
// first. group[i] is model i's swap group, or -1 for the persistent group.
func groupsFor(cfg *Config, usable int64) (group []int, groups int) {
	order := make([]int, len(cfg.Models))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(cfg.Models[a].PeakGiB, cfg.Models[b].PeakGiB) })
	bestP, bestK := 0, 1
	var persistent int64
	for np := 0; np <= len(order); np++ {
		if np > 0 {
			persistent += bytesOf(cfg.Models[order[np-1]].MemoryGiB)
		}
		if persistent > usable {
			break
		}
		rest := order[np:]
		k, sum := 0, persistent
		for j := len(rest) - 1; j >= 0; j-- {
			if sum+bytesOf(cfg.Models[rest[j]].PeakGiB) > usable {
				break
			}
			sum += bytesOf(cfg.Models[rest[j]].PeakGiB)
			k++
		}
		if len(rest) > 0 && k == 0 {
			continue
		}
		if np+k >= bestP+bestK {
			bestP, bestK = np, k
		}
	}
	group = make([]int, len(cfg.Models))
	for _, i := range order[:bestP] {
		group[i] = -1
	}
	rest := order[bestP:]
	groups = min(bestK, len(rest))
	size := make([]int, groups)
	for j := len(rest) - 1; j >= 0; j-- {
		g := 0
		for x := range size {
			if size[x] < size[g] {
				g = x
			}
		}
		group[rest[j]] = g
		size[g]++
	}
	return group, groups
}

// static pins a set of models, loaded at the start one at a time and never
// unloaded; requests for the others are rejected (404). Each engine serves
// its model's requests in arrival order, at most 512 waiting (then 429).
// `static` pins the models that fit at once in config order (pinned
// first, then by class); `static-best` the set found by staticBest;
// `ideal` every model, on a card without a memory limit.
type static struct {
	s      *sim
	hosted []bool
	// pend holds requests that arrived while their model still loads.
	pend []*request
}

// staticQueue is the per-model queue bound of the static baseline.
const staticQueue = 512

// staticFirstFit is `static`'s set: the models that fit at once, in
// config order, pinned first, then by class.
func staticFirstFit(s *sim) []bool {
	hosted := make([]bool, len(s.engines))
	order := slices.Clone(s.engines)
	slices.SortStableFunc(order, func(a, b *engine) int {
		return cmp.Or(cmp.Compare(a.m.residency, b.m.residency), -cmp.Compare(a.m.class, b.m.class))
	})
	var used int64
	for _, e := range order {
		if used+bytesOf(e.m.PeakGiB) <= s.usable {
			used += bytesOf(e.m.MemoryGiB)
			hosted[e.idx] = true
		}
	}
	return hosted
}

func (p *static) start() { p.next() }

// next loads the next hosted model, one at a time so peaks never overlap
// beyond the card.
func (p *static) next() {
	for _, e := range p.s.engines {
		if p.hosted[e.idx] && e.state == loading {
			return
		}
	}
	// The largest load peak over its footprint first: the others then
	// load beside resident models only.
	var next *engine
	for _, e := range p.s.engines {
		if p.hosted[e.idx] && e.state == off && (next == nil || e.m.PeakGiB-e.m.MemoryGiB > next.m.PeakGiB-next.m.MemoryGiB) {
			next = e
		}
	}
	if next != nil {
		p.s.load(next)
	}
}

func (p *static) arrive(r *request) {
	e := p.s.engines[r.a.Model]
	if !p.hosted[e.idx] {
		p.s.endRequest(r, outcomeRejected, 404)
		return
	}
	if e.state != up {
		// Still loading at the start: the request waits in the engine
		// queue, which the load fills in order.
		p.pend = append(p.pend, r)
		return
	}
	if len(e.waiting) >= staticQueue {
		p.s.endRequest(r, outcomeRejected, 429)
		return
	}
	p.s.submit(e, r)
}

func (p *static) finished(r *request) {}
func (p *static) copied(e *engine) {
	kept := p.pend[:0]
	for _, r := range p.pend {
		if r.a.Model == e.idx {
			p.s.submit(e, r)
		} else {
			kept = append(kept, r)
		}
	}
	p.pend = kept
	p.next()
}
func (p *static) settled(e *engine) {}
func (p *static) tick()             {}
