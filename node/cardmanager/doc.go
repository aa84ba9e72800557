// Package cardmanager (the per-card manager) runs the residency controllers of one node (docs/residency.md):
// it is the impure side of package residency, whose controller decides and
// never acts.
//
// A Manager keeps one residency.Controller per card that hosts a warm or
// onDemand replica, all driven from a single goroutine with the wall clock.
// It is the executor's Gate: the engines of the warm and onDemand replicas
// it manages start only when their controller loads them, while pinned
// replicas start and run as they always did (the controller only accounts
// for their memory). Its inputs are the replicas placed on the node and the
// engines' transitions (from the executor), the engines' memory on each card
// (NVML, simulated in dev), requests at the fronts, and a tick a second. Its
// outputs are the controllers' actions: a load starts the engine, a sleep or
// a wake goes to the engine's controls (vLLM's sleep mode, which the sim
// engine speaks), an evict or unload stops the engine (the replica stays
// placed, Cold); every residency transition is committed to the Raft log
// with the reason of the decision behind it (Executor.ReportResidency), and
// every decision goes to the node's residency.Journal.
//
// A controller's ledger counts only the engines it loaded. An engine that
// holds memory behind its back (one a restarted agent adopted and the
// Manager stops, one of a replica that left the card while the executor
// stops it) is gone only once its process is: until then every load,
// prewarm or wake on its card waits (awaitCounted), so that what the
// controller decided from its ledger never meets memory still held (I1).
//
// Each managed replica is served at a front (front.go): a reverse proxy on a
// port of its own for as long as the replica is placed here, reported as the
// replica's endpoint. A request at the front is a RequestArrived; it waits
// until its controller holds the model Resident (loading or waking it),
// up to Options.Wait, then goes to the engine.
//
// In advise mode the Manager holds nothing: every replica starts as it
// always did, its front passes requests straight to the engine, and the
// controllers only record what they would do (the journal, the agent's
// log at info level).
//
// The chaos test (chaos_test.go) runs the Manager and executor against real
// sim engines with random requests, engine and agent kill -9 (a new Manager
// and executor on the same data dir) and deployment changes, checking I1/I2
// from the simulated NVML and I3 from its own requests' outcomes. Built with
// the residency_plantbug tag (no I3 guard), it must see I3 violations:
//
//	go test -tags residency_plantbug -count=1 -run TestChaosCatchesThePlantedBug ./node/cardmanager/
package cardmanager
