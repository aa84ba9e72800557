package simserve

import (
	"cmp"
	"slices"
)

// The baselines run on the same engines and trace as gpuplane. Each
// follows the tool's documented behaviour (its scheduler's source and
// docs, named below; docs/simulate.md); what a tool leaves to chance is
// made deterministic and said.

// ollama follows ollama/ollama server/sched.go and envconfig/config.go:
//   - one global FIFO of pending requests, at most OLLAMA_MAX_QUEUE (512)
//     waiting; past it, 503;
//   - processPending handles one pending request at a time and blocks the
//     others until it runs: a request for a loaded runner goes to it (the
//     runner serves OLLAMA_NUM_PARALLEL at once, default 1, the rest wait
//     on its semaphore); a request for a model not loaded loads it when
//     fewer than OLLAMA_MAX_LOADED_MODELS (3 per GPU) are loaded and its
//     memory fits, one load at a time;
//   - otherwise findRunnerToUnload sorts runners ByDurationAndName
//     (shortest keep_alive, then name), unloads the first idle one and
//     waits for its memory; with none idle, it waits for the first in that
//     order to go idle;
//   - an idle runner unloads when its keep_alive (default 5m) expires;
//   - no sleep tier: every load is cold.
type ollama struct {
	s       *sim
	pending []*request
	// blocked is the engine the head request waits for (a load or an
	// unload in progress), or nil.
	blocked *engine
}

func (p *ollama) start() {
	for _, e := range p.s.engines {
		e.maxInFlight = p.s.cfg.Ollama.NumParallel
	}
}

func (p *ollama) arrive(r *request) {
	if len(p.pending) >= p.s.cfg.Ollama.MaxQueue {
		p.s.endRequest(r, outcomeRejected, 503)
		return
	}
	p.pending = append(p.pending, r)
	p.process()
}

func (p *ollama) finished(r *request) { p.process() }
func (p *ollama) copied(e *engine) {
	if p.blocked == e {
		p.blocked = nil
	}
	p.process()
}
func (p *ollama) settled(e *engine) {
	if p.blocked == e {
		p.blocked = nil
	}
	p.process()
}

func (p *ollama) tick() {
	for _, e := range p.s.engines {
		if e.state == up && e.idle() && p.s.now-e.lastUse >= e.m.KeepAliveSeconds && p.blocked != e {
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
	for len(p.pending) > 0 && p.blocked == nil {
		r := p.pending[0]
		e := s.engines[r.a.Model]
		if e.state == up {
			p.pending = p.pending[1:]
			s.submit(e, r)
			continue
		}
		if e.state != off {
			// Stopping after its keep_alive, or loading: wait for it.
			p.blocked = e
			return
		}
		loaded := p.loaded()
		var used int64
		for _, l := range loaded {
			used += l.mem
		}
		if len(loaded) < s.cfg.Ollama.MaxLoaded && used+bytesOf(e.m.PeakGiB) <= s.usable {
			s.load(e)
			p.blocked = e
			return
		}
		slices.SortFunc(loaded, func(a, b *engine) int {
			return cmp.Or(cmp.Compare(a.m.KeepAliveSeconds, b.m.KeepAliveSeconds), cmp.Compare(a.m.Name, b.m.Name))
		})
		for _, l := range loaded {
			if l.state == up && l.idle() {
				s.stop(l)
				s.met.evictions++
				p.blocked = l
				return
			}
		}
		// None idle: wait for the first in order to finish its work.
		if len(loaded) > 0 {
			if l := loaded[0]; l.state == up {
				return
			}
			p.blocked = loaded[0]
		}
		return
	}
}

// llamaSwap follows mostlygeek/llama-swap (config.example.yaml, proxy
// ProcessGroup with swap: true, the default single group):
//   - one model runs at a time; a request for another waits until the
//     running model's in-flight requests finish, then that model stops
//     and the requested one starts (cold: llama-swap stops and starts
//     processes);
//   - requests are served in arrival order (FIFO), so a request behind a
//     swap waits for it;
//   - concurrencyLimit (default 10) requests per model in flight at the
//     proxy, waiting ones included; past it, 429;
//   - ttl 0 (the default): a model stays until another is requested.
type llamaSwap struct {
	s        *sim
	pending  []*request
	inFlight []int
}

func (p *llamaSwap) start() { p.inFlight = make([]int, len(p.s.engines)) }

func (p *llamaSwap) arrive(r *request) {
	if p.inFlight[r.a.Model] >= p.s.cfg.LlamaSwap.ConcurrencyLimit {
		p.s.endRequest(r, outcomeRejected, 429)
		return
	}
	p.inFlight[r.a.Model]++
	p.pending = append(p.pending, r)
	p.process()
}

func (p *llamaSwap) finished(r *request) {
	p.inFlight[r.a.Model]--
	p.process()
}
func (p *llamaSwap) copied(e *engine)  { p.process() }
func (p *llamaSwap) settled(e *engine) { p.process() }
func (p *llamaSwap) tick()             {}

func (p *llamaSwap) process() {
	s := p.s
	for len(p.pending) > 0 {
		r := p.pending[0]
		e := s.engines[r.a.Model]
		if e.state == up {
			p.pending = p.pending[1:]
			s.submit(e, r)
			continue
		}
		for _, o := range s.engines {
			if o == e || o.state == off {
				continue
			}
			// Another model holds the card: stop it once it is idle.
			if o.state == up && o.idle() {
				s.stop(o)
				s.met.evictions++
			}
			return
		}
		if e.state == off {
			s.load(e)
		}
		return
	}
}

// static pins the models that fit at once, in config order (pinned first,
// then by class), loaded at the start and never unloaded; requests for
// the others are rejected. Each engine serves its model's requests in
// arrival order, at most 512 waiting (then 429).
type static struct {
	s      *sim
	hosted []bool
	// pend holds requests that arrived while their model still loads.
	pend []*request
}

// staticQueue is the per-model queue bound of the static baseline.
const staticQueue = 512

func (p *static) start() {
	s := p.s
	p.hosted = make([]bool, len(s.engines))
	order := slices.Clone(s.engines)
	slices.SortStableFunc(order, func(a, b *engine) int {
		return cmp.Or(cmp.Compare(a.m.residency, b.m.residency), -cmp.Compare(a.m.class, b.m.class))
	})
	var used int64
	for _, e := range order {
		if used+bytesOf(e.m.PeakGiB) <= s.usable {
			used += bytesOf(e.m.MemoryGiB)
			p.hosted[e.idx] = true
		}
	}
	// Load one at a time so peaks never overlap beyond the card.
	p.next()
}

func (p *static) next() {
	for _, e := range p.s.engines {
		if p.hosted[e.idx] && e.state == loading {
			return
		}
	}
	for _, e := range p.s.engines {
		if p.hosted[e.idx] && e.state == off {
			p.s.load(e)
			return
		}
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
