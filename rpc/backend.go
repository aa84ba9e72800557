package rpc

import (
	"context"

	"github.com/gpuplane/gpuplane/fsm"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// Backend is what the handlers need from the cluster: a way to propose log
// entries, to check them without proposing, and to read the state.
type Backend interface {
	// Apply commits env through the log (forwarding to the leader when
	// needed) and returns the state machine's result.
	Apply(ctx context.Context, env *pb.Envelope) (*pb.Result, error)
	// DryRun reports what applying env would do now, changing nothing.
	DryRun(ctx context.Context, env *pb.Envelope) (*pb.Result, error)
	// Read calls fn with the state; unless stale, the state reflects every
	// write acknowledged before Read was called.
	Read(ctx context.Context, stale bool, fn func(*fsm.FSM) error) error
	// ReadIndex confirms leadership and returns the commit index (leader only).
	ReadIndex(ctx context.Context) (uint64, error)
	// Status reports Raft's view of the cluster from this node.
	Status() *pb.StatusResponse
}
