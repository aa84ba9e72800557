package executor

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/cenkalti/backoff/v5"

	enginetable "github.com/gpuplane/gpuplane/internal/engines"
	"github.com/gpuplane/gpuplane/node/engine"
	"github.com/gpuplane/gpuplane/node/watchdog"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// Desired is one replica this node should run, with its deployment's spec.
type Desired struct {
	Replica *pb.Replica
	Spec    *pb.ModelSpec
}

// Snapshot is every replica placed on the node as of log index Index.
type Snapshot struct {
	Index    uint64
	Replicas []Desired
}

// Source tells the executor which replicas its node should run.
type Source interface {
	// Watch sends a full Snapshot of the replicas placed on node now, then
	// another after every committed change that touches them (a deployment's
	// spec or one of its replicas' placement), starting after log index from
	// (0: from the current state). The channel closes when the stream breaks;
	// the executor then watches again from the last index it saw.
	Watch(ctx context.Context, node string, from uint64) (<-chan Snapshot, error)
}

// Reporter records a replica's state transition in the cluster; the agent
// applies it as a ReplicaStatus command. A report the cluster refuses (a
// stale one: the replica moved or changed generation) comes back as a
// *Rejected; the executor logs it and goes on. Any other error (no server
// reached, no leader, no answer in time) leaves the report's fate unknown,
// and the executor sends it again, with backoff, until it is accepted,
// rejected or superseded by a newer status of the replica.
type Reporter interface {
	Report(ctx context.Context, status *pb.ReplicaStatus) error
}

// Rejected is a Reporter's error for a report the cluster refused: sending
// it again cannot succeed.
type Rejected struct {
	// Reason is the cluster's.
	Reason string
}

func (r *Rejected) Error() string { return r.Reason }

// Options configure an Executor; zero values take the defaults.
type Options struct {
	// Node is this node's name; only replicas placed on it run.
	Node string
	// DataDir holds engines/<model>/<replica>/{engine.log,pid.json}.
	DataDir string
	// Cards are this node's cards, by index.
	Cards []*pb.Card
	// BindHost is the address engines listen on (default 127.0.0.1: an
	// engine is for the node's own gateway and fronts, not a door past
	// them); AdvertiseHost the host of the endpoints reported (default
	// 127.0.0.1).
	BindHost      string
	AdvertiseHost string
	// Enforcement holds engines to their shares beyond their own flags.
	Enforcement engine.Enforcement
	// EngineKeys give each vLLM and llama.cpp engine its API key (in its
	// environment, engine.KeyEnv); nil: none.
	EngineKeys *engine.Keys
	// Self is the gpuplane executable that runs sim engines (default: this
	// process's executable).
	Self string
	// SimUsageDir, set on nodes with simulated cards, is passed to engines as
	// inventory.EnvSimUsageDir so that sim engines register their memory
	// where the simulated NVML reads it.
	SimUsageDir string
	// PortFirst..PortLast is the range engines' ports come from (default
	// DefaultPortFirst..DefaultPortLast).
	PortFirst, PortLast int
	// GracePeriod between SIGTERM and SIGKILL (default 10s).
	GracePeriod time.Duration
	// HealthInterval between health checks (default 1s). How long one
	// start may take is the deployment's (engine.StartTimeout).
	HealthInterval time.Duration
	// StartStallTimeout is how long a starting engine may show no
	// progress (no change in what its health probe finds, no log output,
	// no growth of its GPU or host memory) before it is declared stuck,
	// stopped and its replica Failed, however long its start timeout
	// (default DefaultStartStallTimeout; negative: never).
	StartStallTimeout time.Duration
	// NVML reads the GPU memory of starting engines, one of the signs of
	// their progress; nil leaves the other signs.
	NVML nvml.Interface
	// RestartDelay and MaxRestartDelay bound the exponential backoff between
	// restarts (defaults 1s and 5m); it resets after an engine has run
	// healthy for BackoffReset (default 10m).
	RestartDelay    time.Duration
	MaxRestartDelay time.Duration
	BackoffReset    time.Duration
	// LogMaxBytes caps an engine's log on disk, all its files together
	// (default 10 MiB), whatever the engine writes; LogKeep is how many
	// rotated files are kept besides engine.log (default 3), so each holds
	// at most LogMaxBytes/(LogKeep+1).
	LogMaxBytes int64
	LogKeep     int
	// Containment is ContainAuto (default: a cgroup per engine where the
	// node allows it) or ContainProcessGroup (the fallback without cgroups).
	Containment string
	// OrphanGrace is how long an engine outlives its agent: past it with
	// no agent running (a kill -9, a crash), the engine's log writer stops
	// it; an agent restarted sooner adopts it. 0 means DefaultOrphanGrace,
	// a negative value never.
	OrphanGrace time.Duration
	// KeepEngines leaves engines running when Run returns, for a new
	// executor to adopt (an agent upgrade); otherwise Run stops them and
	// reports them Stopped.
	KeepEngines bool
	// Gate, when set, holds the engines of the replicas a residency
	// manager loads on demand (gate.go).
	Gate   Gate
	Logger *slog.Logger
}

func (o *Options) defaults() error {
	if o.Node == "" || o.DataDir == "" {
		return errors.New("executor: Node and DataDir are required")
	}
	if o.BindHost == "" {
		o.BindHost = "127.0.0.1"
	}
	if o.AdvertiseHost == "" {
		o.AdvertiseHost = "127.0.0.1"
	}
	if o.Enforcement.Mode == "" {
		o.Enforcement.Mode = engine.ModeNone
	}
	if o.Self == "" {
		self, err := os.Executable()
		if err != nil {
			return fmt.Errorf("executor: find the gpuplane executable: %w", err)
		}
		o.Self = self
	}
	setDefault(&o.GracePeriod, 10*time.Second)
	if o.PortFirst == 0 && o.PortLast == 0 {
		o.PortFirst, o.PortLast = DefaultPortFirst, DefaultPortLast
	}
	if o.PortFirst < 1 || o.PortLast > 65535 || o.PortFirst > o.PortLast {
		return fmt.Errorf("executor: engine ports %d-%d: want 1 <= first <= last <= 65535", o.PortFirst, o.PortLast)
	}
	setDefault(&o.HealthInterval, time.Second)
	if o.StartStallTimeout == 0 {
		o.StartStallTimeout = DefaultStartStallTimeout
	}
	setDefault(&o.RestartDelay, time.Second)
	setDefault(&o.MaxRestartDelay, 5*time.Minute)
	setDefault(&o.BackoffReset, 10*time.Minute)
	setDefault(&o.OrphanGrace, DefaultOrphanGrace)
	setDefault(&o.LogMaxBytes, 10<<20)
	setDefault(&o.LogKeep, 3)
	switch o.Containment {
	case "":
		o.Containment = ContainAuto
	case ContainAuto, ContainProcessGroup:
	default:
		return fmt.Errorf("executor: Containment must be %q or %q, got %q", ContainAuto, ContainProcessGroup, o.Containment)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return nil
}

// DefaultStartStallTimeout is Options.StartStallTimeout's default: longer
// than a large model's silent phases (a weight download that prints
// nothing, a compile that allocates nothing), far shorter than vLLM's 30
// minutes of start timeout.
const DefaultStartStallTimeout = 5 * time.Minute

func setDefault[T cmp.Ordered](v *T, d T) {
	var zero T
	if *v <= zero {
		*v = d
	}
}

// key names a replica on this node.
type key struct {
	model string
	index uint32
}

func (k key) String() string { return fmt.Sprintf("%s/%d", k.model, k.index) }

// Executor runs the replicas placed on one node.
type Executor struct {
	src  Source
	rep  Reporter
	opts Options
	log  *slog.Logger

	// contain keeps each engine and its descendants together.
	contain *containment

	cards map[uint32]*pb.Card
	// starts are the engine starts in progress on each card (starts.go).
	starts map[uint32]*cardStarts

	mu   sync.Mutex
	sups map[key]*supervisor
	// retiring holds the done channels of supervisors stopping the engine
	// of a replica that left the node.
	retiring map[key]chan struct{}
	// engines is what the watchdog checks: the live process of each replica.
	engines map[key]watchdog.Engine
	// ports hands out the engines' ports.
	ports *portRange
}

// New returns an executor; Run starts it.
func New(src Source, rep Reporter, opts Options) (*Executor, error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	contain, err := newContainment(opts.Node, opts.DataDir, opts.Containment)
	if err != nil {
		return nil, err
	}
	opts.Logger.Info("engines are contained by " + contain.describe())
	e := &Executor{
		src: src, rep: rep, opts: opts, log: opts.Logger, contain: contain,
		cards:    map[uint32]*pb.Card{},
		starts:   map[uint32]*cardStarts{},
		sups:     map[key]*supervisor{},
		retiring: map[key]chan struct{}{},
		engines:  map[key]watchdog.Engine{},
		ports:    newPortRange(opts.PortFirst, opts.PortLast),
	}
	for _, c := range opts.Cards {
		e.cards[c.GetIndex()] = c
		e.starts[c.GetIndex()] = &cardStarts{index: c.GetIndex(), ended: make(chan struct{})}
	}
	return e, nil
}

// Run watches the Source and reconciles until ctx ends. Before it starts
// anything it deals with the engines a previous executor left (pid.json):
// once the first snapshot says what is wanted, it adopts the engines that
// are still wanted as they are and stops the others. When ctx ends it stops
// every engine (unless KeepEngines) and returns.
func (e *Executor) Run(ctx context.Context) error {
	if err := os.MkdirAll(e.enginesDir(), 0o755); err != nil {
		return fmt.Errorf("executor: %w", err)
	}
	// Before anything else: the engines a previous agent left see an agent
	// again and wait to be adopted (orphan.go).
	if err := markAgent(e.enginesDir()); err != nil {
		// A full disk: the engines are still adopted and followed (each
		// one's state follows its process), and the mark is written as
		// soon as it can be; until then their log writers see no agent
		// and stop them after the orphan grace, which the executor sees
		// as any engine's death.
		e.log.Error("executor: cannot mark this agent as the engines' owner: the engines a previous agent left will stop after the orphan grace unless it is written; retrying every second",
			"err", err, "orphan_grace", e.opts.OrphanGrace)
		go e.remark(ctx)
	}
	records := e.readRecords()
	supCtx, stopSups := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	defer func() {
		stopSups()
		wg.Wait()
		e.contain.close()
	}()

	first := true
	follow(ctx, e.src, e.opts.Node, e.log, func(snap Snapshot, fresh bool) {
		var left map[key]leftEngine
		if first {
			left = e.settle(records, snap)
			first = false
			// The engines adopted are among Engines() before the
			// Gate hears of any replica, so that it never takes
			// the memory they hold for free.
			want := e.wanted(snap)
			for k, l := range left {
				if l.alive {
					e.setEngine(k, e.engineOf(k, want[k], l.rec.PID, l.rec.Port))
				}
			}
		}
		if g := e.opts.Gate; g != nil {
			g.Placed(slices.Collect(maps.Values(e.wanted(snap))))
		}
		e.apply(supCtx, &wg, snap, left, fresh)
	})
	return nil
}

// remark writes the agent's mark once it can, every second until ctx ends.
func (e *Executor) remark(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := markAgent(e.enginesDir()); err == nil {
			e.log.Info("executor: marked this agent as the engines' owner (engines/" + agentFile + ")")
			return
		}
	}
}

// follow watches src for node's snapshots and calls apply with each until
// ctx ends; fresh says the snapshot is the first of a watch, read
// linearizably, whose replicas show what the cluster has recorded of them
// now. When the stream breaks it watches again from the last index it saw,
// after a backoff that a snapshot received resets. Executor and Hollow both
// run on it.
func follow(ctx context.Context, src Source, node string, log *slog.Logger, apply func(snap Snapshot, fresh bool)) {
	retry := retryBackoff(200*time.Millisecond, 10*time.Second)
	var from uint64
	for {
		snaps, err := src.Watch(ctx, node, from)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			log.Warn("watch the replicas of this node", "err", err)
		}
		fresh := true
		for snaps != nil {
			select {
			case <-ctx.Done():
				return
			case snap, ok := <-snaps:
				if !ok {
					snaps = nil
					break
				}
				retry.Reset()
				from = max(from, snap.Index)
				apply(snap, fresh)
				fresh = false
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(retry.NextBackOff()):
		}
	}
}

// retryBackoff is the backoff of the executor's retries (a broken watch, a
// report that did not get through): doubling from initial up to most,
// each wait ±50 % so that a fleet's nodes do not retry in step.
func retryBackoff(initial, most time.Duration) *backoff.ExponentialBackOff {
	return &backoff.ExponentialBackOff{InitialInterval: initial, RandomizationFactor: 0.5, Multiplier: 2, MaxInterval: most}
}

// wanted returns the replicas of snap placed on this node, by key.
func (e *Executor) wanted(snap Snapshot) map[key]Desired {
	out := map[key]Desired{}
	for _, d := range snap.Replicas {
		r := d.Replica
		if r.GetNode() != e.opts.Node || len(r.GetCards()) == 0 || d.Spec == nil {
			continue
		}
		out[key{r.GetModel(), r.GetIndex()}] = d
	}
	return out
}

// apply reconciles the supervisors with snap: new replicas get one, changed
// ones are told, gone ones are stopped. A replica that comes back while its
// old supervisor still stops its engine waits for it. left is what a
// previous executor left of the replicas' engines (the first snapshot only).
//
// fresh says snap is the first snapshot of a watch: the replicas whose
// record in it differs from what their supervisors last said are reported
// again (reconcile), since reports may have been lost while the node's
// stream was down.
func (e *Executor) apply(ctx context.Context, wg *sync.WaitGroup, snap Snapshot, left map[key]leftEngine, fresh bool) {
	want := e.wanted(snap)
	e.mu.Lock()
	defer e.mu.Unlock()
	for k, s := range e.sups {
		if _, ok := want[k]; !ok {
			e.log.Info("replica left this node: stopping its engine", "replica", k)
			s.remove()
			delete(e.sups, k)
			e.retiring[k] = s.done
		}
	}
	for _, k := range slices.SortedFunc(maps.Keys(want), func(a, b key) int {
		return cmp.Or(cmp.Compare(a.model, b.model), cmp.Compare(a.index, b.index))
	}) {
		d := want[k]
		if s, ok := e.sups[k]; ok {
			if fresh {
				s.reconcile(d.Replica)
			}
			s.update(d)
			continue
		}
		s := newSupervisor(ctx, e, k, d, left[k], e.stopping(k))
		e.sups[k] = s
		wg.Go(s.run)
	}
}

// stopping returns the done channel of a supervisor of k still stopping its
// engine, so that its successor waits; nil when there is none. Called with
// e.mu held.
func (e *Executor) stopping(k key) <-chan struct{} {
	if done, ok := e.retiring[k]; ok {
		return done
	}
	return nil
}

// retired forgets a supervisor that has finished.
func (e *Executor) retired(k key, done chan struct{}) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.retiring[k] == done {
		delete(e.retiring, k)
	}
}

// Engines returns the live engine processes, for the watchdog.
func (e *Executor) Engines() []watchdog.Engine {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]watchdog.Engine, 0, len(e.engines))
	for _, en := range e.engines {
		out = append(out, en)
	}
	slices.SortFunc(out, func(a, b watchdog.Engine) int {
		return cmp.Or(cmp.Compare(a.Model, b.Model), cmp.Compare(a.Replica, b.Replica))
	})
	return out
}

// Exceeded is the watchdog telling that an engine uses more than its share:
// its supervisor stops it, reports the replica Failed with reason and
// restarts it after its backoff.
func (e *Executor) Exceeded(en watchdog.Engine, _ uint64, reason string) {
	e.mu.Lock()
	s := e.sups[key{en.Model, en.Replica}]
	cur, live := e.engines[key{en.Model, en.Replica}]
	e.mu.Unlock()
	if s == nil || !live || cur.PID != en.PID {
		return // already gone or replaced
	}
	select {
	case s.exceeded <- reason:
	default: // one is pending already
	}
}

// engineOf is the watchdog's view of the engine pid of replica k, placed
// as d.
func (e *Executor) engineOf(k key, d Desired, pid, port int) *watchdog.Engine {
	en := &watchdog.Engine{Model: k.model, Replica: k.index, PID: pid, ShareMiB: d.Replica.GetMemoryMib(),
		ToleranceMiB: enginetable.For(d.Spec.GetEngine()).ToleranceMiB, Kind: engine.ControlKind(d.Spec.GetEngine())}
	if port > 0 {
		en.URL = "http://" + net.JoinHostPort(e.localHost(), itoa(port))
	}
	for _, i := range d.Replica.GetCards() {
		if c, ok := e.cards[i]; ok {
			en.CardUUIDs = append(en.CardUUIDs, c.GetUuid())
		}
	}
	return en
}

func (e *Executor) setEngine(k key, en *watchdog.Engine) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if en == nil {
		delete(e.engines, k)
		return
	}
	e.engines[k] = *en
}

// HostMemory is the host memory, in bytes, that the engine of a replica on
// this node uses now, all its processes together, read from its memory
// cgroup (see containment): what docs/residency.md counts for an engine that keeps
// its weights in host RAM. It is an error where the engine has no memory
// cgroup (no engine running, or none on this node).
func (e *Executor) HostMemory(model string, replica uint32) (uint64, error) {
	k := key{model, replica}
	e.mu.Lock()
	_, live := e.engines[k]
	e.mu.Unlock()
	if !live {
		return 0, fmt.Errorf("replica %s has no engine running on this node", k)
	}
	leaf := filepath.Join(model, fmt.Sprint(replica))
	b := &box{v1: map[string]string{}}
	if e.contain.v2 != "" {
		b.v2 = filepath.Join(e.contain.v2, leaf)
	}
	if d := e.contain.v1["memory"]; d != "" {
		b.v1["memory"] = filepath.Join(d, leaf)
	}
	return b.hostMemory()
}

func (e *Executor) enginesDir() string { return filepath.Join(e.opts.DataDir, "engines") }

func (e *Executor) replicaDir(k key) string {
	return ReplicaDir(e.opts.DataDir, k.model, k.index)
}

// ReplicaDir is where a replica's engine.log and pid.json live.
func ReplicaDir(dataDir, model string, replica uint32) string {
	return filepath.Join(dataDir, "engines", model, fmt.Sprint(replica))
}
