package cardmanager

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuplane/gpuplane/internal/cardfit"
	"github.com/gpuplane/gpuplane/internal/wireenum"
	"github.com/gpuplane/gpuplane/node/engine"
	"github.com/gpuplane/gpuplane/node/executor"
	"github.com/gpuplane/gpuplane/node/residency"
	"github.com/gpuplane/gpuplane/node/watchdog"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// Engines is what the Manager needs of the executor.
type Engines interface {
	StartEngine(model string, replica uint32, reason string) error
	StopEngine(ctx context.Context, model string, replica uint32, reason string) error
	ReportResidency(ctx context.Context, model string, replica uint32, residency pb.ReplicaResidency, reason string, residualMiB uint64) error
	ReportAdapters(ctx context.Context, model string, replica uint32, adapters []*pb.AdapterStatus) error
	Engines() []watchdog.Engine
	// HoldCard keeps engine starts off a card while an engine on it
	// does what a start beside it would break (a vLLM sleep).
	HoldCard(ctx context.Context, model string, replica, card uint32, what string, limit time.Duration) (func(), error)
}

// Options configure a Manager; zero values take the defaults.
type Options struct {
	Node  string
	Cards []*pb.Card
	// Advise records decisions and acts on nothing (--residency advise).
	Advise bool
	// NVML reads the engines' memory on each card (the simulated NVML in
	// dev); nil sends no memory samples.
	NVML nvml.Interface
	// Journal receives every decision and each card's plan; nil keeps none.
	Journal *residency.Journal
	// DataDir, when set, keeps each front's port in its replica's
	// directory (executor.ReplicaDir), so that a restarted agent serves the
	// replica at the same endpoint.
	DataDir string
	// BindHost is the address fronts listen on (default 127.0.0.1: a
	// front is for the node's own gateway, not a second door to its
	// engine); AdvertiseHost the host of their endpoints (default
	// 127.0.0.1).
	BindHost      string
	AdvertiseHost string
	// FrontKey, when set (the agent sets it with ACLs on), is the secret
	// the node's gateway sends each front in isolation.FrontKeyHeader: a
	// front answers no request without it but its health check, so that
	// nobody but the gateway, which takes the tenant from the token, can
	// name a tenant to it (and get that tenant's private adapters).
	FrontKey string
	// EngineKeys give each engine's API key (engine.Keys), sent with every
	// call to it (controls, adapters, proxied requests); nil: none.
	EngineKeys *engine.Keys
	// Wait bounds how long a request waits at a front for its model to be
	// resident (default 2m); then it gets a 503 with Retry-After.
	Wait time.Duration
	// LeaveGrace is how long a front keeps answering 503 (Retry-After,
	// Connection: close) after its replica left, before its port closes
	// (default 5s): a request sent on a kept-alive connection as the
	// replica leaves gets that answer, not a connection closed under it.
	LeaveGrace time.Duration
	// Tick is the period of the controllers' ticks and memory samples
	// (default 1s).
	Tick time.Duration
	// AdapterReport is how often the adapters' tiers are committed, at
	// most (default 5s): adapters page far more often than models.
	AdapterReport time.Duration
	// Config is every card's controller configuration; Card, Memory and
	// Mode are set per card.
	Config residency.Config
	// TimeScale, a dev and benchmark option (agent.Config's
	// ResidencyTimeScale), runs the controllers' clock and ticks TimeScale
	// times faster than the wall clock, so that a benchmark whose engines
	// load, wake and serve that much faster (`gpuplane bench interference
	// --time-scale`) also sees the controllers' windows (minimum residency,
	// idle sleep, drain deadlines, rates, learned load times) in its own
	// time. 0 or 1: the wall clock.
	TimeScale float64
	Logger    *slog.Logger
}

// Manager runs the node's residency controllers; it is an executor.Gate.
type Manager struct {
	opts  Options
	log   *slog.Logger
	clock residency.Clock
	cards map[uint32]*pb.Card

	ex Engines
	// ctx is Run's.
	ctx context.Context

	mu     sync.Mutex
	fronts map[rkey]*front
	// adapterSpecs are the adapters of each replica that has any, for the
	// fronts (adapters.go).
	adapterSpecs map[rkey]*adapterSpec
	// applied are the replicas whose placement (spec and adapters) the
	// loop has applied; appliedCh is closed (and replaced) when it
	// changes. A front may serve before its replica's placement is
	// applied (Hold and Placed come in either order): its requests wait
	// for it, or an adapter would read as unknown.
	applied   map[rkey]bool
	appliedCh chan struct{}
	queue     []func()
	wake      chan struct{}

	// Owned by the loop.
	ctrls   map[uint32]*cardCtrl
	reps    map[rkey]*rep
	engines map[rkey]engineSeen
	// departed are the replicas that left a controlled card while the
	// executor may still be stopping their engines.
	departed map[rkey]bool
	// early counts the requests waiting for a replica that the loop has
	// not placed yet (a gateway's demand can come between the executor's
	// Hold, which serves the front, and Placed): its controller hears of
	// them when it is placed.
	early   map[rkey]int
	reports chan report
}

// rkey names a replica on this node.
type rkey struct {
	model string
	index uint32
}

func (k rkey) id() residency.ModelID {
	return residency.ModelID(k.model + "/" + strconv.FormatUint(uint64(k.index), 10))
}

// engineSeen is a replica engine's last reported state and address.
type engineSeen struct {
	state pb.ReplicaState
	url   string
}

// cardCtrl is one card's controller.
type cardCtrl struct {
	index uint32
	uuid  string
	ctrl  *residency.Controller
	// seen is how many decisions the journal has of ctrl.
	seen int
	// work executes the card's engine operations one after the other, in
	// the order the controller gave them: a load it issued after a sleep
	// must not start before the sleep has freed the memory.
	work     *serial
	stopWork context.CancelFunc
	// holds are the actions waiting for a vLLM start on the card
	// (awaitSettled), by model, with the reason the plan shows.
	holds map[residency.ModelID]string
}

// rep is a replica in a controller.
type rep struct {
	k    rkey
	card uint32
	dep  residency.Deployment
	kind string
	// model is the name its engine's controls know the model by
	// (engine.Params.ControlModel: Ollama's tag).
	model string
	// sleptAt is the level of its engine's last sleep: a wake undoes that
	// one, whatever the deployment says now.
	sleptAt int
	// reported is the last residency state the manager reported, with
	// its reason and, asleep, the residual (MiB).
	reported       residency.State
	reportedWhy    string
	reportedResMiB uint64
	// stopping is set while an engine stop the Manager asked for runs.
	stopping bool
	// profiling is set from a start the Manager asked for until the
	// executor reports the engine Running or gone (awaitSettled).
	profiling bool
	// advisedLoad is set in advise mode once the controller would have
	// loaded the model (advise.go).
	advisedLoad bool
	// adapters are its deployment's adapters (nil: none); tiersSent the
	// tiers last committed, tiersReported whether that report went through.
	adapters      *adapterSpec
	tiersSent     string
	tiersReported bool
	// rejected is when the last reject decision was recorded for it, with
	// its reason (explain.go).
	rejected     time.Time
	rejectReason string
}

type report struct {
	k      rkey
	res    pb.ReplicaResidency
	reason string
	// residual is what a sleeping engine keeps on the card, MiB.
	residual uint64
}

// New returns a Manager; Run starts it.
func New(opts Options) *Manager {
	if opts.BindHost == "" {
		opts.BindHost = "127.0.0.1"
	}
	if opts.AdvertiseHost == "" {
		opts.AdvertiseHost = "127.0.0.1"
	}
	if opts.Wait <= 0 {
		opts.Wait = 2 * time.Minute
	}
	if opts.LeaveGrace <= 0 {
		opts.LeaveGrace = 5 * time.Second
	}
	if opts.Tick <= 0 {
		opts.Tick = time.Second
	}
	if opts.TimeScale > 1 {
		opts.Tick = time.Duration(float64(opts.Tick) / opts.TimeScale)
	}
	if opts.AdapterReport <= 0 {
		opts.AdapterReport = 5 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if opts.Config.Profiler == nil {
		// One per node: a variant's profile serves its replicas on every
		// card and outlives a card's controller.
		opts.Config.Profiler = residency.NewProfiler()
	}
	m := &Manager{opts: opts, log: opts.Logger, cards: map[uint32]*pb.Card{}, clock: newClock(opts.TimeScale),
		fronts: map[rkey]*front{}, adapterSpecs: map[rkey]*adapterSpec{}, applied: map[rkey]bool{}, appliedCh: make(chan struct{}), wake: make(chan struct{}, 1),
		ctrls: map[uint32]*cardCtrl{}, reps: map[rkey]*rep{}, engines: map[rkey]engineSeen{},
		departed: map[rkey]bool{}, early: map[rkey]int{}, reports: make(chan report, 4096)}
	for _, c := range opts.Cards {
		m.cards[c.GetIndex()] = c
	}
	return m
}

// Mode is "auto" or "advise".
func (m *Manager) Mode() string {
	if m.opts.Advise {
		return "advise"
	}
	return "auto"
}

// whyRunning is the transition an engine reaching Running causes.
const whyRunning = "engine running"

// wallClock is the agent's residency.Clock.
type wallClock struct{}

func (wallClock) Now() time.Time { return time.Now() }

// scaledClock runs scale times faster than the wall clock from origin
// (Options.TimeScale).
type scaledClock struct {
	origin time.Time
	scale  float64
}

func (c scaledClock) Now() time.Time {
	return c.origin.Add(time.Duration(float64(time.Since(c.origin)) * c.scale))
}

func newClock(scale float64) residency.Clock {
	if scale > 1 {
		return scaledClock{origin: time.Now(), scale: scale}
	}
	return wallClock{}
}

// controlled reports whether d's replica belongs in a card's controller:
// warm and onDemand replicas on one card; pinned ones join the controller
// of a card that has such a replica (controlled with its card's index).
func controlled(d executor.Desired) (uint32, bool) {
	cards := d.Replica.GetCards()
	if len(cards) != 1 {
		return 0, false
	}
	return cards[0], true
}

func onDemandOrWarm(spec *pb.ModelSpec) bool {
	r := spec.GetResidency()
	return r == pb.Residency_RESIDENCY_WARM || r == pb.Residency_RESIDENCY_ON_DEMAND
}

// fronted reports whether d's replica is served at a front: a warm or
// onDemand replica on one card, whose engine the Manager holds unless it
// only advises, or one with adapters (any residency), whose requests for
// adapters the front resolves and pages in.
func fronted(d executor.Desired) bool {
	_, one := controlled(d)
	return one && (onDemandOrWarm(d.Spec) || len(d.Spec.GetAdapters()) > 0)
}

// Hold is executor.Gate's: a warm or onDemand replica is served at its
// front, and its engine held unless the Manager only advises (then the
// front passes requests straight on, so that the controller sees them).
func (m *Manager) Hold(d executor.Desired) (string, bool) {
	if !fronted(d) {
		return "", false
	}
	k := rkey{d.Replica.GetModel(), d.Replica.GetIndex()}
	f, err := m.front(k)
	if err != nil {
		// Without a front the replica could not be reached while cold:
		// it runs as a pinned one would.
		m.log.Warn("residency: serve a front; the replica is loaded when placed", "replica", k.id(), "err", err)
		return "", false
	}
	return f.url, !m.opts.Advise && onDemandOrWarm(d.Spec)
}

// Placed is executor.Gate's. The fronts of the replicas ds no longer
// fronts close now, in the order of the executor's calls, not on the loop:
// Hold opens a front as the executor's supervisors call it, and a busy
// loop that applied an older placement after a newer one's Hold would
// close the front of a replica still placed here, whose endpoint (and the
// gateway's dispatch) would then be a closed port for as long as it stays.
func (m *Manager) Placed(ds []executor.Desired) {
	ds = slices.Clone(ds)
	m.closeFrontsGone(ds)
	m.post(func() { m.placed(ds) })
}

// closeFrontsGone closes the fronts of the replicas that ds does not place
// here, or does not front.
func (m *Manager) closeFrontsGone(ds []executor.Desired) {
	want := map[rkey]executor.Desired{}
	for _, d := range ds {
		want[rkey{d.Replica.GetModel(), d.Replica.GetIndex()}] = d
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, f := range m.fronts {
		if d, ok := want[k]; !ok || !fronted(d) {
			f.close(m.opts.LeaveGrace)
			delete(m.fronts, k)
		}
	}
}

// Engine is executor.Gate's.
func (m *Manager) Engine(model string, replica uint32, state pb.ReplicaState, engineURL string) {
	m.post(func() { m.engine(rkey{model, replica}, state, engineURL) })
}

// post queues f for the loop; it never blocks.
func (m *Manager) post(f func()) {
	m.mu.Lock()
	m.queue = append(m.queue, f)
	m.mu.Unlock()
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// Run drives the controllers until ctx ends; ex runs the engines.
func (m *Manager) Run(ctx context.Context, ex Engines) {
	m.ex, m.ctx = ex, ctx
	go m.reporter(ctx)
	if j := m.opts.Journal; j != nil && !m.opts.Advise {
		j.SetOperator(m.Operate)
		defer j.SetOperator(nil)
		j.SetProtector(m.Protect)
		defer j.SetProtector(nil)
	}
	tick := time.NewTicker(m.opts.Tick)
	defer tick.Stop()
	adapterTick := time.NewTicker(m.opts.AdapterReport)
	defer adapterTick.Stop()
	defer m.closeFronts()
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.wake:
			m.mu.Lock()
			q := m.queue
			m.queue = nil
			m.mu.Unlock()
			for _, f := range q {
				f()
			}
		case <-adapterTick.C:
			m.reportAdapters()
		case <-tick.C:
			m.sample()
			for _, c := range m.sortedCards() {
				m.handle(c, residency.Tick{}, "")
				m.publishCard(c)
			}
		}
	}
}

func (m *Manager) sortedCards() []*cardCtrl {
	out := make([]*cardCtrl, 0, len(m.ctrls))
	for _, c := range m.ctrls {
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b *cardCtrl) int { return cmp.Compare(a.index, b.index) })
	return out
}

// deployment maps a placed replica onto the controller's Deployment.
func (m *Manager) deployment(k rkey, d executor.Desired) residency.Deployment {
	spec := d.Spec
	dep := residency.Deployment{
		Model: k.id(), Share: int64(d.Replica.GetMemoryMib()) << 20,
		// The variant: replicas of the same weights and quantization (of
		// one deployment or several) learn one profile.
		Weights:      spec.GetModel(),
		Quantization: spec.GetEngine().GetQuantization(), Engine: spec.GetEngine().GetKind(),
	}
	dep.Residency, dep.Priority = wireenum.Residency(spec.GetResidency()), wireenum.Class(spec.GetPriority())
	dep.IdleSleep = time.Duration(spec.GetIdle().GetSleepAfterSeconds()) * time.Second
	dep.IdleUnload = time.Duration(spec.GetIdle().GetUnloadAfterSeconds()) * time.Second
	dep.Failover = cardfit.PlacedByFailover(d.Replica.GetReason())
	if c := m.cards[d.Replica.GetCards()[0]]; c != nil {
		dep.Device = c.GetDevice()
	}
	// The engine's own sleep, where it keeps its process: vLLM's level
	// (spec.engine.sleepLevel), Ollama's keep_alive unload.
	level := engine.SleepLevel(spec)
	dep.CanSleep, dep.SleepDiscards = level > 0, level == engine.SleepDiscard
	return dep
}

// placed reconciles the controllers with the replicas placed on the node.
func (m *Manager) placed(ds []executor.Desired) {
	// Cards with a single-card replica get a controller, one holding only
	// pinned replicas too: its ledger, plan and metrics account for the
	// card (a pinned engine runs as the executor keeps it); every
	// single-card replica on them joins it.
	want := map[rkey]executor.Desired{}
	cardsWanted := map[uint32]bool{}
	for _, d := range ds {
		if c, ok := controlled(d); ok {
			cardsWanted[c] = true
		}
	}
	for _, d := range ds {
		if c, ok := controlled(d); ok && cardsWanted[c] {
			want[rkey{d.Replica.GetModel(), d.Replica.GetIndex()}] = d
		}
	}
	for _, k := range sortedKeys(m.reps) {
		r := m.reps[k]
		d, ok := want[k]
		if ok && d.Replica.GetCards()[0] == r.card {
			continue
		}
		// It leaves its card's ledger now, whatever its state: the
		// executor stops its engine (it was moved, replaced or deleted),
		// not this card's controller, so no unload of the controller's
		// would ever end. Off m.reps first, so that the controller's
		// answer to the removal (an unload or a drain) acts on no engine:
		// one of the same name may already run on another card. Loads on
		// this card wait until the old engine's memory is really free
		// (departed, awaitCounted).
		delete(m.reps, k)
		m.departed[k] = true
		m.handle(m.ctrls[r.card], residency.DeploymentRemoved{Model: k.id()}, "")
		m.handle(m.ctrls[r.card], residency.Unloaded{Model: k.id()}, "left the card: its engine is stopped by the node")
		m.mu.Lock()
		delete(m.adapterSpecs, k)
		m.mu.Unlock()
		// Its engine stops with its supervisor; a replica placed here
		// again starts from nothing.
		delete(m.engines, k)
	}
	// The fronts of the replicas gone were closed as the executor called
	// Placed (closeFrontsGone).
	for c := range cardsWanted {
		if m.ctrls[c] != nil {
			continue
		}
		card := m.cards[c]
		if card == nil {
			continue
		}
		cfg := m.opts.Config
		cfg.Card, cfg.Memory = strconv.FormatUint(uint64(c), 10), int64(card.GetMemoryMib())<<20
		if m.opts.Advise {
			cfg.Mode = residency.Advise
		}
		ctrl, err := residency.New(cfg, m.clock)
		if err != nil {
			m.log.Warn("residency: controller", "card", c, "err", err)
			continue
		}
		wctx, stop := context.WithCancel(m.ctx)
		cc := &cardCtrl{index: c, uuid: card.GetUuid(), ctrl: ctrl, work: newSerial(), stopWork: stop, holds: map[residency.ModelID]string{}}
		go cc.work.run(wctx)
		m.ctrls[c] = cc
	}
	for _, k := range sortedKeys(want) {
		d := want[k]
		c := m.ctrls[d.Replica.GetCards()[0]]
		if c == nil {
			continue
		}
		dep := m.deployment(k, d)
		if r, ok := m.reps[k]; ok {
			r.model = engine.Params{Model: k.model, Spec: d.Spec}.ControlModel()
			if r.dep != dep {
				r.dep = dep
				m.handle(c, residency.DeploymentChanged{Deployment: dep}, "")
			}
			m.syncAdapters(c, r, d.Spec)
			continue
		}
		// The controls and adapters are those of the API the engine
		// speaks (a sim's dialect).
		m.reps[k] = &rep{k: k, card: c.index, dep: dep, kind: engine.ControlKind(d.Spec.GetEngine()),
			model: engine.Params{Model: k.model, Spec: d.Spec}.ControlModel()}
		delete(m.departed, k)
		m.handle(c, residency.DeploymentAdded{Deployment: dep}, "")
		for range m.early[k] {
			m.handle(c, residency.RequestArrived{Model: k.id()}, "")
		}
		delete(m.early, k)
		m.syncAdapters(c, m.reps[k], d.Spec)
		// An engine already running (a pinned one, or any in advise
		// mode) holds its memory: the controller starts from that.
		if e := m.engines[k]; e.state == pb.ReplicaState_REPLICA_STATE_RUNNING && m.follows(m.reps[k]) {
			m.handle(c, residency.LoadDone{Model: k.id()}, whyRunning)
		}
	}
	for c, cc := range m.ctrls {
		if !cardsWanted[c] {
			cc.stopWork()
			delete(m.ctrls, c)
			if j := m.opts.Journal; j != nil {
				j.RemoveCard(cc.ctrl.Ledger().Card)
			}
		}
	}
	for _, c := range m.sortedCards() {
		m.publishCard(c)
	}
	m.mu.Lock()
	clear(m.applied)
	for _, d := range ds {
		if fronted(d) {
			m.applied[rkey{d.Replica.GetModel(), d.Replica.GetIndex()}] = true
		}
	}
	close(m.appliedCh)
	m.appliedCh = make(chan struct{})
	m.mu.Unlock()
}

func sortedKeys[V any](mp map[rkey]V) []rkey {
	out := make([]rkey, 0, len(mp))
	for k := range mp {
		out = append(out, k)
	}
	slices.SortFunc(out, func(a, b rkey) int { return cmp.Or(cmp.Compare(a.model, b.model), cmp.Compare(a.index, b.index)) })
	return out
}

// engine turns an engine's transition into the controller's event.
func (m *Manager) engine(k rkey, state pb.ReplicaState, url string) {
	prev := m.engines[k].state
	m.engines[k] = engineSeen{state: state, url: url}
	hadEngine := prev == pb.ReplicaState_REPLICA_STATE_STARTING || prev == pb.ReplicaState_REPLICA_STATE_RUNNING
	r := m.reps[k]
	if r == nil {
		return
	}
	if state != pb.ReplicaState_REPLICA_STATE_STARTING && (state != pb.ReplicaState_REPLICA_STATE_PLACED || hadEngine) {
		// Its start is over (Running, failed or stopped): a Placed
		// before any start is a replica waiting for its card.
		r.profiling = false
	}
	c := m.ctrls[r.card]
	st, _ := c.ctrl.Replica(k.id())
	switch state {
	case pb.ReplicaState_REPLICA_STATE_RUNNING:
		held := !m.opts.Advise && r.dep.Residency != residency.Pinned
		if held && !r.stopping && (st.State == residency.Cold || st.State == residency.Failed) {
			// An engine its controller did not load: one a restarted
			// agent adopted, or a load the controller gave up on. It
			// holds memory the ledger does not count: stop it. Not on
			// the card's worker: the loads waiting there for this
			// memory (awaitCounted) must not hold up its stop.
			r.stopping = true
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
				defer cancel()
				_ = m.ex.StopEngine(ctx, k.model, k.index, "not loaded by its node's residency controller (an earlier agent started it): stopped; it loads again on demand")
				m.post(func() {
					if r := m.reps[k]; r != nil {
						r.stopping = false
					}
				})
			}()
			break
		}
		if m.follows(r) && !r.stopping && (st.State == residency.Loading || st.State == residency.Cold || st.State == residency.Failed) {
			m.handle(c, residency.LoadDone{Model: k.id()}, whyRunning)
		}
	case pb.ReplicaState_REPLICA_STATE_FAILED, pb.ReplicaState_REPLICA_STATE_PLACED, pb.ReplicaState_REPLICA_STATE_STOPPED:
		// Placed or Stopped without a stop of ours, after an engine
		// started: the executor replaced or stopped it (its spec
		// changed). Placed otherwise is a replica waiting (for demand,
		// or for its card while another engine starts).
		if state != pb.ReplicaState_REPLICA_STATE_FAILED && (r.stopping || !hadEngine) {
			break
		}
		if !m.follows(r) {
			break
		}
		if st.State == residency.Loading {
			m.handle(c, residency.LoadFailed{Model: k.id(), Err: "engine failed"}, "engine failed to load")
		} else if st.State != residency.Cold && st.State != residency.Failed {
			m.handle(c, residency.EngineCrashed{Model: k.id()}, "engine crashed")
		}
	}
	m.publishFronts(c)
}

// handle gives ev to c's controller, executes the actions, reports the
// residency transitions and records the decisions. why is the reason given
// for a transition no decision explains.
func (m *Manager) handle(c *cardCtrl, ev residency.Event, why string) residency.Output {
	if c == nil {
		return residency.Output{}
	}
	out := c.ctrl.Handle(ev)
	switch e := ev.(type) {
	case residency.WakeDone:
		m.reconcileAdapters(e.Model)
	case residency.LoadDone:
		m.reconcileAdapters(e.Model)
	}
	if out.Err != nil {
		m.log.Warn("residency: event refused", "card", c.index, "event", fmt.Sprintf("%T", ev), "err", out.Err)
	}
	for _, v := range out.Violations {
		m.log.Error("residency: ledger invariant violated; card is pinned-only until cleared", "card", c.index, "violation", fmt.Sprintf("%+v", v))
	}
	if j := m.opts.Journal; j != nil {
		prev := c.seen
		c.seen = j.Sync(c.ctrl, c.seen)
		ds := c.ctrl.Decisions()
		for _, d := range ds[max(0, len(ds)-(c.seen-prev)):] {
			m.log.Info("residency decision", "card", d.Card, "action", d.Action, "model", d.Model,
				"trigger", d.Trigger, "advised", d.Advised, "reason", d.Reason)
			if d.Advised {
				m.advised(c, d)
			}
		}
	}
	reasons := map[residency.ModelID]string{}
	for _, a := range out.Actions {
		if a.Adapter == "" {
			reasons[a.Model] = a.Decision.Reason
		}
		m.act(c, a)
	}
	for _, k := range sortedKeys(m.reps) {
		r := m.reps[k]
		if r.card != c.index || r.dep.Residency == residency.Pinned {
			continue
		}
		st, ok := c.ctrl.Replica(k.id())
		if !ok {
			continue
		}
		residual := uint64(0)
		if st.State == residency.Sleeping {
			residual = uint64(max(st.Cost, 0)+(1<<20)-1) >> 20
		}
		if st.State == r.reported {
			// A sleeping engine's residual is often measured only after
			// the transition (the first memory sample asleep): `devices
			// get` counts what was reported, so a change of more than
			// residualStep is reported again, with the same reason.
			if st.State != residency.Sleeping || m.opts.Advise || absDiff(residual, r.reportedResMiB) <= residualStep {
				continue
			}
			r.reportedResMiB = residual
			select {
			case m.reports <- report{k: k, res: pbResidency(st.State), reason: r.reportedWhy, residual: residual}:
			default:
			}
			continue
		}
		if j := m.opts.Journal; j != nil && !m.opts.Advise {
			j.Transitioned(r.reported, st.State)
		}
		r.reported = st.State
		if m.opts.Advise || (why == whyRunning && reasons[k.id()] == "") {
			// Advised decisions change nothing; the executor reports
			// an engine's start itself.
			continue
		}
		reason := reasons[k.id()]
		if reason == "" {
			reason = why
		}
		if reason == "" {
			reason = st.State.String()
		}
		r.reportedWhy, r.reportedResMiB = reason, residual
		select {
		case m.reports <- report{k: k, res: pbResidency(st.State), reason: reason, residual: residual}:
		default:
			m.log.Warn("residency: report queue full; transition not reported", "replica", k.id())
		}
	}
	m.publishFronts(c)
	return out
}

// residualStep is the least change of a sleeping engine's measured
// residual (MiB) that is reported again: samples jitter, and each report
// is a log entry.
const residualStep = 16

func absDiff(a, b uint64) uint64 {
	if a > b {
		return a - b
	}
	return b - a
}

func pbResidency(s residency.State) pb.ReplicaResidency {
	switch s {
	case residency.Loading:
		return pb.ReplicaResidency_REPLICA_RESIDENCY_LOADING
	case residency.Resident:
		return pb.ReplicaResidency_REPLICA_RESIDENCY_RESIDENT
	case residency.Draining:
		return pb.ReplicaResidency_REPLICA_RESIDENCY_DRAINING
	case residency.Sleeping:
		return pb.ReplicaResidency_REPLICA_RESIDENCY_SLEEPING
	case residency.Waking:
		return pb.ReplicaResidency_REPLICA_RESIDENCY_WAKING
	}
	return pb.ReplicaResidency_REPLICA_RESIDENCY_COLD
}

// reporter commits residency transitions in order, off the loop.
func (m *Manager) reporter(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case r := <-m.reports:
			rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			if err := m.ex.ReportResidency(rctx, r.k.model, r.k.index, r.res, r.reason, r.residual); err != nil && !errors.Is(err, executor.ErrNotRunning) {
				m.log.Info("residency: report transition", "replica", r.k.id(), "err", err)
			}
			cancel()
		}
	}
}

// act executes one action; what takes time runs off the loop and reports
// back as an event.
func (m *Manager) act(c *cardCtrl, a residency.Action) {
	var k rkey
	var r *rep
	for key, rr := range m.reps {
		if key.id() == a.Model {
			k, r = key, rr
		}
	}
	if r != nil && a.Adapter != "" {
		m.actAdapter(c, k, r, a)
		return
	}
	if r == nil || r.dep.Residency == residency.Pinned {
		// A pinned engine runs as the executor keeps it; a replica gone
		// from the node is stopped by the executor.
		return
	}
	reason := a.Decision.Reason
	switch a.Kind {
	case residency.ActLoad, residency.ActPrewarm:
		// An engine being stopped (one a restarted agent adopted, or one
		// whose control failed) is not loaded: the start waits for the
		// stop (awaitCounted).
		if e := m.engines[k]; e.state == pb.ReplicaState_REPLICA_STATE_RUNNING && !r.stopping {
			m.post(func() { m.handle(m.ctrls[c.index], residency.LoadDone{Model: a.Model}, whyRunning) })
			return
		}
		c.work.do(func() {
			err := m.awaitCounted(c, k)
			if err == nil {
				err = m.awaitSettled(c, k, a)
			}
			if err == nil {
				err = m.ex.StartEngine(k.model, k.index, reason)
			}
			if err == nil && r.kind == engine.KindVLLM {
				// Queued before the next operation's awaitSettled asks.
				m.post(func() {
					if r := m.reps[k]; r != nil && m.engines[k].state != pb.ReplicaState_REPLICA_STATE_RUNNING {
						r.profiling = true
					}
				})
			}
			if err != nil {
				m.post(func() {
					m.handle(m.ctrls[c.index], residency.LoadFailed{Model: a.Model, Err: err.Error()}, "load failed: "+err.Error())
				})
			}
		})
	case residency.ActSleep, residency.ActWake:
		level := engine.SleepOffload
		if r.dep.SleepDiscards {
			level = engine.SleepDiscard
		}
		if a.Kind == residency.ActSleep {
			r.sleptAt = level
		} else if r.sleptAt != 0 {
			level = r.sleptAt
		}
		ctl, err := engine.ControlsFor(r.kind, engine.Target{BaseURL: m.engines[k].url, Model: r.model, SleepLevel: level, APIKey: m.opts.EngineKeys.For(k.model, k.index)})
		c.work.do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			if err == nil && a.Kind == residency.ActWake {
				err = m.awaitCounted(c, k)
			}
			if err == nil {
				err = m.awaitSettled(c, k, a)
			}
			if err == nil {
				if a.Kind == residency.ActSleep {
					err = m.sleepHolding(ctx, c, k, r, ctl, level)
				} else {
					err = ctl.Wake(ctx)
				}
			}
			switch {
			case err == nil && a.Kind == residency.ActSleep:
				m.post(func() {
					// What the engine kept asleep, read now: the controller
					// counts it in the same step (neither its footprint nor
					// nothing until the next sample).
					held, ok := m.engineBytes(c, k)
					m.handle(m.ctrls[c.index], residency.SleepDone{Model: a.Model, Residual: held, Measured: ok}, "asleep")
				})
			case err == nil:
				m.post(func() { m.handle(m.ctrls[c.index], residency.WakeDone{Model: a.Model}, "awake") })
			default:
				// An engine that cannot sleep or wake is stopped: its
				// memory is free whatever state it was in.
				m.log.Warn("residency: engine control failed; stopping the engine", "replica", a.Model, "action", a.Kind, "err", err)
				m.post(func() {
					if r := m.reps[k]; r != nil {
						r.stopping = true
					}
				})
				_ = m.ex.StopEngine(ctx, k.model, k.index, fmt.Sprintf("%s failed: %v", a.Kind, err))
				m.post(func() { m.unloaded(k, "stopped after a failed "+a.Kind.String()) })
			}
		})
	case residency.ActEvict, residency.ActUnload:
		r.stopping = true
		c.work.do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			if err := m.awaitSettled(c, k, a); err != nil {
				return
			}
			if err := m.ex.StopEngine(ctx, k.model, k.index, reason); err != nil {
				m.log.Warn("residency: stop engine", "replica", a.Model, "err", err)
			}
			m.post(func() { m.unloaded(k, "unloaded") })
		})
	case residency.ActReject:
		m.mu.Lock()
		f := m.fronts[k]
		m.mu.Unlock()
		if f != nil {
			f.reject(reason)
		}
	}
	// ActDrain needs nothing more: a front dispatches only to a Resident
	// model. ActSerialize is a recorded decision.
}

// publishFronts tells c's fronts which models they may dispatch to.
func (m *Manager) publishFronts(c *cardCtrl) {
	if c == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, f := range m.fronts {
		r := m.reps[k]
		if r == nil || r.card != c.index {
			continue
		}
		st, _ := c.ctrl.Replica(k.id())
		e := m.engines[k]
		running := e.state == pb.ReplicaState_REPLICA_STATE_RUNNING && e.url != ""
		ready := running && (st.State == residency.Resident || m.opts.Advise)
		f.set(ready, e.url)
		if r.adapters != nil {
			f.setAdapters(c.ctrl.AdaptersServed(k.id()))
		}
	}
}

// publishCard refreshes the journal's view of c.
func (m *Manager) publishCard(c *cardCtrl) {
	j := m.opts.Journal
	if j == nil {
		return
	}
	l := c.ctrl.Ledger()
	plan := c.ctrl.Plan()
	for i := range plan {
		// An action waiting for a vLLM start on the card says so.
		if why, ok := c.holds[plan[i].Model]; ok {
			plan[i].Reason = why
		}
	}
	j.SetCard(residency.CardView{Card: l.Card, Mode: m.Mode(), PinnedOnly: c.ctrl.PinnedOnly(),
		Violations: c.ctrl.ViolationCount(), Usable: c.ctrl.Usable(), Plan: plan, Ledger: l}, c.ctrl.Profiles())
}

// sample sends each controller the memory its engines hold, as NVML
// reports it per process.
func (m *Manager) sample() {
	if m.opts.NVML == nil || m.ex == nil || len(m.ctrls) == 0 {
		return
	}
	byPID := map[uint32]rkey{}
	for _, e := range m.ex.Engines() {
		byPID[uint32(e.PID)] = rkey{e.Model, e.Replica}
	}
	for _, c := range m.sortedCards() {
		dev, ret := m.opts.NVML.DeviceGetHandleByUUID(c.uuid)
		if ret != nvml.SUCCESS {
			continue
		}
		procs, ret := dev.GetComputeRunningProcesses()
		if ret != nvml.SUCCESS {
			continue
		}
		used := map[rkey]int64{}
		for _, p := range procs {
			if k, ok := byPID[p.Pid]; ok {
				used[k] += int64(p.UsedGpuMemory)
			}
		}
		for _, k := range sortedKeys(used) {
			if r := m.reps[k]; r != nil && r.card == c.index && m.follows(r) {
				m.handle(c, residency.MemorySample{Model: k.id(), Bytes: used[k]}, "")
			}
		}
	}
}

// engineBytes is what k's engine processes hold on card c as NVML
// reports it now (0 for an engine NVML lists no process for), and whether
// NVML answered.
func (m *Manager) engineBytes(c *cardCtrl, k rkey) (int64, bool) {
	if m.opts.NVML == nil || m.ex == nil {
		return 0, false
	}
	pids := map[uint32]bool{}
	for _, e := range m.ex.Engines() {
		if (rkey{e.Model, e.Replica}) == k {
			pids[uint32(e.PID)] = true
		}
	}
	if len(pids) == 0 {
		return 0, false
	}
	dev, ret := m.opts.NVML.DeviceGetHandleByUUID(c.uuid)
	if ret != nvml.SUCCESS {
		return 0, false
	}
	procs, ret := dev.GetComputeRunningProcesses()
	if ret != nvml.SUCCESS {
		return 0, false
	}
	var held int64
	for _, p := range procs {
		if pids[p.Pid] {
			held += int64(p.UsedGpuMemory)
		}
	}
	return held, true
}

// unloaded reports that a stop the Manager asked for is done.
func (m *Manager) unloaded(k rkey, why string) {
	r := m.reps[k]
	if r == nil {
		return
	}
	r.stopping, r.profiling = false, false
	m.handle(m.ctrls[r.card], residency.Unloaded{Model: k.id()}, why)
}
