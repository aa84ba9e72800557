package engine

import (
	"time"

	"github.com/gpuplane/gpuplane/internal/engines"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// fallbackStartTimeout bounds the start of a kind with no default (one this
// node does not know, whose command cannot be built anyway).
const fallbackStartTimeout = 15 * time.Minute

// StartTimeout is how long one start of the engine e describes may take to
// become ready: spec.engine.startTimeout when set, else its kind's default
// (engines.Engine.StartTimeout). A start that takes longer has failed: the
// executor stops the engine, reports the replica Failed and frees its
// cards for the next replica.
func StartTimeout(e *pb.EngineSpec) time.Duration {
	if s := e.GetStartTimeoutSeconds(); s > 0 {
		return time.Duration(s) * time.Second
	}
	if r, err := engines.Lookup(e.GetKind()); err == nil {
		return r.StartTimeout
	}
	return fallbackStartTimeout
}

// StartsAlone reports whether an engine of kind must start alone on its
// cards (no other engine starting there meanwhile): one that sizes what it
// takes from the card's free memory at start, so that a neighbour loading
// at the same moment is counted as its own use or takes what it counted as
// free (engines.Engine.StartsAlone). Any other kind starts beside the
// other starts whose shares fit the card with it.
func StartsAlone(kind string) bool {
	r, err := engines.Lookup(kind)
	return err == nil && r.StartsAlone
}
