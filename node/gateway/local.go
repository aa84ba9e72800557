package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gpuplane/gpuplane/node/engine"
	"github.com/gpuplane/gpuplane/node/gateway/isolation"
	"github.com/gpuplane/gpuplane/node/gateway/queue"
	"github.com/gpuplane/gpuplane/node/traffic"
)

// progressEvery is how many streamed tokens are reported to the scheduler
// at a time.
const progressEvery = 4

// errPreempted is the cause an engine request is aborted with when the
// scheduler cuts it for interactive work.
var errPreempted = errors.New("preempted by interactive work")

// card is one local card: its scheduler, driven under mu with the wall
// clock, and the requests it holds.
type card struct {
	index uint32
	g     *Gateway

	mu    sync.Mutex
	s     *queue.Scheduler
	reqs  map[queue.ID]*pending
	timer *time.Timer
	// weights are the tenants' weights set on s.
	weights map[string]float64
}

// local is a replica on this node, a deployment of its card's scheduler.
type local struct {
	key  string // deployment/index: its name in the scheduler
	card *card
	stop chan struct{}

	// watched: its readiness follows Residency (watchResidency), not the
	// cluster's view. Set and cleared under Gateway.mu, so that one
	// watcher at most follows it; read without it by freshURL.
	watched atomic.Bool

	// Guarded by card.mu.
	rep   Replica
	url   string
	ready bool
	// slots: a llama.cpp engine's slots (slots.go), nil for other kinds.
	slots *slotPool
	// apiKey is the engine's API key (Options.EngineKeys), "" for none.
	apiKey string
}

// slotPoolFor is a new pool of rp's engine slots, nil if it has none.
func slotPoolFor(rp Replica) *slotPool {
	if rp.Kind != engine.KindLlamaCpp {
		return nil
	}
	return newSlotPool(max(rp.Slots, 1))
}

// pending is a request held by a card's scheduler; guarded by card.mu.
type pending struct {
	id    queue.ID
	model string
	// dispatches counts the scheduler's dispatches of it; attempt is the
	// one being run; cut is the dispatch that was preempted.
	dispatches, attempt, cut int
	cancel                   context.CancelCauseFunc
	end                      *queue.End
	firstDispatch            time.Time
	notify                   chan struct{}
}

func (p *pending) signal() {
	select {
	case p.notify <- struct{}{}:
	default:
	}
}

func (g *Gateway) card(index uint32) *card {
	c := g.cards[index]
	if c == nil {
		s, _ := queue.New(g.opts.Queue) // checked in New
		c = &card{index: index, g: g, s: s, reqs: map[queue.ID]*pending{}, weights: map[string]float64{}}
		for t, w := range g.opts.Weights {
			_ = s.SetTenant(t, w)
			c.weights[t] = w
		}
		g.cards[index] = c
	}
	return c
}

func replicaKey(deployment string, index uint32) string {
	return deployment + "/" + strconv.FormatUint(uint64(index), 10)
}

// localFor is the local record of rp, nil if the gateway does not serve it
// (yet).
func (g *Gateway) localFor(rp Replica) *local {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.locals[replicaKey(rp.Deployment, rp.Index)]
}

// load is the local replica's queue and in-flight count, and whether its
// engine takes requests now.
func (l *local) load() (int, bool) {
	c := l.card
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.s.Queued(l.key) + c.s.InFlight(l.key), l.ready
}

// syncLocals adds the replicas placed on this node to their cards'
// schedulers, updates them, and removes those gone.
func (g *Gateway) syncLocals(t *table) {
	want := map[string]Replica{}
	for _, m := range t.models {
		for _, rp := range m.Replicas {
			if rp.Node == g.opts.Node {
				want[replicaKey(rp.Deployment, rp.Index)] = rp
			}
		}
	}
	now := time.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	for key, l := range g.locals {
		if rp, ok := want[key]; ok && rp.Card == l.rep.Card {
			continue
		}
		g.removeLocal(l, now)
	}
	for key, rp := range want {
		l := g.locals[key]
		if l == nil {
			c := g.card(rp.Card)
			l = &local{key: key, card: c, rep: rp, stop: make(chan struct{}), slots: slotPoolFor(rp),
				apiKey: g.opts.EngineKeys.For(rp.Deployment, rp.Index)}
			c.mu.Lock()
			_, err := c.s.AddDeployment(g.queueDeployment(key, rp), now)
			c.mu.Unlock()
			if err != nil {
				g.log.Warn("gateway: add replica", "replica", key, "err", err)
				continue
			}
			g.locals[key] = l
		}
		// A fronted replica is watched once its controller holds it: the
		// gateway may see it placed before the controller serves its
		// front, and a replica deleted and placed again between two
		// refreshes keeps its record here while its old front (and that
		// front's watcher) is gone, so each refresh looks again.
		g.watchLocked(l, rp)
		c := l.card
		c.mu.Lock()
		if rp.KVTokens != l.rep.KVTokens || rp.Kind != l.rep.Kind || rp.Slots != l.rep.Slots ||
			rp.MaxInFlight != l.rep.MaxInFlight || rp.PriorityScheduling != l.rep.PriorityScheduling {
			if out, err := c.s.AddDeployment(g.queueDeployment(key, rp), now); err == nil {
				c.apply(out, now)
			}
		}
		if rp.Kind != l.rep.Kind || rp.Slots != l.rep.Slots {
			// Requests running in the old pool's slots still release
			// there; the new pool's slots start unknown, so none is reused
			// until the gateway has run a tenant's prompt in it.
			l.slots = slotPoolFor(rp)
		}
		l.rep = rp
		c.mu.Unlock()
		if !l.watched.Load() {
			g.setReady(l, rp.Running && rp.Resident && rp.Endpoint != "", rp.Endpoint)
		}
	}
}

// queueDeployment is a local replica's deployment in its card's
// scheduler: its in-flight cap, the engine's own concurrency where known,
// and its KV budget where known. The engine is sent no more than it runs
// at once, so that the requests that wait, wait here, where the
// scheduler's order (priority, then fairness) decides who runs next; in
// the engine's own queue they would run first come, first served. A
// llama.cpp engine holds at most one request per slot. An engine that
// orders its batch by priority takes interactive work beside the
// background work it pauses for it (queue.Deployment.Yields).
func (g *Gateway) queueDeployment(key string, rp Replica) queue.Deployment {
	inFlight := g.opts.MaxInFlight
	if rp.MaxInFlight > 0 {
		inFlight = rp.MaxInFlight
	}
	if rp.Kind == engine.KindLlamaCpp {
		inFlight = max(rp.Slots, 1)
	}
	return queue.Deployment{Name: key, MaxInFlight: inFlight, MaxTokens: max(rp.KVTokens, 0), QueueLimit: g.opts.QueueLimit,
		Yields: rp.PriorityScheduling}
}

// watchLocked starts following rp's residency (under g.mu) if it is a
// fronted replica whose controller holds it and no watcher follows it.
func (g *Gateway) watchLocked(l *local, rp Replica) {
	if !rp.Fronted || g.opts.Residency == nil || l.watched.Load() {
		return
	}
	if _, _, _, ok := g.opts.Residency.Serving(rp.Deployment, rp.Index); ok {
		l.watched.Store(true)
		go g.watchResidency(l, rp.Deployment, rp.Index)
	}
}

// watchResidency follows a warm or onDemand replica's residency: its queue
// is ready while its controller holds the model resident. It is given the
// replica's deployment and index, which its key fixes, because syncLocals
// replaces l.rep under the card's lock while it runs.
func (g *Gateway) watchResidency(l *local, deployment string, index uint32) {
	for {
		ready, url, changed, ok := g.opts.Residency.Serving(deployment, index)
		if !ok {
			// Its front is gone (the replica left, or is placed here
			// again under the same name): nothing is dispatched to the
			// old engine, and the next refresh watches the new front
			// (cleared after setReady, so that the next watcher's word
			// is the last).
			g.setReady(l, false, "")
			g.mu.Lock()
			l.watched.Store(false)
			g.mu.Unlock()
			return
		}
		g.setReady(l, ready && url != "", url)
		select {
		case <-changed:
		case <-l.stop:
			return
		}
	}
}

// setReady tells l's scheduler whether its engine takes requests, and at
// which URL.
func (g *Gateway) setReady(l *local, ready bool, url string) {
	c := l.card
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	l.url = url
	if ready == l.ready {
		return
	}
	l.ready = ready
	if ready {
		out, err := c.s.SetReady(l.key, now)
		if err == nil {
			c.apply(out, now)
		}
		return
	}
	_ = c.s.SetCold(l.key, time.Time{}, now)
	c.rearm(now)
}

// removeLocal takes a replica that left this node off its card: its
// queued requests are refused (503) and those in flight cut.
func (g *Gateway) removeLocal(l *local, now time.Time) {
	close(l.stop)
	delete(g.locals, l.key)
	c := l.card
	c.mu.Lock()
	defer c.mu.Unlock()
	if out, err := c.s.RemoveDeployment(l.key, now); err == nil {
		c.apply(out, now)
	}
}

func (g *Gateway) closeLocals() {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := time.Now()
	for _, l := range g.locals {
		g.removeLocal(l, now)
	}
}

// apply carries out a scheduler's output (under c.mu): abort the preempted
// requests' engine calls, wake the dispatched and the ended.
func (c *card) apply(out queue.Output, now time.Time) {
	for _, p := range out.Preempted {
		pd := c.reqs[p.ID]
		if pd == nil {
			continue
		}
		c.g.metrics.preempted(pd)
		pd.cut = pd.dispatches
		if pd.cancel != nil && pd.attempt == pd.dispatches {
			pd.cancel(errPreempted)
		}
		pd.signal()
	}
	for _, id := range out.Dispatched {
		pd := c.reqs[id]
		if pd == nil {
			continue
		}
		pd.dispatches++
		if pd.firstDispatch.IsZero() {
			pd.firstDispatch = now
		}
		pd.signal()
	}
	for _, e := range out.Ended {
		pd := c.reqs[e.ID]
		if pd == nil {
			continue
		}
		delete(c.reqs, e.ID)
		e := e
		pd.end = &e
		if e.Outcome == queue.Cancelled && e.WasInFlight && pd.cancel != nil {
			// The engine left the card: its requests are cut.
			pd.cancel(errors.New("the replica left this node"))
		}
		pd.signal()
	}
	c.rearm(now)
}

// rearm sets the timer for the scheduler's next deadline (under c.mu).
func (c *card) rearm(now time.Time) {
	next, ok := c.s.NextDeadline()
	if at, prune := c.s.NextPrune(); prune && (!ok || at.Before(next)) {
		// The tenants' idle records are forgotten in time even when no
		// request comes.
		next, ok = at, true
	}
	if !ok {
		return
	}
	d := max(next.Sub(now), time.Millisecond)
	if c.timer == nil {
		c.timer = time.AfterFunc(d, c.tick)
		return
	}
	c.timer.Reset(d)
}

func (c *card) tick() {
	c.promises()
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.s.Tick(now)
	if at, ok := c.s.NextPrune(); ok && !now.Before(at) {
		c.s.Prune(now)
	}
	c.apply(out, now)
}

// CardPromiser is what a Residency may also do: say when a replica whose
// requests wait for the card gets it at the latest (cardmanager.Manager,
// the bound `residency plan` shows). The gateway keeps its background
// requests waiting until then (queue.Scheduler.SetCardBy) rather than
// refusing them after the background cold wait, and its requests of
// every class where it is best-effort (BestEffortTeller) or yields the
// card to another model's turn (YieldTeller).
type CardPromiser interface {
	CardBy(model string, index uint32) (by time.Time, ok bool)
}

// BestEffortTeller is what a Residency may also say: whether a replica's
// controller serves it best-effort now (residency's protected set,
// cardmanager.Manager). Its requests of every class then wait for the
// turn the controller promises (queue.Scheduler.SetBestEffort) rather
// than giving up after their cold wait.
type BestEffortTeller interface {
	BestEffort(model string, index uint32) bool
}

// YieldTeller is what a Residency may also say: whether a replica waits
// because its controller has it yield its share of the card to another
// model's turn (cardmanager.Manager, residency.Controller.Yielding), with
// the card promised back by CardBy. Its requests of every class then wait
// for that (queue.Scheduler.SetYielding) rather than giving up after
// their cold wait.
type YieldTeller interface {
	Yielding(model string, index uint32) bool
}

// promises tells the card's scheduler, before it judges the cold waits,
// what the controller promises each replica that is not ready and has
// requests waiting. It takes no lock while it asks.
func (c *card) promises() {
	cp, ok := c.g.opts.Residency.(CardPromiser)
	if !ok {
		return
	}
	c.g.mu.Lock()
	var ls []*local
	for _, l := range c.g.locals {
		if l.card == c {
			ls = append(ls, l)
		}
	}
	c.g.mu.Unlock()
	type ask struct {
		key, model string
		index      uint32
	}
	var asks []ask
	c.mu.Lock()
	for _, l := range ls {
		if !l.ready && c.s.Queued(l.key) > 0 {
			asks = append(asks, ask{l.key, l.rep.Deployment, l.rep.Index})
		}
	}
	c.mu.Unlock()
	bt, _ := c.g.opts.Residency.(BestEffortTeller)
	yt, _ := c.g.opts.Residency.(YieldTeller)
	for _, a := range asks {
		if bt != nil {
			be := bt.BestEffort(a.model, a.index)
			c.mu.Lock()
			_ = c.s.SetBestEffort(a.key, be)
			c.mu.Unlock()
		}
		if yt != nil {
			y := yt.Yielding(a.model, a.index)
			c.mu.Lock()
			_ = c.s.SetYielding(a.key, y)
			c.mu.Unlock()
		}
		if by, ok := cp.CardBy(a.model, a.index); ok {
			c.mu.Lock()
			_ = c.s.SetCardBy(a.key, by, time.Now())
			c.mu.Unlock()
		}
	}
}

// call is a request served by a local replica: what its handler goroutine
// needs while it waits, kept in one object rather than in the frames it
// waits under. An idle stream's handler is blocked under those frames, and
// its stack (grown to 16 KiB while the request was parsed) halves at a
// collection only while they use under a quarter of it (plus 800 bytes):
// so the handler waits for its engine's first byte under ServeHTTP and
// run alone, and every other step is a helper that returns before the
// wait (bench/gateway's idle-stream memory: 4 KiB of stack per idle h2c
// stream, as a bare handler's).
type call struct {
	g      *Gateway
	w      http.ResponseWriter
	r      *http.Request
	req    *request
	m      *Model
	l      *local
	c      *card
	pd     pending
	labels []string
	// generated is the tokens the last attempt generated; demand reports
	// the request's end to the residency controller (nil: none).
	generated int
	demand    func(int64, time.Duration)
	// started is when the attempt being run was dispatched (zero: none
	// yet): the engine's time on the request, which the controller's
	// tokens/s profile is learned from, starts there, not at arrival (a
	// request that waited minutes for its model's turn would otherwise
	// teach it a speed a hundred times too low).
	started time.Time

	// The attempt being run: its context, its engine's URL, kind and
	// priority support, the body sent, the slot it holds (slots nil:
	// none), and the status of the engine's answer (0: none came).
	ctx         context.Context
	url, kind   string
	prioritized bool
	body        []byte
	slots       *slotPool
	slot        int
	status      int
	// rename puts back in the answer the name the engine was sent in
	// place of the client's (nil: none).
	rename *rename
	// ex: the attempt's exchange with its engine while it waits for the
	// answer.
	ex exchange
}

// step is what a call does next.
type step uint8

const (
	stepWait step = iota
	stepRun
	// stepRead: read the engine's first byte (x.ex).
	stepRead
	stepEnd
	stepDone
)

// run runs a request through its card's scheduler and the replica's
// engine. An idle stream's handler waits here, under ServeHTTP alone, for
// its engine's first byte: the read is made in this loop itself, every
// other step in helpers that return before it.
func (x *call) run() {
	if x.demand != nil {
		defer x.endDemand()
	}
	for s := x.next(); s != stepDone; {
		if s == stepRead {
			n, err := x.ex.c.Read(x.ex.first[:])
			s = x.read(n, err)
			continue
		}
		s = x.advance(s)
	}
}

// advance takes a step other than a read, and says the next.
func (x *call) advance(s step) step {
	switch s {
	case stepRun:
		return x.begin()
	case stepEnd:
		x.g.answerEnd(x.w, x.m, x.req, *x.pd.end, x.waitCause(*x.pd.end))
		outcome := traffic.Failed
		if x.pd.end.Outcome == queue.Rejected || x.pd.end.Outcome == queue.Expired {
			outcome = traffic.Rejected
		}
		x.record(outcome, time.Time{}, 0)
		return stepDone
	default:
		if !x.wait() {
			return stepDone
		}
		return x.next()
	}
}

// enqueue puts a request on its card's scheduler (answering it if the
// scheduler refuses it): nil when answered; the call is run by run.
func (g *Gateway) enqueue(w http.ResponseWriter, r *http.Request, req *request, m *Model, l *local) *call {
	c := l.card
	x := &call{g: g, w: w, r: r, req: req, m: m, l: l, c: c}
	x.pd = pending{model: m.Served, notify: make(chan struct{}, 1)}
	now := time.Now()
	c.mu.Lock()
	// The tenant's weight is set for every request: a weight a token or
	// a peer node gave an earlier request must not outlive it (a
	// request without one weighs what the configuration says, else 1).
	wt, carried := req.who.weight, req.who.weight > 0
	if !carried {
		if wt = g.opts.Weights[req.who.tenant]; !(wt > 0) {
			wt = 1
		}
	}
	if c.s.Weight(req.who.tenant) != wt {
		_ = c.s.SetTenant(req.who.tenant, wt)
	}
	if carried {
		c.weights[req.who.tenant] = wt
	} else if _, ok := g.opts.Weights[req.who.tenant]; !ok {
		delete(c.weights, req.who.tenant)
	}
	// No engine's context is as long as the queue's bound: a request
	// that asks for more (no context length known to refuse it) reserves
	// the bound.
	prompt, maxTokens := min(req.promptTokens, queue.MaxRequestTokens), min(req.maxTokens, queue.MaxRequestTokens)
	if kv := l.rep.KVTokens; kv > 0 && satAdd(prompt, maxTokens) > kv {
		// Larger than the engine's whole KV budget: it runs alone (the
		// engine cuts or refuses it), never waits for room that cannot be.
		prompt = min(prompt, kv)
		maxTokens = kv - prompt
	}
	id, out, err := c.s.Enqueue(queue.Request{Deployment: l.key, Tenant: req.who.tenant, Class: req.class,
		PromptTokens: prompt, MaxTokens: maxTokens, Streamed: req.stream}, now)
	if err != nil {
		c.mu.Unlock()
		errorf(http.StatusBadRequest, "invalid_request_error", "invalid_request", "%v", err).write(w)
		return nil
	}
	x.pd.id = id
	c.reqs[id] = &x.pd
	c.apply(out, now)
	rep := l.rep
	c.mu.Unlock()

	x.labels = g.metrics.labels(m.Served, req.class, req.who.tenant)
	if rep.Fronted && g.opts.Residency != nil {
		if !l.watched.Load() {
			// Its front may have come since the last refresh (a
			// replica placed here again): follow it now, not a refresh
			// later, so that this request's load is seen.
			g.mu.Lock()
			if g.locals[l.key] == l {
				g.watchLocked(l, rep)
			}
			g.mu.Unlock()
		}
		x.demand = g.opts.Residency.Demand(rep.Deployment, rep.Index)
		if ka, ok := g.opts.Residency.(KeepAliver); ok && req.keepAlive != nil {
			ka.KeepAlive(rep.Deployment, rep.Index, *req.keepAlive)
		}
	}
	return x
}

func (x *call) endDemand() {
	var elapsed time.Duration
	if !x.started.IsZero() {
		elapsed = time.Since(x.started)
	}
	x.demand(int64(x.generated), elapsed)
}

// next is the call's next step: run an attempt the scheduler dispatched
// (its context and engine set up), answer the end the scheduler gave it,
// or wait.
func (x *call) next() step {
	c, pd, l := x.c, &x.pd, x.l
	c.mu.Lock()
	defer c.mu.Unlock()
	if pd.dispatches > pd.attempt && pd.cut < pd.dispatches {
		pd.attempt = pd.dispatches
		x.started = time.Now()
		ctx, cancel := context.WithCancelCause(x.r.Context())
		x.ctx, pd.cancel = ctx, cancel
		if pd.attempt == 1 {
			x.g.metrics.queued(x.labels, pd.firstDispatch.Sub(x.req.arrived))
		}
		x.url, x.kind, x.prioritized, x.slots = l.url, l.rep.Kind, l.rep.PriorityScheduling, l.slots
		if x.req.adapter != "" && l.rep.Endpoint != "" {
			// The replica's front pages the adapter onto the card (and
			// refuses it to tenants it is private from); its engine alone
			// would answer 404 for an adapter not loaded yet.
			x.url = l.rep.Endpoint
		}
		return stepRun
	}
	if pd.end != nil {
		return stepEnd
	}
	return stepWait
}

// wait waits for the scheduler's word on the call; false: the client went
// away (the request is cancelled).
func (x *call) wait() bool {
	select {
	case <-x.pd.notify:
		return true
	case <-x.r.Context().Done():
	}
	c := x.c
	c.mu.Lock()
	if x.pd.end == nil {
		now := time.Now()
		if out, err := c.s.Cancel(x.pd.id, now); err == nil {
			c.apply(out, now)
		}
	}
	c.mu.Unlock()
	x.record(traffic.Abandoned, time.Time{}, 0)
	return false
}

// KeepAliver is what a Residency may also do: take a request's
// keep_alive as its hint for how long the replica's model stays loaded
// after it (cardmanager.Manager; docs/residency.md). It is called after
// Demand for the same request.
type KeepAliver interface {
	KeepAlive(model string, index uint32, d time.Duration)
}

// WaitExplainer is what a Residency may also do: say why a replica did
// not serve a request that waited for it past the cold wait, in one cause
// with its numbers, recording it as its controller's reject decision
// (cardmanager.Manager). "": it cannot say.
type WaitExplainer interface {
	WaitExpired(model string, index uint32, waited time.Duration) string
}

// waitCause is why the replica did not serve a request the scheduler
// turned away after its cold wait (503), as its residency controller
// says; "" for any other end.
func (x *call) waitCause(e queue.End) string {
	if e.Outcome != queue.Rejected || e.Status != http.StatusServiceUnavailable || !x.l.rep.Fronted {
		return ""
	}
	ex, ok := x.g.opts.Residency.(WaitExplainer)
	if !ok {
		return ""
	}
	return ex.WaitExpired(x.l.rep.Deployment, x.l.rep.Index, time.Since(x.req.arrived))
}

// answerEnd answers a request the scheduler ended without an engine's
// answer; cause, where known, is why a 503's model was not served.
func (g *Gateway) answerEnd(w http.ResponseWriter, m *Model, req *request, e queue.End, cause string) {
	var aerr *apiError
	switch e.Outcome {
	case queue.Rejected:
		if e.Status == http.StatusTooManyRequests {
			aerr = errorf(e.Status, "rate_limit_error", "queue_full",
				"model %q: its queue is full; retry after %s", m.Served, e.RetryAfter)
		} else if cause != "" {
			aerr = errorf(e.Status, "server_error", "model_not_loaded",
				"model %q was not served in time: %s; retry after %s", m.Served, cause, e.RetryAfter)
		} else {
			aerr = errorf(e.Status, "server_error", "model_not_loaded",
				"model %q could not be loaded in time (it is cold, loading, or its card is full); retry after %s", m.Served, e.RetryAfter)
		}
		aerr.retryAfter = e.RetryAfter
	case queue.Expired:
		aerr = errorf(http.StatusServiceUnavailable, "server_error", "expired", "model %q: the request waited past its deadline", m.Served)
		aerr.retryAfter = time.Second
	case queue.Preempted:
		// Only streams end preempted; one cut before the engine answered
		// ends as any cut stream does, with an error event.
		g.metrics.rejected(m.Served, http.StatusServiceUnavailable)
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Cache-Control", "no-cache")
		w.WriteHeader(http.StatusOK)
		writePreempted(w, m, 0)
		return
	default:
		aerr = errorf(http.StatusServiceUnavailable, "server_error", "cancelled", "model %q: the request was cut off: its replica left this node", m.Served)
		aerr.retryAfter = time.Second
	}
	g.metrics.rejected(m.Served, aerr.status)
	aerr.write(w)
}

// result is how one engine attempt went.
type result struct {
	// done: the client has its answer (or left); otherwise the request was
	// preempted and re-queued, and waits to run again.
	done      bool
	generated int
	// first is when the client got its first token (zero: none).
	first time.Time
	// whole: the engine's answer was read to its end (so a llama.cpp
	// slot holds the request's prompt), whatever became of the client
	// after: the server may cancel a handler's context once the answer
	// is written.
	whole bool
}

// begin starts an attempt: its request sent to its engine, the call
// reads the answer (stepRead); or the attempt is over, and so perhaps is
// the call.
func (x *call) begin() step {
	if aerr := x.prepare(); aerr != nil {
		x.generated = 0
		if x.g.finishWith(x.w, x.c, &x.pd, x.ctx, x.req, x.m, aerr).done {
			return stepDone
		}
		return x.next()
	}
	if x.g.opts.Engines != nil {
		resp, err := x.g.sendClient(x.ctx, x.url, x.req, x.body, x.l.apiKey)
		if fresh := x.freshAfter(err); fresh != "" {
			resp, err = x.g.sendClient(x.ctx, fresh, x.req, x.body, x.l.apiKey)
		}
		return x.complete(resp, err)
	}
	err := x.open(x.url)
	if fresh := x.freshAfter(err); fresh != "" {
		err = x.open(fresh)
	}
	if err != nil {
		return x.complete(nil, err)
	}
	return stepRead
}

// open sends the attempt's request to the engine at url on x.ex.
func (x *call) open(url string) error {
	host, head, err := engineHead(url, x.req.path, len(x.body), x.req.stream, x.req.who.tenant, x.g.opts.FrontKey, x.l.apiKey)
	if err != nil {
		return err
	}
	x.ex = exchange{host: host, head: head, body: x.body}
	return x.g.engines.begin(x.ctx, &x.ex)
}

// read goes on with an attempt after the read of its answer's first byte.
func (x *call) read(n int, err error) step {
	resp, err := x.g.engines.end(x.ctx, &x.ex, n, err)
	if err == errRetry {
		if err = x.g.engines.begin(x.ctx, &x.ex); err == nil {
			return stepRead
		}
	}
	return x.complete(resp, err)
}

// complete ends an attempt with the engine's answer (or its failure).
func (x *call) complete(resp *http.Response, err error) step {
	x.ex = exchange{}
	res := x.answer(resp, err)
	x.generated = res.generated
	if res.done {
		outcome := traffic.Served
		if x.status != http.StatusOK {
			outcome = traffic.Failed
		}
		x.record(outcome, res.first, res.generated)
	}
	x.freeSlot(x.status == http.StatusOK && res.whole)
	if res.done {
		return stepDone
	}
	return x.next()
}

// freeSlot hands the attempt's llama.cpp slot back, if it holds one.
// holds: the engine answered in full, so the slot holds the tenant's
// prompt; otherwise its content is unknown.
func (x *call) freeSlot(holds bool) {
	if x.slots != nil {
		x.slots.release(x.slot, x.req.who.tenant, holds)
		x.slots = nil
	}
}

// prepare readies an attempt: its slot (a llama.cpp engine's) and the body
// sent to the engine.
func (x *call) prepare() *apiError {
	req, m := x.req, x.m
	fields := map[string]any{}
	x.status, x.rename = 0, nil
	if x.slots != nil {
		// A llama.cpp engine: the request runs in a slot this gateway gave
		// it, and reuses the slot's cache only if the slot holds its own
		// tenant's prompt. The scheduler dispatched it because a slot is
		// free (the replica's in-flight cap is its slots): it waits here at
		// most for the request that had the slot to hand it back.
		slot, reuse, err := x.slots.acquire(x.ctx, req.who.tenant)
		if err != nil {
			x.slots = nil
			return errorf(http.StatusServiceUnavailable, "server_error", "engine_error", "model %q: no engine slot: %v", m.Served, err)
		}
		x.slot = slot
		fields["id_slot"] = slot
		if !reuse {
			fields["cache_prompt"] = false
		}
	}
	if x.prioritized {
		// vLLM's order: lower is handled earlier, 0 the default.
		fields["priority"] = int(queue.Interactive - req.class)
	}
	if len(m.AdapterIDs) > 0 {
		fields["lora"] = llamaLoRAList(m.AdapterIDs, req.adapter)
	}
	switch _, byID := m.AdapterIDs[req.adapter]; {
	case req.adapter != "" && byID:
		if req.model != m.Served {
			fields["model"] = m.Served
		}
	case req.adapter != "":
		fields["model"] = req.adapter
	case m.EngineModel != "":
		// The engine knows the model by its own name (Ollama's tag), and
		// answers with it: the client gets the served name back, as the
		// other engines answer.
		if req.model != m.EngineModel {
			fields["model"] = m.EngineModel
			x.rename = newRename(m.EngineModel, m.Served)
		}
	case req.model != m.Served:
		// An alias: the engine knows the deployment by its served name.
		fields["model"] = m.Served
	}
	if engine.AcceptsCacheSalt(x.kind) {
		if s := x.g.saltFor(req.who.tenant, m.Served); s != "" {
			fields["cache_salt"] = s
		}
	}
	x.body = withFields(req.body, fields)
	return nil
}

// llamaLoRAList is the "lora" list sent with every request to a llama.cpp
// engine that loaded adapters (ids: each adapter's id): every adapter by
// id, at scale 1 for the one the request names and 0 for the rest, so a
// base request ("" adapter) runs on the base alone. llama-server gives a
// request without a list the command line's scales (1 for every --lora,
// whatever --lora-init-without-apply), and only an explicit list that
// differs from the slot's last one clears the slot's cached prompt
// (tools/server/server-context.cpp, launch_slot_with_task).
func llamaLoRAList(ids map[string]int, adapter string) []map[string]any {
	out := make([]map[string]any, 0, len(ids))
	for name, id := range ids {
		scale := 0
		if name == adapter {
			scale = 1
		}
		out = append(out, map[string]any{"id": id, "scale": scale})
	}
	slices.SortFunc(out, func(a, b map[string]any) int { return a["id"].(int) - b["id"].(int) })
	return out
}

// freshAfter is the address to send the request to once more after err:
// if nothing listened at the replica's address (its engine was restarted
// on another port, as after an onDemand reload), nothing was sent, so it
// goes to the address read afresh. "": not again.
func (x *call) freshAfter(err error) string {
	if err == nil || !errors.Is(err, syscall.ECONNREFUSED) || x.ctx.Err() != nil {
		return ""
	}
	if fresh := x.g.freshURL(x.ctx, x.l, x.req.adapter != ""); fresh != x.url {
		return fresh
	}
	return ""
}

// answer relays the engine's answer (or its failure) to the client.
func (x *call) answer(resp *http.Response, err error) result {
	g, w, c, pd, ctx, req, m := x.g, x.w, x.c, &x.pd, x.ctx, x.req, x.m
	if err != nil {
		if x.requeued() {
			return result{}
		}
		return g.finishWith(w, c, pd, ctx, req, m, errorf(http.StatusBadGateway, "server_error", "engine_error", "model %q: engine: %v", m.Served, err))
	}
	x.status = resp.StatusCode
	defer resp.Body.Close()
	if req.stream && resp.StatusCode == http.StatusOK {
		// The slot is handed back once the engine's stream has been
		// read to its end, before the client has read it all.
		return g.relayStream(ctx, w, resp, req, m, x.labels, pd, c, x.rename, func() { x.freeSlot(true) })
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, 256<<20))
	if (err != nil || resp.StatusCode >= 500) && x.requeued() {
		return result{}
	}
	if err != nil {
		return g.finishWith(w, c, pd, ctx, req, m, errorf(http.StatusBadGateway, "server_error", "engine_error", "model %q: engine: %v", m.Served, err))
	}
	// The engine is done with the slot: it is free before the client has
	// the answer, so the client's next request finds it.
	x.freeSlot(resp.StatusCode == http.StatusOK)
	var u struct {
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	_ = json.Unmarshal(data, &u)
	generated := u.Usage.CompletionTokens
	now := time.Now()
	c.mu.Lock()
	cut := pd.cut == pd.attempt
	if cut {
		// Cut after the engine answered in full: the answer stands, and
		// the re-queued run is not needed.
		if pd.end == nil {
			if out, err := c.s.Cancel(pd.id, now); err == nil {
				c.apply(out, now)
			}
		}
	} else if pd.end == nil {
		if out, err := c.s.Finish(pd.id, generated, now); err == nil {
			c.apply(out, now)
		}
	}
	c.mu.Unlock()
	for _, h := range []string{"Content-Type", "Retry-After"} {
		if v := resp.Header.Get(h); v != "" {
			w.Header().Set(h, v)
		}
	}
	if resp.StatusCode >= 400 {
		data = append(engineError(resp.StatusCode, data), '\n')
		w.Header().Set("Content-Type", "application/json")
	} else {
		data = x.rename.apply(data)
	}
	if resp.StatusCode == http.StatusOK {
		// Counted before the client has its answer: a scrape after it
		// sees the request.
		g.metrics.firstToken(x.labels, now.Sub(req.arrived))
		g.metrics.servedTokens(x.labels, req.promptTokens, generated)
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(data)))
	w.WriteHeader(resp.StatusCode)
	// The engine's slot is free already; the handler (and the answer)
	// is not held for a client that does not read either.
	sw := newStallWriter(w, g.opts.StreamStall)
	if _, err := sw.Write(data); err == nil && sw.flush() == nil {
		sw.clear()
	}
	return result{done: true, generated: generated, first: now, whole: true}
}

// freshURL reads a local replica's engine address again (its residency
// controller's, and the cluster's view), for a request that found nothing
// listening at the old one.
func (g *Gateway) freshURL(ctx context.Context, l *local, adapter bool) string {
	if l.watched.Load() {
		l.card.mu.Lock()
		rp := l.rep
		l.card.mu.Unlock()
		if ready, u, _, ok := g.opts.Residency.Serving(rp.Deployment, rp.Index); ok {
			g.setReady(l, ready && u != "", u)
		}
	}
	g.refresh(ctx)
	c := l.card
	c.mu.Lock()
	defer c.mu.Unlock()
	if adapter && l.rep.Endpoint != "" {
		return l.rep.Endpoint
	}
	return l.url
}

// engineHead is the head of a request to an engine (apiKey its API key,
// "" for none).
func engineHead(url, path string, n int, stream bool, tenant, frontKey, apiKey string) (string, []byte, error) {
	accept := "application/json"
	if stream {
		accept = "text/event-stream"
	}
	h := []string{"Content-Type", "application/json", "Accept", accept, TenantHeader, tenant}
	if frontKey != "" {
		h = append(h, isolation.FrontKeyHeader, frontKey)
	}
	if apiKey != "" {
		h = append(h, "Authorization", "Bearer "+apiKey)
	}
	return requestHead(url, path, n, h...)
}

// sendClient posts a request's body to its engine with Options.Engines.
func (g *Gateway) sendClient(ctx context.Context, url string, req *request, body []byte, apiKey string) (*http.Response, error) {
	out, err := http.NewRequestWithContext(ctx, http.MethodPost, url+req.path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	out.Header.Set("Content-Type", "application/json")
	if req.stream {
		out.Header.Set("Accept", "text/event-stream")
	} else {
		out.Header.Set("Accept", "application/json")
	}
	out.Header.Set(TenantHeader, req.who.tenant)
	if g.opts.FrontKey != "" {
		out.Header.Set(isolation.FrontKeyHeader, g.opts.FrontKey)
	}
	engine.Authorize(out.Header, apiKey)
	return g.opts.Engines.Do(out)
}

// requeued puts a request of a background deployment that is not
// streamed back in its queue when its engine failed it after the
// residency controller took the engine off the card (asleep or stopped:
// the replica is not ready): nothing reached its client, so it runs again
// when the model is back, in the turn the controller promises it, as a
// preempted one does (queue.Scheduler.Requeue). A request only lowered to
// background on a deployment of a higher class is answered (its
// controller gives that model no lower-class turn to wait for). false: it
// is answered.
func (x *call) requeued() bool {
	if x.m.Class != queue.Background || x.req.class != queue.Background || x.req.stream || x.r.Context().Err() != nil {
		return false
	}
	c, pd := x.c, &x.pd
	c.mu.Lock()
	defer c.mu.Unlock()
	if x.l.ready || pd.end != nil || pd.cut == pd.attempt {
		return false
	}
	now := time.Now()
	again, out, err := c.s.Requeue(pd.id, now)
	if err != nil || !again {
		return false
	}
	pd.cut = pd.dispatches
	c.apply(out, now)
	return true
}

// record adds the request's end to its card's traffic record
// (Options.Traffic): first is its first token (zero: none).
func (x *call) record(outcome traffic.Outcome, first time.Time, generated int) {
	if x.g.opts.Traffic == nil || x.l == nil {
		return
	}
	x.l.card.mu.Lock()
	index, card := x.l.rep.Index, x.l.rep.Card
	x.l.card.mu.Unlock()
	r := traffic.Record{Arrived: x.req.arrived, Deployment: x.m.Deployment, Replica: index, Adapter: x.req.adapter,
		Tenant: x.req.who.tenant, Class: x.req.class.String(), PromptTokens: x.req.promptTokens, OutputTokens: generated, Outcome: outcome}
	if !first.IsZero() {
		r.TTFT = first.Sub(x.req.arrived)
	}
	x.g.opts.Traffic.Add(card, r)
}

// finishWith ends an attempt that got no answer from the engine: a
// preempted non-streamed request waits to run again; a client that left
// is cancelled; otherwise the error is the answer.
func (g *Gateway) finishWith(w http.ResponseWriter, c *card, pd *pending, ctx context.Context, req *request, m *Model, aerr *apiError) result {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if pd.cut == pd.attempt {
		if pd.end == nil {
			return result{} // re-queued: it runs again
		}
		c.mu.Unlock()
		g.answerEnd(w, m, req, *pd.end, "")
		c.mu.Lock()
		return result{done: true}
	}
	if pd.end == nil {
		var out queue.Output
		var err error
		if ctx.Err() != nil {
			out, err = c.s.Cancel(pd.id, now)
		} else {
			out, err = c.s.Finish(pd.id, 0, now)
		}
		if err == nil {
			c.apply(out, now)
		}
	}
	if ctx.Err() == nil {
		aerr.retryAfter = time.Second
		aerr.write(w)
	}
	return result{done: true}
}
