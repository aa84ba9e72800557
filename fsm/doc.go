// Package fsm is gpuplane's state machine: the single place where the cluster's
// state changes. Every server feeds it the same committed log entries in the
// same order and so reaches the same state, byte for byte.
//
// The package owns the state (nodes, their cards, accelerators), one apply
// function per command, validation that reports every problem at once, typed
// results, deduplication by request id, a hash chain over applied entries,
// and snapshots; applying the log from index 1 to New() rebuilds the state as
// of any log index.
//
// The rules it enforces are the numbered rules of docs/descriptors.md, which
// comments and error messages cite as "rule N"; the residency fields follow
// docs/residency.md.
//
// It must never read the clock, touch the network or the disk, use randomness
// or start goroutines: the same code serves live apply, snapshot restore,
// `audit replay`, `simulate` and tests. Time enters only through the
// envelope's proposed_at, which the leader fills in. FSM values are not safe
// for concurrent use; the cluster package guards them with a lock.
package fsm
