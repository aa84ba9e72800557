package rpc

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/gpuplane/gpuplane/cluster"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
	"github.com/gpuplane/gpuplane/proto/gpuplane/v1/gpuplanev1connect"
)

// HTTPClient returns an HTTP client that speaks h2c to gpuplane servers, so
// that many concurrent requests share one connection.
func HTTPClient() *http.Client {
	protocols := new(http.Protocols)
	protocols.SetUnencryptedHTTP2(true)
	return &http.Client{Transport: &http.Transport{
		Protocols:           protocols,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
		HTTP2:               &http.HTTP2Config{PingTimeout: 10 * time.Second, SendPingTimeout: 10 * time.Second},
	}}
}

// BaseURL turns host:port into the API's base URL; a full URL is kept.
func BaseURL(addr string) string {
	if strings.Contains(addr, "://") {
		return strings.TrimRight(addr, "/")
	}
	return "http://" + addr
}

// Forwarder sends writes from a follower to the leader's API.
type Forwarder struct {
	// Resolve returns the API address (host:port) of a server by Raft id.
	Resolve func(id string) (string, bool)
	HTTP    *http.Client
}

// Forward proposes env on the leader (or checks it there, for dry runs).
func (f *Forwarder) Forward(ctx context.Context, leaderID string, env *pb.Envelope, dryRun bool) (*pb.Result, error) {
	c, err := f.client(leaderID)
	if err != nil {
		return nil, err
	}
	resp, err := c.Apply(ctx, connect.NewRequest(&pb.ApplyRequest{Envelope: env, DryRun: dryRun}))
	if err != nil {
		return nil, leaderError(err)
	}
	return resp.Msg.GetResult(), nil
}

// ReadIndex asks the leader for its commit index, for a linearizable read on
// a follower.
func (f *Forwarder) ReadIndex(ctx context.Context, leaderID string) (uint64, error) {
	c, err := f.client(leaderID)
	if err != nil {
		return 0, err
	}
	resp, err := c.ReadIndex(ctx, connect.NewRequest(&pb.ReadIndexRequest{}))
	if err != nil {
		return 0, leaderError(err)
	}
	return resp.Msg.GetIndex(), nil
}

func (f *Forwarder) client(leaderID string) (gpuplanev1connect.ClusterServiceClient, error) {
	addr, ok := f.Resolve(leaderID)
	if !ok {
		return nil, fmt.Errorf("%w: %w", cluster.ErrNotLeader, errUnknownLeader(leaderID))
	}
	return gpuplanev1connect.NewClusterServiceClient(f.HTTP, BaseURL(addr), connect.WithSendMaxBytes(MaxMessageBytes)), nil
}

// leaderError marks errors that mean "ask again, perhaps another leader" so
// that the cluster retries them: the leader was unreachable or has stepped down.
func leaderError(err error) error {
	switch connect.CodeOf(err) {
	case connect.CodeUnavailable, connect.CodeFailedPrecondition:
		return fmt.Errorf("%w: %w", cluster.ErrNotLeader, err)
	}
	return err
}
