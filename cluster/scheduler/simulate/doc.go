// Package simulate runs the real scheduler over a synthetic cluster and an
// arrival trace and reports how well each policy packs.
//
// It owns the trace formats — the Alibaba openb CSVs (nodes and tasks, the
// trace of the FGD paper) and gpuplane's own YAML nodes and workload files —
// and the packing metric: arrivals are placed in order with no departures,
// and the share of the cluster's card capacity allocated when the first
// arrival fails is recorded. The CLI's `gpuplane simulate` is a thin layer
// over Load, Run, RunAll and WriteTable.
//
// It never changes the scheduler's decisions and never talks to a cluster;
// the only clock it reads is for the wall time of a run.
package simulate
