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
	// Propose applies env unless a check finds it refused or changing
	// nothing; then it returns the check's result (Index 0) and the log
	// gets no entry (cluster.Cluster.Propose).
	Propose(ctx context.Context, env *pb.Envelope) (*pb.Result, error)
	// Read calls fn with the state; unless stale, the state reflects every
	// write acknowledged before Read was called.
	Read(ctx context.Context, stale bool, fn func(*fsm.FSM) error) error
	// ReadIndex confirms leadership and returns the commit index (leader only).
	ReadIndex(ctx context.Context) (uint64, error)
	// ClusterStatus reports Raft's view of the cluster: this server's, or on
	// a client node a server's.
	ClusterStatus(ctx context.Context) (*pb.StatusResponse, error)
	// ReadState returns the whole state as snapshot bytes and its applied
	// index, read as Read reads (for client nodes).
	ReadState(ctx context.Context, stale bool) ([]byte, uint64, error)
	// ReadNode reads the replicas placed on a node with their specs, as
	// Read reads; with stale and minIndex, once minIndex is applied.
	ReadNode(ctx context.Context, node string, stale bool, minIndex uint64) (*pb.ReadNodeResponse, error)
	// Members lists the nodes gossip knows with their Raft suffrage.
	Members(ctx context.Context) ([]*pb.Member, error)
	// LocalNode is this node's description of itself, inventory included.
	LocalNode() *pb.Node
	// Join joins the gossip of the given addresses; it returns how many answered.
	Join(ctx context.Context, addrs []string) (int, error)
	// Leave leaves the cluster gracefully; the agent then stops.
	Leave(ctx context.Context) error
	// RemovePeer removes a dead server from Raft.
	RemovePeer(ctx context.Context, name string) error
}
