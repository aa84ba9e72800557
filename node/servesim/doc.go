// Package servesim, the serving simulator, is `gpuplane simulate serve`
// (docs/simulate.md): request traces replayed in virtual time on one
// simulated card, under gpuplane's policy and the baselines people use
// today, on the same engines and the same requests.
//
// gpuplane's policy is not re-implemented here: the simulator drives the
// node's own pure cores, node/residency's Controller (with a ManualClock)
// and node/gateway/queue's Scheduler, wired as the agent wires them. It
// lives under node/ because what it simulates is one node's card; the
// cluster placement simulator (cluster/scheduler/placesim) answers a
// different question (where replicas go), and this package imports only
// node packages.
//
// The engine model is the sim engine's (sim.go); the baselines are in
// baselines.go, each with where its behaviour comes from; the trace
// formats in trace.go; the measures in metrics.go. Runs are deterministic:
// no maps are iterated where order matters, randomness comes from PCG
// streams seeded by --seed, and time is virtual.
package servesim
