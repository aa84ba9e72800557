// Package residency decides which models stay on one card (docs/residency.md).
//
// It owns, per card: the memory ledger and its invariants (I1 physical, I2
// promises, I3 active work), checked after every step; the per-replica state
// machine (Cold, Loading, Resident, Draining, Sleeping, Waking, Failed); the
// policy — demand loads, eviction by value, sleep before unload, lending a
// sleeping warm model's share, prewarm from an arrival forecast, minimum
// residency, serializing pairs that keep evicting each other and
// protecting a model from a lower class that keeps displacing it; the
// profiler of load time, wake time, footprint and tokens/s per (model,
// quantization, engine, device); the decision log; and the plan.
//
// The package is pure and must stay so: no I/O, no goroutines, no
// randomness, no imports of other gpuplane packages but the leaf vocabulary
// internal/class (the priority classes it shares with the gateway's queue) and
// internal/cardfit (the residency names the state machine uses),
// and it never reads the
// clock — time comes from the Clock the caller passes (the agent's wall
// clock, or a ManualClock for the serving simulator, which runs hours of
// trace in seconds). The same events at the same times always give the same
// actions. The integrator maps its deployments, replicas and engines onto
// the small types here (ModelID, Deployment, Residency, Priority).
//
// The node drives one Controller per shared card from a single loop:
//
//	c, err := residency.New(residency.Config{Card: "gpu0", Memory: 24 << 30}, clock)
//	out := c.Handle(residency.DeploymentAdded{Deployment: d})
//	out = c.Handle(residency.RequestArrived{Model: "chat"})
//	for _, a := range out.Actions {
//		// execute a.Kind on a.Model's engine; log a.Decision;
//		// report the outcome later: LoadDone, WakeDone, SleepDone, Unloaded,
//		// LoadFailed, EngineCrashed, MemorySample.
//	}
//	for _, v := range out.Violations {
//		// log v (it carries the ledger) and count it; the card is now
//		// pinned-only until ClearViolations.
//	}
//
// What the controller relies on: events arrive in order from one loop; a
// request is reported (RequestArrived) before it is dispatched, and only
// to an engine the controller holds Resident — not Draining — so an
// eviction never races a request onto an engine; actions are executed in
// the order given; after ActReject the waiting requests fail and each is
// reported as RequestFinished; a Sleep or Evict that follows a drain
// deadline cuts in-flight requests off with an explicit error. In Advise
// mode Handle returns no actions, records what it would have done, and
// follows the states the node reports.
//
// The residency_plantbug build tag removes the I3 guard (policy and check)
// so a chaos test can show its independent checker catches it; never ship a
// build with it. DESIGN.md explains the decisions and the scoring.
package residency
