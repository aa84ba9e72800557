package executor

import (
	"context"
	"fmt"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// Gate lets a node's residency manager (SPEC §8.3) decide when the engines
// of the replicas it manages run. Without a Gate, or for a replica it does
// not hold, the executor starts every placed replica's engine at once and
// keeps it running, as it always did (pinned behaviour).
//
// A held replica's engine starts only when the manager calls StartEngine
// and stops when it calls StopEngine; while it has no engine the replica
// stays placed (reported Placed, residency Cold) and its endpoint is the
// one Hold returned (the manager's front, which loads it on demand). A held
// engine that fails is not restarted by the executor: the manager decides
// whether to load it again, as it does when a held replica's generation or
// placement changes: its engine stops and it is reported Placed.
//
// The executor calls a Gate from its own goroutines, sometimes with a
// replica's report lock held: its methods must return quickly and must not
// call back into the executor synchronously.
type Gate interface {
	// Hold reports whether d's engine waits for StartEngine, and the
	// endpoint to report for it instead of the engine's own (empty: the
	// engine's). An endpoint without hold is reported while the engine
	// starts or runs, which starts as usual.
	Hold(d Desired) (endpoint string, hold bool)
	// Placed is told every replica placed on this node, before the executor
	// acts on each snapshot.
	Placed(ds []Desired)
	// Engine is told each state a replica's engine reports, with the
	// engine's own address (empty while it has none).
	Engine(model string, replica uint32, state pb.ReplicaState, engineURL string)
}

// control is a StartEngine or StopEngine request to a held replica's
// supervisor; done is closed once it is carried out.
type control struct {
	start  bool
	reason string
	done   chan struct{}
}

// StartEngine starts the engine of a held replica (a load). It returns at
// once: the replica's reports (Starting, Running or Failed) tell how it
// went. Starting a running engine does nothing.
func (e *Executor) StartEngine(model string, replica uint32, reason string) error {
	return e.control(context.Background(), model, replica, control{start: true, reason: reason})
}

// StopEngine stops the engine of a held replica (an eviction or unload) and
// returns once it has stopped; the replica stays placed, reported Placed
// with reason. For a replica that has just left the node it returns once
// the executor has stopped its engine.
func (e *Executor) StopEngine(ctx context.Context, model string, replica uint32, reason string) error {
	return e.control(ctx, model, replica, control{reason: reason})
}

func (e *Executor) control(ctx context.Context, model string, replica uint32, c control) error {
	e.mu.Lock()
	s := e.sups[key{model, replica}]
	retiring := e.retiring[key{model, replica}]
	e.mu.Unlock()
	if s == nil && !c.start && retiring != nil {
		// The replica left the node and its supervisor is stopping its
		// engine: the stop is done once that is, not before (the caller
		// counts the engine's memory as free from then on).
		select {
		case <-retiring:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if s == nil {
		return fmt.Errorf("replica %s/%d: %w", model, replica, ErrNotRunning)
	}
	c.done = make(chan struct{})
	select {
	case s.ctl <- c:
	case <-s.done:
		return fmt.Errorf("replica %s/%d left this node", model, replica)
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-c.done:
		return nil
	case <-s.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
