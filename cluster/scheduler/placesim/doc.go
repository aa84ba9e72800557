// Package placesim, the placement simulator, runs the real scheduler over a
// synthetic cluster and an arrival trace and reports how well each policy
// packs.
//
// It owns the trace formats — the Alibaba openb CSVs (nodes and tasks, the
// trace of the FGD paper) and gpuplane's own YAML nodes and workload files —
// and the packing metrics: arrivals are placed in order with no departures,
// and the share of the cluster's card capacity allocated when the first
// arrival fails is recorded. RunInflated measures as the FGD paper does:
// tasks drawn from the pod list with replacement, seeded, until the arrived
// GPU requests reach a share of capacity (130 %), over several seeds, with
// the unallocated share at 100 % arrived as the headline. Tasks that no node
// could hold even empty are counted apart, never as failures. The CLI's
// `gpuplane simulate` is a thin layer over Load, Run, RunAll, RunInflated
// and the two table writers.
//
// It never changes the scheduler's decisions and never talks to a cluster;
// the only clock it reads is for the wall time of a run.
package placesim
