package servesim

import (
	"fmt"
	"slices"
	"time"

	"github.com/gpuplane/gpuplane/internal/engines"
	"github.com/gpuplane/gpuplane/node/gateway/queue"
	"github.com/gpuplane/gpuplane/node/residency"
)

// epoch is virtual time zero for the controller's clock.
var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// gpuplane drives the agent's own code: one residency.Controller for the
// card (which models are loaded, asleep or cold) and one queue.Scheduler
// (which request runs next, admission, preemption), exactly as the node
// wires them: the controller hears of every request before it is
// dispatched and of every end; the scheduler dispatches only to an engine
// the controller holds resident and not draining.
type gpuplane struct {
	s     *sim
	clock *residency.ManualClock
	c     *residency.Controller
	q     *queue.Scheduler
	evq   []residency.Event
	reqs  map[queue.ID]*request
	// op is the copy in progress per engine (ActLoad or ActWake).
	op []residency.ActionKind
	// anomalies counts actions the engines could not carry out (an action
	// for an engine in the wrong state); each is also a violation.
	anomalies []string
}

func newGpuplane(s *sim) (*gpuplane, error) {
	clock := residency.NewManualClock(epoch)
	c, err := residency.New(residency.Config{Card: s.cfg.Card.Name, Memory: bytesOf(s.cfg.Card.MemoryGiB), HeadroomPercent: s.cfg.Card.HeadroomPercent,
		BestEffort: !s.cfg.NoBestEffort}, clock)
	if err != nil {
		return nil, err
	}
	q, err := queue.New(queue.Config{NoPreemption: s.cfg.NoPreemption})
	if err != nil {
		return nil, err
	}
	p := &gpuplane{s: s, clock: clock, c: c, q: q, reqs: map[queue.ID]*request{}, op: make([]residency.ActionKind, len(s.engines))}
	for _, t := range s.cfg.Tenants {
		if err := q.SetTenant(t.Name, t.Weight); err != nil {
			return nil, err
		}
	}
	for _, e := range s.engines {
		d := queue.Deployment{Name: e.m.Name, MaxInFlight: e.m.MaxInFlight, MaxTokens: e.m.KVTokens, QueueLimit: 512}
		if s.fronted {
			// A front holds a request only until the model is resident;
			// the sim engine process runs every request whose prompt fits
			// its KV pool.
			d.MaxInFlight, d.MaxTokens, d.QueueLimit = frontedInFlight, 0, frontedInFlight
			if !s.cfg.EngineBatch {
				e.maxInFlight = frontedInFlight
			}
		}
		if _, err := q.AddDeployment(d, epoch); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// frontedInFlight stands for no cap: more requests than a replay sends.
const frontedInFlight = 1 << 20

func (p *gpuplane) at() time.Time { return epoch.Add(time.Duration(p.s.now * float64(time.Second))) }

func (p *gpuplane) send(ev residency.Event) { p.evq = append(p.evq, ev) }

// flush hands the queued events to the controller and executes its
// actions, in order.
func (p *gpuplane) flush() {
	for len(p.evq) > 0 {
		ev := p.evq[0]
		p.evq = p.evq[1:]
		p.clock.Set(p.at())
		out := p.c.Handle(ev)
		if out.Err != nil {
			p.anomaly("controller refused %T: %v", ev, out.Err)
		}
		p.s.met.ctrlViolations += len(out.Violations)
		for _, a := range out.Actions {
			p.exec(a)
		}
	}
}

func (p *gpuplane) anomaly(format string, args ...any) {
	p.anomalies = append(p.anomalies, fmt.Sprintf("%.3fs: ", p.s.now)+fmt.Sprintf(format, args...))
	p.s.met.ctrlViolations++
}

func (p *gpuplane) start() {
	for _, e := range p.s.engines {
		m := e.m
		d := residency.Deployment{
			Model: residency.ModelID(m.Name), Residency: m.residency, Priority: residency.Priority(m.class),
			Share: bytesOf(m.MemoryGiB), Footprint: bytesOf(m.MemoryGiB), Peak: bytesOf(m.PeakGiB), Residual: bytesOf(m.ResidualGiB),
			CanSleep: *m.CanSleep, LoadTime: secs(m.LoadSeconds), WakeTime: secs(m.WakeSeconds), Engine: engines.Sim,
		}
		if p.s.agentPriors {
			// What the agent's residency manager tells the controller
			// (node/cardmanager): the share, no priors; the profiler learns
			// the rest from the first load, wake and memory samples. A
			// share covers the engine's load peak, as an operator sizes it.
			d.Footprint, d.Peak, d.Residual, d.LoadTime, d.WakeTime = 0, 0, 0, 0, 0
			d.Share = bytesOf(max(m.MemoryGiB, m.PeakGiB))
		}
		p.send(residency.DeploymentAdded{Deployment: d})
	}
	p.flush()
}

func (p *gpuplane) engine(m residency.ModelID) *engine {
	i := p.s.cfg.model(string(m))
	if i < 0 {
		return nil
	}
	return p.s.engines[i]
}

func (p *gpuplane) exec(a residency.Action) {
	if a.Kind == residency.ActBestEffort {
		return // a recorded decision (the controller does not return it)
	}
	e := p.engine(a.Model)
	if e == nil {
		p.anomaly("%s for unknown model %s", a.Kind, a.Model)
		return
	}
	s := p.s
	switch a.Kind {
	case residency.ActLoad, residency.ActPrewarm:
		if e.state != off {
			p.anomaly("%s of %s in state %s", a.Kind, a.Model, e.state)
			return
		}
		s.load(e)
		p.op[e.idx] = residency.ActLoad
		p.cold(e, e.m.LoadSeconds)
	case residency.ActWake:
		if e.state != asleep {
			p.anomaly("wake of %s in state %s", a.Model, e.state)
			return
		}
		s.wake(e)
		p.op[e.idx] = residency.ActWake
		p.cold(e, e.m.WakeSeconds)
	case residency.ActDrain:
		e.draining = true
		p.cold(e, 0)
	case residency.ActSleep:
		p.cold(e, 0)
		if e.state != up {
			p.anomaly("sleep of %s in state %s", a.Model, e.state)
			return
		}
		if a.Decision.Trigger != residency.TriggerIdle {
			s.met.evictions++
		}
		p.cutOff(s.sleep(e))
	case residency.ActEvict, residency.ActUnload:
		p.cold(e, 0)
		if a.Kind == residency.ActEvict {
			s.met.evictions++
		}
		switch e.state {
		case off:
			p.send(residency.Unloaded{Model: a.Model})
		case stopping:
		default:
			p.cutOff(s.stop(e))
		}
	case residency.ActReject:
		var ids []queue.ID
		for id, r := range p.reqs {
			if r.a.Model == e.idx && r.eng == nil {
				ids = append(ids, id)
			}
		}
		slices.Sort(ids)
		for _, id := range ids {
			r := p.reqs[id]
			if _, err := p.q.Cancel(id, p.at()); err != nil {
				p.anomaly("cancel %d: %v", id, err)
				continue
			}
			delete(p.reqs, id)
			s.endRequest(r, outcomeRejected, 503)
			p.send(residency.RequestFinished{Model: a.Model})
		}
	case residency.ActSerialize, residency.ActProtect:
		// Recorded decisions; no engine operation.
	}
}

// cold tells the scheduler the engine does not take requests; readyIn is
// the expected rest of its load or wake (0: unknown).
func (p *gpuplane) cold(e *engine, readyIn float64) {
	var by time.Time
	if readyIn > 0 {
		by = p.at().Add(secs(readyIn))
	}
	if err := p.q.SetCold(e.m.Name, by, p.at()); err != nil {
		p.anomaly("%v", err)
	}
}

// cutOff ends the requests a sleep or stop cut off the engine, but for
// background requests not streamed, which the scheduler re-queues as the
// gateway does (they run again when the model is back).
func (p *gpuplane) cutOff(rs []*request) {
	for _, r := range rs {
		p.progress(r)
		if again, out, err := p.q.Requeue(r.qid, p.at()); err != nil {
			p.anomaly("requeue %d: %v", r.qid, err)
		} else if again {
			p.s.take(r)
			p.s.setWaiting(r, true)
			p.handle(out)
			continue
		}
		if _, err := p.q.Cancel(r.qid, p.at()); err != nil {
			p.anomaly("cancel %d: %v", r.qid, err)
		}
		delete(p.reqs, r.qid)
		p.s.endRequest(r, outcomeFailed, 0)
		p.send(residency.RequestFinished{Model: residency.ModelID(p.s.cfg.Models[r.a.Model].Name)})
	}
}

// progress reports r's generated tokens to the scheduler.
func (p *gpuplane) progress(r *request) {
	if g := r.generated(&p.s.cfg.Models[r.a.Model]); g > 0 {
		if err := p.q.Progress(r.qid, g); err != nil {
			p.anomaly("progress %d: %v", r.qid, err)
		}
	}
}

func (p *gpuplane) arrive(r *request) {
	m := &p.s.cfg.Models[r.a.Model]
	model := residency.ModelID(m.Name)
	p.send(residency.RequestArrived{Model: model})
	p.flush()
	// A background batch beside a model's own traffic (Config.Beside)
	// streams, as the live bench's does: preempted, it ends.
	id, out, err := p.q.Enqueue(queue.Request{Deployment: m.Name, Tenant: r.a.Tenant, Class: r.class,
		PromptTokens: r.a.PromptTokens, MaxTokens: r.a.OutputTokens, Streamed: r.a.aside}, p.at())
	if err != nil {
		p.s.endRequest(r, outcomeRejected, 400)
		p.send(residency.RequestFinished{Model: model})
		p.flush()
		return
	}
	r.qid = id
	p.reqs[id] = r
	p.handle(out)
	p.flush()
}

// handle carries out a scheduler output: preempt, dispatch, end.
func (p *gpuplane) handle(out queue.Output) {
	pre := slices.Clone(out.Preempted)
	disp := slices.Clone(out.Dispatched)
	ended := slices.Clone(out.Ended)
	for _, pr := range pre {
		r := p.reqs[pr.ID]
		if r == nil {
			continue
		}
		p.s.take(r)
		if pr.Requeued {
			p.s.setWaiting(r, true)
		}
	}
	for _, id := range disp {
		r := p.reqs[id]
		e := p.s.engines[r.a.Model]
		if e.state != up || e.draining {
			p.anomaly("dispatch of %d to %s in state %s (draining %v)", id, e.m.Name, e.state, e.draining)
			continue
		}
		p.s.submit(e, r)
	}
	for _, en := range ended {
		r := p.reqs[en.ID]
		if r == nil {
			continue
		}
		model := residency.ModelID(p.s.cfg.Models[r.a.Model].Name)
		switch en.Outcome {
		case queue.Rejected:
			delete(p.reqs, en.ID)
			p.s.endRequest(r, outcomeRejected, en.Status)
			p.send(residency.RequestFinished{Model: model})
		case queue.Expired, queue.Preempted:
			delete(p.reqs, en.ID)
			p.s.endRequest(r, outcomeFailed, 0)
			p.send(residency.RequestFinished{Model: model})
		}
	}
}

func (p *gpuplane) finished(r *request) {
	out, err := p.q.Finish(r.qid, r.a.OutputTokens, p.at())
	if err != nil {
		p.anomaly("finish %d: %v", r.qid, err)
	}
	delete(p.reqs, r.qid)
	p.handle(out)
	p.send(residency.RequestFinished{Model: residency.ModelID(p.s.cfg.Models[r.a.Model].Name),
		Tokens: int64(r.a.OutputTokens), Elapsed: secs(p.s.now - r.started), Answered: true})
	p.flush()
}

func (p *gpuplane) copied(e *engine) {
	model := residency.ModelID(e.m.Name)
	if p.op[e.idx] == residency.ActWake {
		p.send(residency.WakeDone{Model: model})
	} else {
		p.send(residency.LoadDone{Model: model})
	}
	p.send(residency.MemorySample{Model: model, Bytes: e.mem})
	p.flush()
	if e.state == up && !e.draining {
		out, err := p.q.SetReady(e.m.Name, p.at())
		if err != nil {
			p.anomaly("%v", err)
		}
		p.handle(out)
		p.flush()
	}
}

func (p *gpuplane) settled(e *engine) {
	model := residency.ModelID(e.m.Name)
	if e.state == asleep {
		// The sleep reports what the engine keeps, as the agent's card
		// manager reads it from NVML when the engine says it slept.
		p.send(residency.SleepDone{Model: model, Residual: e.mem, Measured: true})
	} else {
		p.send(residency.Unloaded{Model: model})
	}
	p.flush()
}

func (p *gpuplane) tick() {
	// The gateway reports tokens as they stream back, so the tenants'
	// counters follow the work in flight.
	for _, e := range p.s.engines {
		for _, r := range e.running {
			p.progress(r)
		}
	}
	if p.s.agentPriors {
		// The agent samples its engines' memory every second (NVML per
		// process): a load or wake in progress shows its peak.
		for _, e := range p.s.engines {
			if e.state == loading || e.state == waking {
				p.send(residency.MemorySample{Model: residency.ModelID(e.m.Name), Bytes: e.mem})
			}
		}
	}
	p.send(residency.Tick{})
	p.flush()
	if next, ok := p.q.NextDeadline(); ok && !next.After(p.at()) {
		// Before the cold waits are judged, the gateway hears when the
		// controller promises each waiting model the card, as the node's
		// gateway does (its background requests wait for that, and those
		// of every class of a best-effort or yielding model).
		for _, e := range p.s.engines {
			// A best-effort model's requests wait for its turn, as the
			// node's gateway has them do.
			if err := p.q.SetBestEffort(e.m.Name, !p.c.Protected(residency.ModelID(e.m.Name))); err != nil {
				p.anomaly("%v", err)
			}
			// A warm owner that yields the card to another model's turn
			// has the card promised back: its requests of every class
			// wait for it.
			if err := p.q.SetYielding(e.m.Name, p.c.Yielding(residency.ModelID(e.m.Name))); err != nil {
				p.anomaly("%v", err)
			}
			if e.state == up && !e.draining {
				continue
			}
			if by, ok := p.c.CardBy(residency.ModelID(e.m.Name)); ok {
				if err := p.q.SetCardBy(e.m.Name, by, p.at()); err != nil {
					p.anomaly("%v", err)
				}
			}
		}
		p.handle(p.q.Tick(p.at()))
		p.flush()
	}
}
