package executor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

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
// saw when the stream breaks (follow, as Executor.Run does). A report that
// failed (no leader, a loaded server past the report's timeout) is made
// again, with backoff, until it is taken or a newer snapshot replaces the
// one it came from: nothing else would make it again (the node's stream
// sends a snapshot only when something about the node changes), and the
// replica would stay Placed.
func (h *Hollow) Run(ctx context.Context) {
	// Each snapshot is whole: only the latest matters, but a fresh one
	// (the first of a watch) stays fresh until applied.
	type next struct {
		snap  Snapshot
		fresh bool
	}
	latest := make(chan next, 1)
	go follow(ctx, h.src, h.node, h.log, func(snap Snapshot, fresh bool) {
		select {
		case old := <-latest:
			fresh = fresh || old.fresh
		default:
		}
		latest <- next{snap, fresh}
	})
	retry := retryBackoff(hollowRetry, 10*time.Second)
	var snap Snapshot
	var again <-chan time.Time
	for {
		fresh := false
		select {
		case <-ctx.Done():
			return
		case n := <-latest:
			snap, fresh = n.snap, n.fresh
			retry.Reset()
		case <-again:
		}
		again = nil
		if !h.apply(ctx, snap, fresh) {
			again = time.After(retry.NextBackOff())
		}
	}
}

// hollowRetry is the first wait before a failed report is made again.
const hollowRetry = 500 * time.Millisecond

// apply reports Running for every replica of snap not yet reported Running
// at its current generation and cards; false if a report failed. When snap
// is fresh (the first of a watch, read linearizably), a replica whose
// record is not Running is reported again even if it was reported before:
// that report may have been lost while the stream was down. A report the
// cluster rejects (stale) is not made again.
func (h *Hollow) apply(ctx context.Context, snap Snapshot, fresh bool) bool {
	ok := true
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
		if proto.Equal(st, h.reported[k]) {
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, reportTimeout)
		err := h.rep.Report(rctx, st)
		cancel()
		var rejected *Rejected
		if err != nil && !errors.As(err, &rejected) {
			h.log.Info("hollow: report replica status", "replica", k, "err", err)
			ok = false
			continue
		}
		h.reported[k] = st
	}
	for k := range h.reported {
		if !seen[k] {
			delete(h.reported, k)
		}
	}
	return ok
}
