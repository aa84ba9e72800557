package executor

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"
	"google.golang.org/protobuf/proto"

	"github.com/gpuplane/gpuplane/node/engine"
	"github.com/gpuplane/gpuplane/node/inventory"
	"github.com/gpuplane/gpuplane/node/procfs"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// phase is where a supervisor's engine is.
type phase int

const (
	// waiting: no process; the next start is due at nextStart.
	waiting phase = iota
	// starting: launched, not yet healthy (holding its cards' start locks
	// unless adopted).
	starting
	// running: healthy.
	running
)

// failuresBeforeRestart is how many health checks in a row a running
// engine may fail before it is restarted.
const failuresBeforeRestart = 3

// supervisor owns one replica's engine: every field below the channels is
// touched only by its run goroutine.
type supervisor struct {
	e      *Executor
	k      key
	dir    string
	ctx    context.Context
	cancel context.CancelFunc
	// removed says the replica left the node (as opposed to the executor
	// stopping): its engine stops without a report.
	removed atomic.Bool
	// prev is the done channel of a predecessor still stopping its engine.
	prev <-chan struct{}
	done chan struct{}

	// reportMu guards latest and unsent, and is held across each
	// report so that an older status never lands after a newer one: the
	// run goroutine reports the engine's transitions, a residency
	// controller residency transitions (ReportResidency), resend the
	// reports that did not get through.
	reportMu sync.Mutex
	// latest is the newest status of the replica as this node knows it.
	// unsent says it must still be reported: its report failed (or the
	// cluster's record was found to differ, reconcile), and resend tries
	// again until it is accepted, rejected, or superseded by a newer
	// status.
	latest *pb.ReplicaStatus
	unsent bool
	// resendNow wakes resend.
	resendNow chan struct{}

	mu      sync.Mutex
	desired Desired
	changed chan struct{}
	// exceeded carries the watchdog's reason.
	exceeded chan string
	// ctl carries a Gate's StartEngine and StopEngine (gate.go).
	ctl chan control

	// held says a Gate holds the replica: its engine runs only while want
	// (StartEngine until StopEngine or a failure); frontURL is the endpoint
	// the Gate serves it at.
	held     bool
	want     bool
	frontURL string

	left      leftEngine
	phase     phase
	proc      *process
	release   func()
	port      int
	cmdline   []string
	health    string
	nextStart time.Time
	startedAt time.Time
	// timeout is the start deadline of the engine, from startedAt.
	timeout time.Duration
	// probed is what the last failed probe found.
	probed string
	// progress is what a starting engine has shown of its progress
	// (progress.go).
	progress progress
	fails    int
	restarts uint32
	fp       string
	bo       *backoff.ExponentialBackOff
	client   *http.Client
	// preload is the engine's preload (engine.Command.Preload), sent
	// once per start; preloaded says it was answered.
	preload   engine.Preload
	preloaded bool
	// fatal is a preload's failure that no retry mends (ready.go): the
	// start fails at the next check.
	fatal string
	// preloading is the preload in flight, if any (ready.go).
	preloading *preloadRun
}

func newSupervisor(ctx context.Context, e *Executor, k key, d Desired, left leftEngine, prev <-chan struct{}) *supervisor {
	ctx, cancel := context.WithCancel(ctx)
	return &supervisor{
		e: e, k: k, dir: e.replicaDir(k), ctx: ctx, cancel: cancel, prev: prev,
		done: make(chan struct{}), desired: d, changed: make(chan struct{}, 1),
		exceeded: make(chan string, 1), ctl: make(chan control), left: left,
		resendNow: make(chan struct{}, 1),
		bo: &backoff.ExponentialBackOff{InitialInterval: e.opts.RestartDelay, RandomizationFactor: 0.2,
			Multiplier: 2, MaxInterval: e.opts.MaxRestartDelay},
		client: &http.Client{Timeout: 2 * time.Second},
	}
}

// update hands the supervisor the replica's latest desired state.
func (s *supervisor) update(d Desired) {
	s.mu.Lock()
	s.desired = d
	s.mu.Unlock()
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

// remove stops the supervisor because its replica left the node; called
// with e.mu held.
func (s *supervisor) remove() {
	s.removed.Store(true)
	s.cancel()
}

func (s *supervisor) current() Desired {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.desired
}

// fingerprint is what, besides the process being alive, must not change for
// an engine to keep running: the generation (every spec change) and the
// placement. It is stored in each engine's record, so its form is kept:
// share= (the placement's packing weight, which no node code sizes anything
// by) stays so that an upgraded agent adopts the engines it finds.
func fingerprint(d Desired) string {
	r := d.Replica
	return fmt.Sprintf("gen=%d placed=%d cards=%v share=%d mem=%d compute=%d",
		r.GetGeneration(), r.GetPlacedIndex(), r.GetCards(), r.GetShareMilli(), r.GetMemoryMib(), r.GetComputePercent())
}

func (s *supervisor) run() {
	defer close(s.done)
	defer s.e.retired(s.k, s.done)
	defer s.e.ports.release(s.k)
	if s.prev != nil {
		select {
		case <-s.prev:
		case <-s.ctx.Done():
			return
		}
	}
	resendCtx, stopResend := context.WithCancel(s.ctx)
	resent := make(chan struct{})
	go func() {
		defer close(resent)
		s.resend(resendCtx)
	}()
	defer func() {
		stopResend()
		<-resent
	}()
	d := s.current()
	s.fp = fingerprint(d)
	s.hold(d)
	s.phase, s.nextStart = waiting, time.Now()
	// The count goes on from what the cluster recorded, not from 0: a new
	// agent is no new start of the replica.
	s.restarts = d.Replica.GetRestarts()
	if r := s.left.rec; r != nil {
		s.restarts = max(s.restarts, r.Restarts)
		if p, ok := adoptProcess(r); s.left.alive && ok {
			s.proc, s.port, s.cmdline = p, r.Port, r.Command
			s.e.ports.hold(s.k, r.Port)
			s.want = true
			s.health = s.healthPath(d)
			s.phase, s.startedAt, s.timeout = starting, time.Now(), engine.StartTimeout(d.Spec.GetEngine())
			s.watchProgress()
			s.publish()
		} else {
			// It died while no executor watched it: the cluster may
			// still say Running, so say first that it failed.
			s.e.setEngine(s.k, nil) // Run listed it if it was alive then
			killGroupIfLeaderGone(r.PID)
			boxOf(r).remove(0)
			removeRecord(s.dir)
			s.restarts++
			s.report(pb.ReplicaState_REPLICA_STATE_FAILED, "engine exited while the node agent was down")
		}
	}
	tick := time.NewTicker(s.e.opts.HealthInterval)
	defer tick.Stop()
	if s.held && s.proc == nil {
		s.report(pb.ReplicaState_REPLICA_STATE_PLACED, "not loaded: its node loads it on demand")
	}
	for {
		if s.phase == waiting && s.held && !s.want {
			if !s.idle() {
				s.finish()
				return
			}
			continue
		}
		if s.phase == waiting {
			if !s.wait() {
				s.finish()
				return
			}
			s.start()
			// A tick that came while waiting is stale: the first check
			// of a new engine is one interval after its launch.
			tick.Reset(s.e.opts.HealthInterval)
			continue
		}
		select {
		case <-s.ctx.Done():
			s.finish()
			return
		case <-s.changed:
			if fp := fingerprint(s.current()); fp != s.fp {
				s.e.log.Info("replica changed: replacing its engine", "replica", s.k, "was", s.fp, "now", fp)
				s.stopEngine()
				s.fp, s.restarts, s.phase, s.nextStart = fp, 0, waiting, time.Now()
				s.bo.Reset()
				if s.held {
					// The Gate loads the new engine when it wants it.
					s.want = false
					s.report(pb.ReplicaState_REPLICA_STATE_PLACED, "replica changed: its engine stopped; it loads again on demand")
				}
				s.hold(s.current())
			}
		case reason := <-s.exceeded:
			s.stopEngine()
			s.fail(reason)
		case c := <-s.ctl:
			if !c.start && s.held {
				s.stopEngine()
				s.want, s.phase = false, waiting
				s.report(pb.ReplicaState_REPLICA_STATE_PLACED, c.reason)
			}
			close(c.done)
		case <-s.proc.done:
			exit := s.proc.exit
			s.proc.killStragglers()
			s.gone()
			s.fail("engine " + exit)
		case <-tick.C:
			s.check()
		}
	}
}

// wait sleeps until the next start is due; false when the supervisor must
// end instead.
func (s *supervisor) wait() bool {
	for {
		d := time.Until(s.nextStart)
		if d <= 0 {
			return true
		}
		t := time.NewTimer(d)
		select {
		case <-s.ctx.Done():
			t.Stop()
			return false
		case <-s.changed:
			t.Stop()
			// A new generation or placement starts at once, afresh.
			if fp := fingerprint(s.current()); fp != s.fp {
				s.fp, s.restarts, s.nextStart = fp, 0, time.Now()
				s.bo.Reset()
			}
		case <-s.exceeded: // about an engine already stopped
			t.Stop()
		case c := <-s.ctl: // no engine to stop; a start is due anyway
			close(c.done)
		case <-t.C:
		}
	}
}

// hold asks the Gate whether it holds d's replica.
func (s *supervisor) hold(d Desired) {
	s.held, s.frontURL = false, ""
	if g := s.e.opts.Gate; g != nil {
		s.frontURL, s.held = g.Hold(d)
	}
}

// idle waits, without an engine, for a held replica's StartEngine; false
// when the supervisor must end instead.
func (s *supervisor) idle() bool {
	select {
	case <-s.ctx.Done():
		return false
	case <-s.changed:
		if fp := fingerprint(s.current()); fp != s.fp {
			s.fp, s.restarts = fp, 0
			s.bo.Reset()
		}
		if s.hold(s.current()); !s.held {
			s.nextStart = time.Now()
		}
	case <-s.exceeded: // about an engine already stopped
	case c := <-s.ctl:
		if c.start {
			s.want, s.nextStart = true, time.Now()
		}
		close(c.done)
	}
	return true
}

// start launches the engine once the replica's cards are free to start on;
// while another replica starts on one of them, the replica is reported
// Placed with a reason that names it.
func (s *supervisor) start() {
	d := s.current()
	timeout := engine.StartTimeout(d.Spec.GetEngine())
	kind := d.Spec.GetEngine().GetKind()
	st := &starter{k: s.k, kind: kind, alone: engine.StartsAlone(kind), shareMiB: d.Replica.GetMemoryMib(), timeout: timeout}
	release, err := s.e.lockCards(s.ctx, st, d.Replica.GetCards(), func(reason string) {
		s.report(pb.ReplicaState_REPLICA_STATE_PLACED, reason)
	})
	if err != nil {
		return // ending
	}
	// The desired state may have moved on while waiting for the cards.
	if d2 := s.current(); fingerprint(d2) != fingerprint(d) {
		release()
		s.fp, s.restarts, s.nextStart = fingerprint(d2), 0, time.Now()
		return
	}
	if err := s.launch(d); err != nil {
		release()
		s.e.log.Warn("start engine", "replica", s.k, "err", err)
		s.fail(err.Error())
		return
	}
	s.release = release
	s.phase, s.startedAt, s.timeout, s.fails, s.probed = starting, time.Now(), timeout, 0, ""
	s.watchProgress()
	s.report(pb.ReplicaState_REPLICA_STATE_STARTING, "")
}

// launch builds the command, opens the log and starts the process.
func (s *supervisor) launch(d Desired) error {
	opts := &s.e.opts
	cards := make([]*pb.Card, 0, len(d.Replica.GetCards()))
	for _, i := range d.Replica.GetCards() {
		if c, ok := s.e.cards[i]; ok {
			cards = append(cards, c)
		}
	}
	port, err := s.e.ports.take(s.k, listenHost(opts.BindHost))
	if err != nil {
		return err
	}
	cmd, err := engine.Build(engine.Params{
		Model: s.k.model, Spec: d.Spec, Replica: d.Replica, Cards: cards,
		Host: opts.BindHost, Port: port, Self: opts.Self, MaySleep: s.held,
		NeighbourMiB: s.e.neighbourMiB(s.k, d.Replica),
	}, opts.Enforcement)
	if err != nil {
		return err
	}
	argv := append([]string{cmd.Path}, cmd.Args...)
	header := fmt.Sprintf("--- gpuplane: %s starting %s engine for %s (generation %d, restart %d): %s\n",
		time.Now().UTC().Format(time.RFC3339), d.Spec.GetEngine().GetKind(), s.k,
		d.Replica.GetGeneration(), s.restarts, strings.Join(argv, " "))
	c := exec.Command(cmd.Path, cmd.Args...)
	c.Env = append(os.Environ(), cmd.Env...)
	c.Env = append(c.Env, engine.KeyEnv(d.Spec.GetEngine().GetKind(), opts.EngineKeys.For(s.k.model, s.k.index))...)
	if opts.SimUsageDir != "" {
		c.Env = append(c.Env, inventory.EnvSimUsageDir+"="+opts.SimUsageDir)
	}
	c.Dir = s.dir
	p, err := s.e.startEngine(s.k, c, header)
	if err != nil {
		return fmt.Errorf("start %s: %w", cmd.Path, err)
	}
	s.proc, s.port, s.cmdline, s.health = p, port, argv, cmd.HealthPath
	s.stopPreload()
	s.preload, s.preloaded, s.fatal = cmd.Preload, false, ""
	rec := &record{
		Model: s.k.model, Replica: s.k.index, Generation: d.Replica.GetGeneration(), Fingerprint: fingerprint(d),
		PID: p.pid, Port: port, Endpoint: s.endpoint(), Restarts: s.restarts, Command: argv, StartedAt: time.Now().UTC(),
		EngineID: p.box.id, Cgroups: p.box.cgroupsRecord(),
	}
	if st, err := procfs.ReadStat(p.pid); err == nil {
		rec.StartTime = st.StartTime
	}
	if err := writeRecord(s.dir, rec); err != nil {
		s.e.log.Warn("record engine process", "replica", s.k, "err", err)
	}
	s.publish()
	return nil
}

// healthPath is the health path of the engine kind d runs (for an adopted
// engine, whose command was built by a previous agent).
func (s *supervisor) healthPath(d Desired) string {
	cmd, err := engine.Build(engine.Params{Model: s.k.model, Spec: d.Spec, Replica: d.Replica,
		Cards: s.cardsOf(d), Host: s.e.opts.BindHost, Port: max(s.port, 1), Self: s.e.opts.Self}, s.e.opts.Enforcement)
	if err != nil {
		return ""
	}
	return cmd.HealthPath
}

func (s *supervisor) cardsOf(d Desired) []*pb.Card {
	var out []*pb.Card
	for _, i := range d.Replica.GetCards() {
		if c, ok := s.e.cards[i]; ok {
			out = append(out, c)
		}
	}
	return out
}

// publish tells the watchdog about the live process.
func (s *supervisor) publish() {
	s.e.setEngine(s.k, s.e.engineOf(s.k, s.current(), s.proc.pid, s.port))
}

// check runs one health check. An engine whose
// process has exited is left to the run loop, which reports how it ended:
// whatever answers on its port, it is not Running.
func (s *supervisor) check() {
	if s.proc.exited() {
		return
	}
	found := s.probe()
	if found == "" && s.proc.exited() {
		return
	}
	if found != "" {
		s.probed = found
	}
	switch {
	case s.phase == starting && s.fatal != "":
		reason := s.fatal
		s.stopEngine()
		s.fail(reason)
	case s.phase == starting && found == "":
		s.phase, s.fails = running, 0
		s.unlock()
		s.report(pb.ReplicaState_REPLICA_STATE_RUNNING, "")
	case s.phase == starting && time.Since(s.startedAt) > s.timeout:
		s.stopEngine()
		s.fail(fmt.Sprintf("engine not ready within its start timeout of %s (spec.engine.startTimeout): %s", s.timeout, s.probed))
	case s.phase == starting && s.stuck(found):
		stall, ran := s.e.opts.StartStallTimeout, time.Since(s.startedAt).Truncate(time.Second)
		s.stopEngine()
		s.fail(fmt.Sprintf("engine stuck while starting: no progress for %s (no health change: %s; no log output; no memory growth); "+
			"stopped %s into its start timeout of %s", stall, s.probed, ran, s.timeout))
	case s.phase == running && found == "":
		s.fails = 0
	case s.phase == running:
		s.fails++
		if s.fails >= failuresBeforeRestart {
			s.stopEngine()
			s.fail(fmt.Sprintf("engine failed %d health checks in a row: %s", s.fails, s.probed))
		}
	}
}

// fail reports the replica Failed with reason and schedules the restart
// after the backoff, which starts over once an engine ran long enough.
func (s *supervisor) fail(reason string) {
	if s.held {
		// The Gate decides whether and when to load it again.
		s.restarts++
		s.want, s.phase = false, waiting
		s.e.log.Warn("engine failed", "replica", s.k, "reason", reason, "restarts", s.restarts)
		s.report(pb.ReplicaState_REPLICA_STATE_FAILED, reason)
		return
	}
	if s.phase == running && time.Since(s.startedAt) >= s.e.opts.BackoffReset {
		s.bo.Reset()
	}
	delay := s.bo.NextBackOff()
	s.restarts++
	s.phase, s.nextStart = waiting, time.Now().Add(delay)
	s.e.log.Warn("engine failed", "replica", s.k, "reason", reason, "restart_in", delay, "restarts", s.restarts)
	s.report(pb.ReplicaState_REPLICA_STATE_FAILED, reason)
}

// stopEngine stops the live process and forgets it.
func (s *supervisor) stopEngine() {
	if s.proc == nil {
		return
	}
	s.proc.stop(s.e.opts.GracePeriod)
	s.gone()
}

// gone forgets a process that has ended.
func (s *supervisor) gone() {
	s.stopPreload()
	s.unlock()
	// The record goes first, so that once the watchdog no longer sees the
	// engine there is nothing left of it on disk either.
	removeRecord(s.dir)
	s.e.setEngine(s.k, nil)
	s.proc = nil
}

func (s *supervisor) unlock() {
	if s.release != nil {
		s.release()
		s.release = nil
	}
}

// finish ends the supervisor: the engine stops unless the executor keeps
// engines for its successor; a replica still placed here is reported
// Stopped.
func (s *supervisor) finish() {
	if s.removed.Load() {
		s.stopEngine()
		return
	}
	if s.e.opts.KeepEngines {
		if s.proc != nil {
			s.proc.stopPoll()
		}
		s.unlock()
		return
	}
	s.stopEngine()
	s.report(pb.ReplicaState_REPLICA_STATE_STOPPED, "node agent stopped")
}

func (s *supervisor) endpoint() string {
	if s.port == 0 {
		return ""
	}
	return "http://" + net.JoinHostPort(s.e.opts.AdvertiseHost, itoa(s.port))
}

// report sends a transition, once: an identical report is not repeated.
// It carries the residency the transition implies (residency.go).
func (s *supervisor) report(state pb.ReplicaState, reason string) {
	s.reportMu.Lock()
	defer s.reportMu.Unlock()
	d := s.current()
	st := &pb.ReplicaStatus{
		Model: s.k.model, Replica: s.k.index, Generation: d.Replica.GetGeneration(), Node: s.e.opts.Node,
		State: state, Reason: reason, Restarts: s.restarts,
	}
	st.Residency, st.ResidencyReason = engineResidency(state, reason)
	engineURL := ""
	if state == pb.ReplicaState_REPLICA_STATE_STARTING || state == pb.ReplicaState_REPLICA_STATE_RUNNING {
		engineURL = s.endpoint()
		st.Endpoint = engineURL
	}
	if s.held {
		st.Residency, st.ResidencyReason = heldResidency(state, reason)
		st.Endpoint = s.frontURL
	} else if s.frontURL != "" && st.Endpoint != "" {
		st.Endpoint = s.frontURL
	}
	if proto.Equal(st, s.latest) {
		return
	}
	s.latest, s.unsent = st, true
	if g := s.e.opts.Gate; g != nil {
		g.Engine(s.k.model, s.k.index, state, engineURL)
	}
	s.send(context.Background())
}

// reportTimeout bounds one attempt at a report.
const reportTimeout = 10 * time.Second

// send reports latest, once; called with reportMu held and unsent set. A
// report accepted, or rejected (stale: the replica moved on), is done
// with; any other failure (no server reached, no leader, no answer) leaves
// it unsent, for resend. It returns whether it is done with latest.
func (s *supervisor) send(ctx context.Context) bool {
	st := s.latest
	ctx, cancel := context.WithTimeout(ctx, reportTimeout)
	defer cancel()
	err := s.e.rep.Report(ctx, st)
	var rejected *Rejected
	switch {
	case err == nil:
		s.unsent = false
		return true
	case errors.As(err, &rejected):
		s.unsent = false
		s.e.log.Info("report replica status: rejected", "replica", s.k, "state", st.State, "err", err)
		return true
	}
	s.e.log.Info("report replica status", "replica", s.k, "state", st.State, "err", err)
	s.wakeResend()
	return false
}

func (s *supervisor) wakeResend() {
	select {
	case s.resendNow <- struct{}{}:
	default:
	}
}

// resend reports the replica's latest status again, with backoff, while it
// is unsent, until ctx ends: a report lost to a partition or a leader change
// is not left for the replica's next transition, which on a quiet node may
// never come.
func (s *supervisor) resend(ctx context.Context) {
	bo := retryBackoff(resendDelay, maxResendDelay)
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.resendNow:
		}
		bo.Reset()
		for done := false; !done; {
			t := time.NewTimer(bo.NextBackOff())
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			s.reportMu.Lock()
			done = !s.unsent || s.send(ctx)
			s.reportMu.Unlock()
		}
		// send woke resend for each failure of this round: they are
		// answered already.
		select {
		case <-s.resendNow:
		default:
		}
	}
}

// resendDelay and maxResendDelay bound the backoff between attempts at a
// report that did not get through.
const (
	resendDelay    = 500 * time.Millisecond
	maxResendDelay = 5 * time.Second
)

// reconcile compares the cluster's record of the replica, r (read
// linearizably, when the node's event stream starts again), with what this
// node last said of it, and reports it again where they differ: a report
// may have been lost while the stream was down, or accepted and then
// undone by someone else's write.
func (s *supervisor) reconcile(r *pb.Replica) {
	s.reportMu.Lock()
	defer s.reportMu.Unlock()
	st := s.latest
	if st == nil || s.unsent || r.GetGeneration() != st.GetGeneration() || r.GetNode() != st.GetNode() {
		return
	}
	if r.GetState() == st.GetState() && r.GetReason() == st.GetReason() && r.GetRestarts() == st.GetRestarts() &&
		r.GetEndpoint() == st.GetEndpoint() &&
		(st.GetResidency() == pb.ReplicaResidency_REPLICA_RESIDENCY_UNSPECIFIED || r.GetResidency() == st.GetResidency()) {
		return
	}
	s.e.log.Info("the cluster's record of a replica differs from this node's: reporting it again", "replica", s.k,
		"recorded", r.GetState(), "state", st.GetState())
	s.unsent = true
	s.wakeResend()
}

func listenHost(bind string) string {
	if bind == "" {
		return "0.0.0.0"
	}
	return bind
}
