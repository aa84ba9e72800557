package residency

import "time"

// Clock gives the controller the time. The agent passes one that reads the
// wall clock; the serving simulator and the tests pass a ManualClock, so the
// same code runs hours of trace in seconds.
type Clock interface {
	Now() time.Time
}

// ManualClock is a Clock that moves only when told to: virtual time.
type ManualClock struct{ t time.Time }

// NewManualClock returns a clock standing at t.
func NewManualClock(t time.Time) *ManualClock { return &ManualClock{t: t} }

// Now returns the clock's time.
func (m *ManualClock) Now() time.Time { return m.t }

// Advance moves the clock forward by d (a negative d is ignored: time never
// runs backwards).
func (m *ManualClock) Advance(d time.Duration) {
	if d > 0 {
		m.t = m.t.Add(d)
	}
}

// Set moves the clock to t if t is later.
func (m *ManualClock) Set(t time.Time) {
	if t.After(m.t) {
		m.t = t
	}
}

// Event is an input to the controller. The integrator reports what happened
// on the node; Handle answers with what to do next.
type Event interface{ isEvent() }

// RequestArrived: a request for Model reached the node (queued or
// dispatched).
type RequestArrived struct{ Model ModelID }

// RequestFinished: a request for Model ended (answered, failed, cut off or
// rejected). Tokens and Elapsed, when known, feed the tokens/s profile.
// Answered is true when the request was answered (not rejected, failed
// or cut off): a best-effort model's share of answered requests sizes its
// turns (besteffort.go).
type RequestFinished struct {
	Model    ModelID
	Tokens   int64
	Elapsed  time.Duration
	Answered bool
}

// RequestsActive resets Model's count of requests queued or in flight, for
// an integrator that counts them itself (the gateway's queues).
type RequestsActive struct {
	Model  ModelID
	Active int
}

// LoadDone: a Load, Prewarm or Wake's cold-load path finished; the engine
// serves.
type LoadDone struct{ Model ModelID }

// LoadFailed: a load or wake failed.
type LoadFailed struct {
	Model ModelID
	Err   string
}

// WakeDone: a Wake finished.
type WakeDone struct{ Model ModelID }

// SleepDone: a Sleep finished; the engine holds its residual.
type SleepDone struct {
	Model ModelID
	// Residual is what the engine keeps on the card asleep, as the node
	// measured it when the sleep completed (NVML per process, the
	// simulator's engine), when Measured; otherwise the card's next
	// memory sample says it.
	Residual int64
	Measured bool
}

// Unloaded: an Evict or Unload finished; the engine holds nothing.
type Unloaded struct{ Model ModelID }

// MemorySample: the engine of Model holds Bytes on the card (simulated or
// real NVML, per process).
type MemorySample struct {
	Model ModelID
	Bytes int64
}

// EngineCrashed: the engine of Model exited unexpectedly; its memory is
// free and its in-flight requests are lost (the integrator reports each as
// RequestFinished).
type EngineCrashed struct{ Model ModelID }

// DeploymentAdded: a replica was placed on this card.
type DeploymentAdded struct{ Deployment Deployment }

// DeploymentChanged: a deployment's residency, priority or figures changed.
type DeploymentChanged struct{ Deployment Deployment }

// DeploymentRemoved: the replica leaves this card.
type DeploymentRemoved struct{ Model ModelID }

// Tick lets time-based decisions happen (idle demotion, prewarm, drain
// deadlines, retries). The agent sends one a second.
type Tick struct{}

// ClearViolations: the operator cleared the card's pinned-only fallback.
type ClearViolations struct{}

func (RequestArrived) isEvent()    {}
func (RequestFinished) isEvent()   {}
func (RequestsActive) isEvent()    {}
func (LoadDone) isEvent()          {}
func (LoadFailed) isEvent()        {}
func (WakeDone) isEvent()          {}
func (SleepDone) isEvent()         {}
func (Unloaded) isEvent()          {}
func (MemorySample) isEvent()      {}
func (EngineCrashed) isEvent()     {}
func (DeploymentAdded) isEvent()   {}
func (DeploymentChanged) isEvent() {}
func (DeploymentRemoved) isEvent() {}
func (Tick) isEvent()              {}
func (ClearViolations) isEvent()   {}
