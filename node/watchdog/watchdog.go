// Package watchdog holds engines to their GPU memory share (docs/engines.md). Every
// interval it reads each card's compute processes from NVML
// (DeviceGetHandleByUUID, GetComputeRunningProcesses; the simulated NVML on
// machines without a driver), adds up what each engine's process group uses
// on each of its cards, and tells the Target about any engine above its share
// plus a tolerance.
//
// It never stops a process itself and never reports to the cluster: the
// executor (its Target) stops the engine, reports the replica Failed and
// applies its restart backoff. It assumes NVML is initialised and, like
// NVML, that process ids are those of the agent's pid namespace.
package watchdog

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuplane/gpuplane/node/procfs"
)

// Engine is one running engine as the executor knows it.
type Engine struct {
	Model   string
	Replica uint32
	// PID is the engine's process, the leader of its process group: memory
	// of every process in the group counts.
	PID int
	// CardUUIDs are the replica's cards.
	CardUUIDs []string
	// ShareMiB is the replica's memory share on each card.
	ShareMiB uint64
	// ToleranceMiB, when set, is how far above its share this engine may
	// go: its engine's measured spread above its memory knob
	// (internal/engines), in place of the watchdog's default tolerance.
	ToleranceMiB uint64
	// Kind is the engine API the process speaks (engine.ControlKind) and
	// URL where the agent reaches it: what reads the engine's own
	// /metrics needs (the watchdog does not).
	Kind, URL string
}

// Target is what the watchdog watches; the executor implements it.
type Target interface {
	// Engines returns the engines running now.
	Engines() []Engine
	// Exceeded says that e uses more than its share; reason is the sentence
	// to report, "exceeded memory share (used X MiB, share Y MiB)". The
	// watchdog calls it on every check until the engine is gone.
	Exceeded(e Engine, usedMiB uint64, reason string)
}

// Options tune the watchdog; zero values take the defaults.
type Options struct {
	// Interval between checks (default 2s).
	Interval time.Duration
	// TolerancePercent of the share and ToleranceMiB: an engine whose rule
	// names no tolerance of its own (Engine.ToleranceMiB) may exceed its
	// share by the larger of the two (defaults 5 % and 256 MiB), room for
	// allocator slack that no engine flag controls exactly.
	TolerancePercent float64
	ToleranceMiB     uint64
	Logger           *slog.Logger
}

// Watchdog checks engines against their shares.
type Watchdog struct {
	lib    nvml.Interface
	target Target
	opts   Options
	// groupOf returns the process group of a pid; tests replace it.
	groupOf func(pid int) (int, bool)
}

// New returns a watchdog over lib (an initialised NVML) and target.
func New(lib nvml.Interface, target Target, opts Options) *Watchdog {
	if opts.Interval <= 0 {
		opts.Interval = 2 * time.Second
	}
	if opts.TolerancePercent <= 0 {
		opts.TolerancePercent = 5
	}
	if opts.ToleranceMiB == 0 {
		opts.ToleranceMiB = 256
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return &Watchdog{lib: lib, target: target, opts: opts, groupOf: processGroup}
}

// Run checks every interval until ctx ends.
func (w *Watchdog) Run(ctx context.Context) {
	t := time.NewTicker(w.opts.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			w.Check()
		}
	}
}

// Violation is an engine above its share on one card.
type Violation struct {
	Engine  Engine
	Card    string
	UsedMiB uint64
	Reason  string
}

// Check runs one pass: it reads every card the engines use once, tells the
// target about each engine above its share (its worst card) and returns what
// it found.
func (w *Watchdog) Check() []Violation {
	engines := w.target.Engines()
	if len(engines) == 0 {
		return nil
	}
	byGroup := map[int]int{} // process group → index in engines
	for i, e := range engines {
		byGroup[e.PID] = i
	}
	cards := map[string]map[int]uint64{} // card → engine index → MiB
	for _, e := range engines {
		for _, uuid := range e.CardUUIDs {
			if _, done := cards[uuid]; done {
				continue
			}
			procs, err := ProcessMemory(w.lib, uuid)
			if err != nil {
				w.opts.Logger.Warn("read GPU memory per process", "card", uuid, "err", err)
				continue
			}
			used := map[int]uint64{}
			for pid, mib := range procs {
				i, ok := byGroup[pid]
				if !ok {
					if g, found := w.groupOf(pid); found {
						i, ok = byGroup[g]
					}
				}
				if ok {
					used[i] += mib
				}
			}
			cards[uuid] = used
		}
	}
	var out []Violation
	for i, e := range engines {
		var worst Violation
		for _, uuid := range e.CardUUIDs {
			used := cards[uuid][i]
			if used > w.allowed(e) && used > worst.UsedMiB {
				worst = Violation{Engine: e, Card: uuid, UsedMiB: used}
			}
		}
		if worst.UsedMiB == 0 {
			continue
		}
		worst.Reason = fmt.Sprintf("exceeded memory share (used %d MiB, share %d MiB)", worst.UsedMiB, e.ShareMiB)
		w.opts.Logger.Warn("engine above its memory share", "model", e.Model, "replica", e.Replica,
			"pid", e.PID, "card", worst.Card, "used_mib", worst.UsedMiB, "share_mib", e.ShareMiB)
		w.target.Exceeded(e, worst.UsedMiB, worst.Reason)
		out = append(out, worst)
	}
	return out
}

// allowed is the share plus the tolerance: the engine's own when its
// rule has one, else the default.
func (w *Watchdog) allowed(e Engine) uint64 {
	if e.ToleranceMiB > 0 {
		return e.ShareMiB + e.ToleranceMiB
	}
	tol := uint64(float64(e.ShareMiB) * w.opts.TolerancePercent / 100)
	return e.ShareMiB + max(tol, w.opts.ToleranceMiB)
}

// ProcessMemory returns the GPU memory, in MiB, that each process uses on
// the card with this UUID, as NVML's compute processes report it.
func ProcessMemory(lib nvml.Interface, uuid string) (map[int]uint64, error) {
	dev, ret := lib.DeviceGetHandleByUUID(uuid)
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("find card %s: %w", uuid, ret)
	}
	procs, ret := dev.GetComputeRunningProcesses()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("compute processes of %s: %w", uuid, ret)
	}
	out := make(map[int]uint64, len(procs))
	for _, p := range procs {
		// UsedGpuMemory is in bytes; without the permission to see it
		// (containers, some drivers) NVML reports 0 for the process.
		out[int(p.Pid)] += p.UsedGpuMemory >> 20
	}
	return out, nil
}

// processGroup returns the process group of pid.
func processGroup(pid int) (int, bool) {
	st, err := procfs.ReadStat(pid)
	return st.PGID, err == nil
}
