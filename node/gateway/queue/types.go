package queue

import (
	"fmt"
	"time"

	"github.com/gpuplane/gpuplane/internal/class"
)

// Class is a request's priority class; a higher value outranks a lower one.
// The type lives in internal/class so the residency controller ranks
// deployments by the same values without importing the queue.
type Class = class.Class

const (
	Background  = class.Background
	Standard    = class.Standard
	Interactive = class.Interactive
	numClasses  = class.Count
)

// ParseClass reads a class's name (interactive, standard, background; case
// and surrounding space ignored).
func ParseClass(s string) (Class, bool) { return class.Parse(s) }

// ID names one admitted request. The scheduler assigns IDs in admission
// order, starting at 1; zero is never a request.
type ID uint64

// Request is what the gateway knows about a request when it arrives.
type Request struct {
	// Deployment is the served name the request targets on this card.
	Deployment string
	// Tenant owns the request; unknown tenants get weight 1.
	Tenant string
	Class  Class
	// PromptTokens is the input length (an estimate from the body is
	// enough); it is charged when the engine admits the request.
	PromptTokens int
	// MaxTokens bounds the output; PromptTokens+MaxTokens is what the
	// request may hold of the engine's KV budget while in flight.
	MaxTokens int
	// Streamed requests cannot be re-run transparently: if preempted they
	// end (Preempted) instead of going back to the queue.
	Streamed bool
	// Deadline, when set, is the latest time the request may still be
	// waiting in the queue; past it the request expires.
	Deadline time.Time
}

// Deployment is one engine on the card and the limits of its queue.
type Deployment struct {
	Name string
	// MaxInFlight is the engine's in-flight request cap (required).
	MaxInFlight int
	// MaxTokens is the engine's KV budget in tokens: the sum over in-flight
	// requests of PromptTokens+MaxTokens stays within it. Zero: no token cap.
	MaxTokens int
	// QueueLimit bounds the requests waiting for this deployment; past it a
	// request is rejected with 429, unless it outranks a waiting one, which
	// is rejected in its place (required).
	QueueLimit int
	// Ready says the engine is resident and accepts requests. Requests for
	// a deployment that is not ready wait up to Config.ColdWait.
	Ready bool
	// Yields says the engine orders its own batch by the requests'
	// priority and pauses running background work for interactive work
	// (vLLM, or sim, with --scheduling-policy priority). An interactive
	// request that does not fit is then sent to the engine beside the
	// background requests in flight, which yield to it there, rather than
	// cutting one of them off: its cap counts only the requests that do not
	// yield (MaxInFlight and MaxTokens less the background in flight).
	Yields bool
}

// Config sets the scheduler's rules. Zero values take the defaults named.
type Config struct {
	// BackgroundFloor is the least fraction of dispatched tokens background
	// receives while it and a higher class are both backlogged (default
	// 0.05; 0 < floor < 1, or negative to disable).
	BackgroundFloor float64
	// StandardFloor is the same guarantee for standard against interactive
	// (default 0.05; negative disables).
	StandardFloor float64
	// InputPrice and OutputPrice weigh prompt and generated tokens in the
	// fair-share counters (default 1 each).
	InputPrice  float64
	OutputPrice float64
	// ColdWait is how long a request waits for a deployment that is not
	// ready before it is rejected with 503 (default 60 s); where the
	// deployment is best-effort or yields the card to another model's
	// turn, until the card its controller promises (SetCardBy) and
	// ColdWait more. A request that waited past its cold wait goes after
	// its tenant's fresh requests once the deployment is ready.
	ColdWait time.Duration
	// ColdWaitBackground is the same wait for a background request
	// (default 20 min): batch work waits for its model's turn on a busy
	// card (the residency controller grants one after 10 min of waiting,
	// docs/residency.md) instead of bouncing off every busy spell of the
	// interactive models whose memory it needs. Where the controller
	// promises the deployment the card later than that (SetCardBy), a
	// background request waits until then and ColdWait more.
	ColdWaitBackground time.Duration
	// MaxRetryAfter caps every Retry-After estimate (default 60 s).
	MaxRetryAfter time.Duration
	// NoPreemption turns off preempting background work for interactive
	// requests (for engines that honour a request priority themselves).
	NoPreemption bool
	// IdleTenant is how long a tenant's record on a deployment (its
	// fair-share counter) is kept once it holds no request (default 60 s;
	// one that a new record would equal goes at once). MaxIdleFlows bounds
	// the idle records kept (default 4096): past it the longest idle go.
	IdleTenant   time.Duration
	MaxIdleFlows int
}

const (
	defaultFloor         = 0.05
	defaultColdWait      = 60 * time.Second
	defaultColdWaitBg    = 20 * time.Minute
	defaultMaxRetryAfter = 60 * time.Second
	defaultIdleTenant    = 60 * time.Second
	defaultMaxIdleFlows  = 4096
	// minRetryAfter: HTTP's Retry-After has whole seconds; never tell a
	// client to come back immediately.
	minRetryAfter = time.Second
)

func (c Config) withDefaults() (Config, error) {
	floor := func(name string, v *float64) error {
		switch {
		case *v == 0:
			*v = defaultFloor
		case *v < 0:
			*v = 0
		case *v >= 1:
			return fmt.Errorf("queue config: %s is %g: it must be below 1 (a fraction of dispatched tokens)", name, *v)
		}
		return nil
	}
	if err := floor("BackgroundFloor", &c.BackgroundFloor); err != nil {
		return c, err
	}
	if err := floor("StandardFloor", &c.StandardFloor); err != nil {
		return c, err
	}
	price := func(name string, v *float64) error {
		switch {
		case *v == 0:
			*v = 1
		case *v < 0:
			return fmt.Errorf("queue config: %s is %g: it must be positive", name, *v)
		}
		return nil
	}
	if err := price("InputPrice", &c.InputPrice); err != nil {
		return c, err
	}
	if err := price("OutputPrice", &c.OutputPrice); err != nil {
		return c, err
	}
	switch {
	case c.ColdWait == 0:
		c.ColdWait = defaultColdWait
	case c.ColdWait < 0:
		return c, fmt.Errorf("queue config: ColdWait is %v: it must be positive", c.ColdWait)
	}
	switch {
	case c.ColdWaitBackground == 0:
		c.ColdWaitBackground = max(defaultColdWaitBg, c.ColdWait)
	case c.ColdWaitBackground < 0:
		return c, fmt.Errorf("queue config: ColdWaitBackground is %v: it must be positive", c.ColdWaitBackground)
	}
	switch {
	case c.MaxRetryAfter == 0:
		c.MaxRetryAfter = defaultMaxRetryAfter
	case c.MaxRetryAfter < minRetryAfter:
		return c, fmt.Errorf("queue config: MaxRetryAfter is %v: it must be at least %v", c.MaxRetryAfter, minRetryAfter)
	}
	switch {
	case c.IdleTenant == 0:
		c.IdleTenant = defaultIdleTenant
	case c.IdleTenant < 0:
		return c, fmt.Errorf("queue config: IdleTenant is %v: it must be positive", c.IdleTenant)
	}
	switch {
	case c.MaxIdleFlows == 0:
		c.MaxIdleFlows = defaultMaxIdleFlows
	case c.MaxIdleFlows < 0:
		return c, fmt.Errorf("queue config: MaxIdleFlows is %d: it must be positive", c.MaxIdleFlows)
	}
	return c, nil
}

func (d Deployment) validate() error {
	switch {
	case d.Name == "":
		return fmt.Errorf("queue deployment: Name is empty")
	case d.MaxInFlight <= 0:
		return fmt.Errorf("queue deployment %q: MaxInFlight is %d: it must be positive", d.Name, d.MaxInFlight)
	case d.MaxTokens < 0:
		return fmt.Errorf("queue deployment %q: MaxTokens is %d: it must be positive, or 0 for no token cap", d.Name, d.MaxTokens)
	case d.QueueLimit <= 0:
		return fmt.Errorf("queue deployment %q: QueueLimit is %d: it must be positive", d.Name, d.QueueLimit)
	}
	return nil
}

// Outcome is how a request left the scheduler for good.
type Outcome uint8

const (
	// Finished: the engine completed it (reported through Finish).
	Finished Outcome = iota + 1
	// Rejected: turned away, with Status 429 (queue full) or 503 (its
	// deployment did not become ready within ColdWait) and a RetryAfter.
	Rejected
	// Expired: its own Deadline passed while it waited.
	Expired
	// Cancelled: the client went away (reported through Cancel).
	Cancelled
	// Preempted: a streamed request cut off for interactive work; the
	// gateway ends its stream with an error event.
	Preempted
)

func (o Outcome) String() string {
	switch o {
	case Finished:
		return "finished"
	case Rejected:
		return "rejected"
	case Expired:
		return "expired"
	case Cancelled:
		return "cancelled"
	case Preempted:
		return "preempted"
	}
	return fmt.Sprintf("Outcome(%d)", uint8(o))
}

// End reports that a request left the scheduler; its ID is never used again.
type End struct {
	ID      ID
	Outcome Outcome
	// Status is the HTTP status for Rejected (429 or 503), else 0.
	Status int
	// RetryAfter is the client's back-off for Rejected.
	RetryAfter time.Duration
	// WasInFlight: the request was on its engine when it ended (always so
	// for Finished and Preempted); for Cancelled the gateway aborts it there.
	WasInFlight bool
}

// Preemption tells the gateway to cut a background request off its engine.
// A requeued one goes back to the front of its tenant's queue and will be
// dispatched again (re-run transparently); one that is not requeued also
// appears in Output.Ended as Preempted.
type Preemption struct {
	ID       ID
	Requeued bool
}

// Output is what a call asks the gateway to do, in this order: abort the
// preempted requests, then send the dispatched ones to their engines, and
// answer the ended ones. The slices are reused by the next call: copy
// what must outlive it.
type Output struct {
	Preempted  []Preemption
	Dispatched []ID
	Ended      []End
}

func (o *Output) reset() {
	o.Preempted = o.Preempted[:0]
	o.Dispatched = o.Dispatched[:0]
	o.Ended = o.Ended[:0]
}
