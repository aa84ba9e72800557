package executor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"

	"google.golang.org/protobuf/proto"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// Hollow is an executor whose engines are hollow, as kubemark's hollow
// kubelet and nomad-nodesim's simulated clients are: it watches the same
// Source and reports through the same Reporter as Executor, but starts no
// process. A replica placed on its node is reported Running (Resident, its
// memory taken at once) with an endpoint that serves nothing; one that
// leaves the node is forgotten. It exists to load a control plane with
// many client nodes on one machine (`gpuplane agent --hollow N`, `make
// bench-fleet`): everything between the log and the executor (the node's
// event stream, its snapshots, its reports through the log) is the real
// path; only the engine is missing.
type Hollow struct {
	src  Source
	rep  Reporter
	node string
	host string
	log  *slog.Logger
	// reported is the last status reported per replica: a replica is
	// reported again only when its generation or placement changes.
	reported map[key]*pb.ReplicaStatus
}

// NewHollow returns a hollow executor for node; advertiseHost is the host
// of the endpoints it reports (default 127.0.0.1).
func NewHollow(src Source, rep Reporter, node, advertiseHost string, logger *slog.Logger) *Hollow {
	if advertiseHost == "" {
		advertiseHost = "127.0.0.1"
	}
	if logger == nil {
		logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return &Hollow{src: src, rep: rep, node: node, host: advertiseHost, log: logger, reported: map[key]*pb.ReplicaStatus{}}
}

// Run watches the Source until ctx ends, resuming after the last index it
// saw when the stream breaks (follow, as Executor.Run does).
func (h *Hollow) Run(ctx context.Context) {
	follow(ctx, h.src, h.node, h.log, func(snap Snapshot, fresh bool) bool { return h.apply(ctx, snap, fresh) })
}

// apply reports Running for every replica of snap not yet reported Running
// at its current generation and cards. When snap is fresh (the first of a
// watch, read linearizably), a replica whose record differs is reported
// again even if it was reported before: that report may have been lost. It
// returns whether a report did not get through (follow calls it again
// later); the reports after a failed one wait for that next call.
func (h *Hollow) apply(ctx context.Context, snap Snapshot, fresh bool) (again bool) {
	seen := map[key]bool{}
	for _, d := range snap.Replicas {
		r := d.Replica
		if r.GetNode() != h.node || len(r.GetCards()) == 0 || d.Spec == nil {
			continue
		}
		k := key{r.GetModel(), r.GetIndex()}
		seen[k] = true
		st := &pb.ReplicaStatus{
			Model: k.model, Replica: k.index, Generation: r.GetGeneration(), Node: h.node,
			State:    pb.ReplicaState_REPLICA_STATE_RUNNING,
			Endpoint: fmt.Sprintf("http://%s:0/hollow/%s/%d", h.host, k.model, k.index),
		}
		st.Residency, st.ResidencyReason = engineResidency(st.State, "")
		if r.GetState() == pb.ReplicaState_REPLICA_STATE_RUNNING && r.GetEndpoint() == st.Endpoint {
			h.reported[k] = st
			continue
		}
		if fresh {
			delete(h.reported, k)
		}
		if again || proto.Equal(st, h.reported[k]) {
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, reportTimeout)
		err := h.rep.Report(rctx, st)
		cancel()
		var rejected *Rejected
		if err != nil && !errors.As(err, &rejected) {
			h.log.Info("hollow: report replica status", "replica", k, "err", err)
			again = true
			continue
		}
		h.reported[k] = st
	}
	for k := range h.reported {
		if !seen[k] {
			delete(h.reported, k)
		}
	}
	return again
}
