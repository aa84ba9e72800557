package rpc

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

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
	// batchers gathers the writes forwarded to one base URL (applyBatcher).
	batchers sync.Map // string -> *applyBatcher
}

// Forward proposes env on the leader (or checks it there, for dry runs).
// Writes forwarded to the same node while earlier ones are in flight travel
// together in one ApplyBatch call (see applyBatcher).
func (f *Forwarder) Forward(ctx context.Context, leaderID string, env *pb.Envelope, dryRun bool) (*pb.Result, error) {
	c, base, err := f.clientURL(leaderID)
	if err != nil {
		return nil, err
	}
	if dryRun {
		return forwardOne(ctx, c, env, true)
	}
	b, ok := f.batchers.Load(base)
	if !ok {
		b, _ = f.batchers.LoadOrStore(base, &applyBatcher{c: c})
	}
	return b.(*applyBatcher).apply(ctx, env)
}

// forwardOne sends one envelope with ClusterService.Apply.
func forwardOne(ctx context.Context, c gpuplanev1connect.ClusterServiceClient, env *pb.Envelope, dryRun bool) (*pb.Result, error) {
	resp, err := c.Apply(ctx, connect.NewRequest(&pb.ApplyRequest{Envelope: env, DryRun: dryRun}))
	if err != nil {
		return nil, leaderError(err)
	}
	return resp.Msg.GetResult(), nil
}

// Forwarded writes are batched per destination node. The first write goes
// out at once, alone; writes that arrive while maxBatchCalls calls are in
// flight wait in a queue, and the next call to go out takes the whole queue
// (up to maxBatchEntries envelopes, maxBatchBytes bytes). So a lone write
// pays no delay, and under load the number of calls, HTTP/2 frames and
// handler runs stays at about maxBatchCalls per commit round instead of one
// per write, while the leader proposes each call's entries together.
//
// Two calls in flight let one batch be committing while the next is on its
// way, so the leader's Raft always has entries waiting when it finishes a
// log append.
const (
	maxBatchCalls   = 2
	maxBatchEntries = 256
	maxBatchBytes   = 4 << 20
)

// applyBatcher gathers the writes forwarded to one node.
type applyBatcher struct {
	c gpuplanev1connect.ClusterServiceClient

	mu    sync.Mutex
	queue []*forwardedWrite
	calls int // batch calls in flight, each a goroutine running send
	// singleUntil (unix nanoseconds) is set when the node answered that it
	// has no ApplyBatch (an older version during an upgrade): writes go one
	// by one until then, and batching is tried again after.
	singleUntil atomic.Int64
}

// unbatchedFor is how long writes to a node without ApplyBatch go one by one
// before a batch is tried again (it may have been upgraded meanwhile).
const unbatchedFor = time.Minute

type forwardedWrite struct {
	ctx  context.Context
	env  *pb.Envelope
	done chan forwardOutcome // buffered: the sender never waits on the writer
}

type forwardOutcome struct {
	res *pb.Result
	err error
}

func (b *applyBatcher) apply(ctx context.Context, env *pb.Envelope) (*pb.Result, error) {
	if until := b.singleUntil.Load(); until != 0 && time.Now().UnixNano() < until {
		return forwardOne(ctx, b.c, env, false)
	}
	w := &forwardedWrite{ctx: ctx, env: env, done: make(chan forwardOutcome, 1)}
	b.mu.Lock()
	b.queue = append(b.queue, w)
	start := b.calls < maxBatchCalls
	if start {
		b.calls++
	}
	b.mu.Unlock()
	if start {
		go b.send()
	}
	select {
	case o := <-w.done:
		return o.res, o.err
	case <-ctx.Done():
		// The write may still be sent and commit; the caller retries it
		// with the same request id.
		return nil, ctx.Err()
	}
}

// send makes batch calls until the queue is empty.
func (b *applyBatcher) send() {
	for {
		batch := b.take()
		if batch == nil {
			return
		}
		b.call(batch)
	}
}

// take removes the next batch from the queue, skipping writes whose callers
// have given up; nil (and one call fewer in flight) when the queue is empty.
func (b *applyBatcher) take() []*forwardedWrite {
	b.mu.Lock()
	defer b.mu.Unlock()
	var batch []*forwardedWrite
	size, n := 0, 0
	for _, w := range b.queue {
		if len(batch) == maxBatchEntries {
			break
		}
		if w.ctx.Err() != nil {
			n++
			continue
		}
		sz := proto.Size(w.env)
		if len(batch) > 0 && size+sz > maxBatchBytes {
			break
		}
		size += sz
		batch = append(batch, w)
		n++
	}
	b.queue = b.queue[n:]
	if len(b.queue) == 0 {
		b.queue = nil // let the backing array go
	}
	if len(batch) == 0 {
		b.calls--
		return nil
	}
	return batch
}

// call sends one batch and hands each writer its outcome. The call lasts as
// long as the latest deadline among its writes; a writer whose own deadline
// comes first stops waiting on its own.
func (b *applyBatcher) call(batch []*forwardedWrite) {
	var last time.Time
	req := &pb.ApplyBatchRequest{Envelopes: make([]*pb.Envelope, len(batch))}
	for i, w := range batch {
		req.Envelopes[i] = w.env
		d, ok := w.ctx.Deadline()
		if !ok {
			d = time.Now().Add(MaxUnaryDuration)
		}
		if d.After(last) {
			last = d
		}
	}
	ctx, cancel := context.WithDeadline(context.Background(), last)
	defer cancel()
	resp, err := b.c.ApplyBatch(ctx, connect.NewRequest(req))
	if connect.CodeOf(err) == connect.CodeUnimplemented {
		b.singleUntil.Store(time.Now().Add(unbatchedFor).UnixNano())
		for _, w := range batch {
			go func() {
				res, err := forwardOne(w.ctx, b.c, w.env, false)
				w.done <- forwardOutcome{res, err}
			}()
		}
		return
	}
	if err == nil && len(resp.Msg.GetResults()) != len(batch) {
		err = connect.NewError(connect.CodeInternal, fmt.Errorf("apply batch: %d results for %d envelopes", len(resp.Msg.GetResults()), len(batch)))
	}
	for i, w := range batch {
		if err != nil {
			w.done <- forwardOutcome{err: leaderError(err)}
			continue
		}
		r := resp.Msg.Results[i]
		if e := r.GetError(); e != nil {
			w.done <- forwardOutcome{err: leaderError(connect.NewError(connect.Code(e.GetCode()), errors.New(e.GetMessage())))}
			continue
		}
		w.done <- forwardOutcome{res: r.GetResult()}
	}
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
	c, _, err := f.clientURL(leaderID)
	return c, err
}

// clientURL returns the Connect client for node leaderID and its base URL.
func (f *Forwarder) clientURL(leaderID string) (gpuplanev1connect.ClusterServiceClient, string, error) {
	addr, ok := f.Resolve(leaderID)
	if !ok {
		return nil, "", fmt.Errorf("%w: %w", cluster.ErrNotLeader, errUnknownLeader(leaderID))
	}
	base := BaseURL(addr)
	if c, ok := f.clients.Load(base); ok {
		return c.(gpuplanev1connect.ClusterServiceClient), base, nil
	}
	c := gpuplanev1connect.NewClusterServiceClient(f.HTTP, base, connect.WithSendMaxBytes(MaxMessageBytes))
	f.clients.Store(base, c)
	return c, base, nil
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
