// Package scheduler decides which replica goes on which card.
//
// It owns placement: given a view of the cluster (nodes, their cards and what
// is already on them, the accelerators) and replicas to place, it returns a
// Decision per replica — a node and cards, or a reason that names the numbers
// (docs/descriptors.md rule 12). It also owns Check, an independent test of docs/descriptors.md rule 11 over
// a whole view, which the simulator and the tests run after every plan (the
// state machine enforces the rule on its own when it applies a placement).
//
// The package is pure and must stay so: it never reads the clock, never uses
// the network, never starts goroutines, never draws random numbers and never
// imports other gpuplane packages. The same inputs always give the same
// decisions, so a plan can be replayed and tested. The cluster's placer
// (cluster/placer.go) adapts the fsm's state to the plain types defined here
// (Node, Card, Accelerator, Request).
//
// Usage:
//
//	st, err := scheduler.NewState(nodes, accelerators)
//	if err != nil { ... }
//	for _, d := range st.Plan(pending, scheduler.PolicyDefault) {
//		if !d.Placed() {
//			log.Printf("%s pending: %s", d.Replica, d.Reason)
//		}
//	}
//
// Policies (see DESIGN.md for why the default is what it is, and
// bench/scheduler's packing benchmark for how it packs the openb pod lists): PolicyBestFit,
// PolicySpread, PolicyFGD and PolicyDefault ("gpuplane").
package scheduler
