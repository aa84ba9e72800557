package rpc

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"strings"
	"sync"
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

// PeerHTTPClient returns the client a node uses to call other nodes (and
// its own API). With tlsConf (cluster.TLS.PeerClientConfig: this node's
// certificate, the cluster's CA) it speaks HTTP/2 over TLS and sends every
// request over TLS, even one built with an http:// URL (BaseURL's), so that
// no path between nodes can fall back to plaintext. With agentToken it
// also sends the agent token and the node's name, which a server with ACLs
// on accepts as node traffic (see NodeHeader).
func PeerHTTPClient(tlsConf *tls.Config, node, agentToken string) *http.Client {
	c := HTTPClient()
	if tlsConf != nil {
		protocols := new(http.Protocols)
		protocols.SetHTTP1(true)
		protocols.SetHTTP2(true)
		c.Transport = &http.Transport{
			Protocols:           protocols,
			TLSClientConfig:     tlsConf,
			TLSHandshakeTimeout: 10 * time.Second,
			MaxIdleConnsPerHost: 64,
			IdleConnTimeout:     90 * time.Second,
			HTTP2:               &http.HTTP2Config{PingTimeout: 10 * time.Second, SendPingTimeout: 10 * time.Second},
		}
	}
	c.Transport = peerTransport{next: c.Transport, tls: tlsConf != nil, node: node, token: agentToken}
	return c
}

// NodeHeader names the calling node on requests authenticated by the agent
// token (a certificate names its node itself).
const NodeHeader = "Gpuplane-Node"

// peerTransport upgrades http:// requests to https:// when TLS is on and
// adds the agent's credentials to requests that carry none.
type peerTransport struct {
	next        http.RoundTripper
	tls         bool
	node, token string
}

func (t peerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	if t.tls && req.URL.Scheme == "http" {
		req.URL.Scheme = "https"
	}
	if t.token != "" && req.Header.Get("Authorization") == "" {
		req.Header.Set("Authorization", "Bearer "+t.token)
		req.Header.Set(NodeHeader, t.node)
	}
	return t.next.RoundTrip(req)
}

// BaseURL turns host:port into the API's base URL; a full URL is kept.
func BaseURL(addr string) string {
	if strings.Contains(addr, "://") {
		return strings.TrimRight(addr, "/")
	}
	return "http://" + addr
}

// Forwarder sends requests from one node to another's API: writes and read
// indexes from a follower to the leader, every request from a client node to
// a server, and the leader's fetch of a node's inventory.
type Forwarder struct {
	// Resolve returns the API address (host:port) of a server by Raft id.
	Resolve func(id string) (string, bool)
	HTTP    *http.Client

	// clients caches one Connect client per base URL: building one per
	// forwarded request showed in the commit benchmark's profile.
	clients sync.Map // string -> gpuplanev1connect.ClusterServiceClient
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

// ReadState fetches a server's state, for a read on a client node.
func (f *Forwarder) ReadState(ctx context.Context, serverID string, stale bool) ([]byte, error) {
	c, err := f.client(serverID)
	if err != nil {
		return nil, err
	}
	resp, err := c.ReadState(ctx, connect.NewRequest(&pb.ReadStateRequest{Stale: stale}))
	if err != nil {
		return nil, leaderError(err)
	}
	return resp.Msg.GetState(), nil
}

// Status fetches a node's Raft status.
func (f *Forwarder) Status(ctx context.Context, id string) (*pb.StatusResponse, error) {
	c, err := f.client(id)
	if err != nil {
		return nil, err
	}
	resp, err := c.Status(ctx, connect.NewRequest(&pb.StatusRequest{}))
	if err != nil {
		return nil, leaderError(err)
	}
	return resp.Msg, nil
}

// RemovePeer asks the leader to remove a server from Raft. Only an
// unreachable leader is retried: a refusal (the server is alive, or not a
// server) is final.
func (f *Forwarder) RemovePeer(ctx context.Context, leaderID, name string) error {
	c, err := f.client(leaderID)
	if err != nil {
		return err
	}
	if _, err := c.RemovePeer(ctx, connect.NewRequest(&pb.RemovePeerRequest{Name: name})); err != nil {
		if connect.CodeOf(err) == connect.CodeUnavailable {
			return fmt.Errorf("%w: %w", cluster.ErrNotLeader, err)
		}
		return err
	}
	return nil
}

// LocalNode fetches a node's description of itself.
func (f *Forwarder) LocalNode(ctx context.Context, id string) (*pb.Node, error) {
	c, err := f.client(id)
	if err != nil {
		return nil, err
	}
	resp, err := c.LocalNode(ctx, connect.NewRequest(&pb.LocalNodeRequest{}))
	if err != nil {
		return nil, err
	}
	return resp.Msg.GetNode(), nil
}

func (f *Forwarder) client(leaderID string) (gpuplanev1connect.ClusterServiceClient, error) {
	addr, ok := f.Resolve(leaderID)
	if !ok {
		return nil, fmt.Errorf("%w: %w", cluster.ErrNotLeader, errUnknownLeader(leaderID))
	}
	base := BaseURL(addr)
	if c, ok := f.clients.Load(base); ok {
		return c.(gpuplanev1connect.ClusterServiceClient), nil
	}
	c := gpuplanev1connect.NewClusterServiceClient(f.HTTP, base, connect.WithSendMaxBytes(MaxMessageBytes))
	f.clients.Store(base, c)
	return c, nil
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
