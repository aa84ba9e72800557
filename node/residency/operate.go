package residency

import (
	"context"
	"errors"
	"sync"
)

// OperatorResult is what an operator's load or unload did to one replica
// on this node.
type OperatorResult struct {
	Replica ModelID
	Card    string
	// Action is the action the controller took for it (0: none was
	// needed, the replica already was where it was asked to be).
	Action ActionKind
	// Reason is the action's recorded reason, or why none was needed.
	Reason string
}

// OperateFunc loads (load) or unloads the replicas of model, a deployment
// name or one replica ("chat/0"), that this node's controllers hold, as by
// asked (an API caller: a token's name, or "anonymous" without ACLs). No
// result and no error: none is held here.
type OperateFunc func(ctx context.Context, model string, load bool, by string) ([]OperatorResult, error)

// ErrNoOperator: the node's residency manager is not running.
var ErrNoOperator = errors.New("the node's residency manager is not running")

// operators is kept apart from the journal's own lock: an operation takes
// the manager's loop, which records into the journal.
type operators struct {
	mu sync.Mutex
	f  OperateFunc
	p  ProtectFunc
}

// SetOperator is called by the node's residency manager once it runs, so
// that API handlers, which hold only the journal, reach it.
func (j *Journal) SetOperator(f OperateFunc) {
	j.op.mu.Lock()
	j.op.f = f
	j.op.mu.Unlock()
}

// Operate passes an operator's load or unload to the node's residency
// manager.
func (j *Journal) Operate(ctx context.Context, model string, load bool, by string) ([]OperatorResult, error) {
	j.op.mu.Lock()
	f := j.op.f
	j.op.mu.Unlock()
	if f == nil {
		return nil, ErrNoOperator
	}
	return f(ctx, model, load, by)
}

// ProtectFunc puts the operator's choice of the protected set in force on
// every card of this node that holds a replica of one of models
// (deployment names): those replicas are protected there and the others
// with demand best-effort (ProtectModels); no models gives the choice back
// to every card's controller. One result per card it changed, its Reason
// the card's best-effort models and why.
type ProtectFunc func(ctx context.Context, models []string, by string) ([]OperatorResult, error)

// SetProtector is SetOperator's counterpart for the protected set.
func (j *Journal) SetProtector(f ProtectFunc) {
	j.op.mu.Lock()
	j.op.p = f
	j.op.mu.Unlock()
}

// Protect passes an operator's choice of the protected set to the node's
// residency manager.
func (j *Journal) Protect(ctx context.Context, models []string, by string) ([]OperatorResult, error) {
	j.op.mu.Lock()
	f := j.op.p
	j.op.mu.Unlock()
	if f == nil {
		return nil, ErrNoOperator
	}
	return f(ctx, models, by)
}
