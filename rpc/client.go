package rpc

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
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
// its own API). With tlsConf (tlsutil.TLS.PeerClientConfig: this node's
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
	// streams carries the writes forwarded to each base URL (forwardStream).
	streams sync.Map // string -> *forwardStream
}

// Forward has the leader apply env, check it (dry runs) or propose it
// (check, then apply unless refused or unchanged). Writes go over a stream
// per node, in batches (see forwardStream); checks and proposals, which
// users make one at a time, in one ClusterService.Apply call each.
func (f *Forwarder) Forward(ctx context.Context, leaderID string, env *pb.Envelope, mode cluster.ForwardMode) (*pb.Result, error) {
	c, base, err := f.clientURL(leaderID)
	if err != nil {
		return nil, err
	}
	switch mode {
	case cluster.ForwardDryRun:
		return forwardOne(ctx, c, &pb.ApplyRequest{Envelope: env, DryRun: true})
	case cluster.ForwardPropose:
		return forwardOne(ctx, c, &pb.ApplyRequest{Envelope: env, UnlessUnchanged: true})
	}
	st, ok := f.streams.Load(base)
	if !ok {
		st, _ = f.streams.LoadOrStore(base, &forwardStream{c: c})
	}
	return st.(*forwardStream).apply(ctx, env)
}

// forwardOne sends one envelope with ClusterService.Apply.
func forwardOne(ctx context.Context, c gpuplanev1connect.ClusterServiceClient, req *pb.ApplyRequest) (*pb.Result, error) {
	resp, err := c.Apply(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, leaderError(err)
	}
	return resp.Msg.GetResult(), nil
}

// Forwarded writes travel to each node over one ClusterService.Forward
// stream (forwardStream), opened at the first write and kept while writes
// flow. A write is sent at once unless a batch is being sent or
// maxInFlight batches await their answers; the writes that arrive meanwhile
// go together in the next message (up to maxBatchEntries envelopes,
// maxBatchBytes bytes), sent as soon as a batch is answered. The answers
// come back on the same stream as each batch commits. A forwarded write
// costs one stream message, not one call (HTTP/2 headers, a handler
// goroutine on each side), and under load the leader's Raft gets the
// forwarded writes in batches it proposes together.
//
// Why a bound at all: a stream message costs a write system call and a
// wakeup on each node, whatever it carries. Unbounded, a busy follower sent
// nearly one message per write (sending takes microseconds, a commit
// milliseconds); two in flight keep the leader's pipeline fed (one batch
// commits while the next is proposed) and let the writes that arrive
// during a commit go as one message, so each node spends less CPU per write
// (the commit benchmark, bench/cluster). A single write never waits: with nothing
// in flight it is sent at once.
const (
	// maxInFlight is the most batches a stream has sent and not yet had
	// answered.
	maxInFlight     = 2
	maxBatchEntries = 256
	maxBatchBytes   = 4 << 20
	// streamIdle closes a stream that carried nothing for this long.
	streamIdle = 30 * time.Second
	// unbatchedFor is how long writes to a node without Forward (an older
	// version, during an upgrade) go one by one, as Apply calls, before a
	// stream is tried again (it may have been upgraded meanwhile).
	unbatchedFor = time.Minute
)

// forwardStream carries the writes forwarded to one node.
type forwardStream struct {
	c gpuplanev1connect.ClusterServiceClient

	mu      sync.Mutex
	queue   []*forwardedWrite
	sending bool        // a goroutine runs send
	conn    *streamConn // nil: the next batch opens a stream
	// singleUntil (unix nanoseconds) is set when the node has no Forward.
	singleUntil atomic.Int64
}

// streamConn is one open Forward stream and the batches awaiting answers.
type streamConn struct {
	stream  *connect.BidiStreamForClient[pb.ForwardRequest, pb.ForwardResponse]
	cancel  context.CancelFunc
	pending map[uint64][]*forwardedWrite // guarded by forwardStream.mu
	next    uint64                       // the next batch's number
	idle    *time.Timer                  // closes the stream when nothing flows
}

type forwardedWrite struct {
	ctx  context.Context
	env  *pb.Envelope
	done chan forwardOutcome // buffered: the stream never waits on the writer
}

type forwardOutcome struct {
	res *pb.Result
	err error
}

func (s *forwardStream) apply(ctx context.Context, env *pb.Envelope) (*pb.Result, error) {
	if until := s.singleUntil.Load(); until != 0 && time.Now().UnixNano() < until {
		return forwardOne(ctx, s.c, &pb.ApplyRequest{Envelope: env})
	}
	w := &forwardedWrite{ctx: ctx, env: env, done: make(chan forwardOutcome, 1)}
	s.mu.Lock()
	s.queue = append(s.queue, w)
	start := s.startSendLocked()
	s.mu.Unlock()
	if start {
		go s.send()
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

// startSendLocked reports whether the caller must start send: writes wait
// and no send runs (it stopped at an empty queue or at maxInFlight). It
// marks one as running. The caller holds s.mu.
func (s *forwardStream) startSendLocked() bool {
	if len(s.queue) == 0 || s.sending {
		return false
	}
	s.sending = true
	return true
}

// send sends batches until the queue is empty or maxInFlight batches await
// their answers.
func (s *forwardStream) send() {
	for {
		s.mu.Lock()
		if s.conn != nil && len(s.conn.pending) >= maxInFlight {
			s.sending = false
			s.mu.Unlock()
			return
		}
		batch := s.take()
		if len(batch) == 0 {
			s.sending = false
			s.mu.Unlock()
			return
		}
		conn := s.conn
		if conn == nil {
			conn = s.open()
		}
		id := conn.next
		conn.next++
		conn.pending[id] = batch
		conn.idle.Stop()
		s.mu.Unlock()

		req := &pb.ForwardRequest{Batch: id, Envelopes: make([]*pb.Envelope, len(batch)), TimeoutMs: timeoutMs(batch)}
		for i, w := range batch {
			req.Envelopes[i] = w.env
		}
		if err := conn.stream.Send(req); err != nil {
			// An error that wraps io.EOF means the node answered the
			// stream with an error, which receive reads and hands to the
			// writers; for any other, end the stream here.
			if !errors.Is(err, io.EOF) {
				s.fail(conn, err)
			} else {
				s.detach(conn)
			}
		}
	}
}

// take removes the next batch from the queue, skipping writes whose callers
// have given up. The caller holds s.mu.
func (s *forwardStream) take() []*forwardedWrite {
	var batch []*forwardedWrite
	size, n := 0, 0
	for _, w := range s.queue {
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
	s.queue = s.queue[n:]
	if len(s.queue) == 0 {
		s.queue = nil // let the backing array go
	}
	return batch
}

// timeoutMs is how long the node may work on a batch: until the latest
// deadline among its writers.
func timeoutMs(batch []*forwardedWrite) uint32 {
	var last time.Time
	for _, w := range batch {
		d, ok := w.ctx.Deadline()
		if !ok {
			d = time.Now().Add(MaxUnaryDuration)
		}
		if d.After(last) {
			last = d
		}
	}
	return uint32(max(time.Until(last).Milliseconds(), 1))
}

// open starts a stream and the goroutine that reads its answers. The caller
// holds s.mu.
func (s *forwardStream) open() *streamConn {
	ctx, cancel := context.WithCancel(context.Background())
	conn := &streamConn{stream: s.c.Forward(ctx), cancel: cancel, pending: map[uint64][]*forwardedWrite{}}
	conn.idle = time.AfterFunc(streamIdle, func() { s.closeIdle(conn) })
	conn.idle.Stop()
	s.conn = conn
	go s.receive(conn)
	return conn
}

// receive hands each batch's answers to its writers until the stream ends.
func (s *forwardStream) receive(conn *streamConn) {
	for {
		resp, err := conn.stream.Receive()
		if err != nil {
			s.fail(conn, err)
			return
		}
		s.mu.Lock()
		batch, ok := conn.pending[resp.GetBatch()]
		delete(conn.pending, resp.GetBatch())
		if len(conn.pending) == 0 && s.conn == conn {
			conn.idle.Reset(streamIdle)
		}
		start := s.startSendLocked()
		s.mu.Unlock()
		if start {
			go s.send()
		}
		if !ok {
			continue
		}
		results := resp.GetResults()
		for i, w := range batch {
			if len(results) != len(batch) {
				w.done <- forwardOutcome{err: leaderError(connect.NewError(connect.CodeInternal,
					fmt.Errorf("forward: %d results for a batch of %d", len(results), len(batch))))}
				continue
			}
			w.done <- outcomeOf(results[i])
		}
	}
}

func outcomeOf(r *pb.ForwardResult) forwardOutcome {
	if e := r.GetError(); e != nil {
		return forwardOutcome{err: leaderError(connect.NewError(connect.Code(e.GetCode()), errors.New(e.GetMessage())))}
	}
	return forwardOutcome{res: r.GetResult()}
}

// detach makes the next batch open a new stream.
func (s *forwardStream) detach(conn *streamConn) {
	s.mu.Lock()
	if s.conn == conn {
		s.conn = nil
	}
	s.mu.Unlock()
}

// fail ends a stream and answers every write still waiting on it with err,
// which is retryable when the stream broke (the node went away or stepped
// down: Unavailable). The writes may have committed; their retries carry the
// same request ids. A node without Forward gets them one by one instead.
func (s *forwardStream) fail(conn *streamConn, err error) {
	s.mu.Lock()
	if s.conn == conn {
		s.conn = nil
	}
	pending := conn.pending
	conn.pending = map[uint64][]*forwardedWrite{}
	conn.idle.Stop()
	start := s.startSendLocked()
	s.mu.Unlock()
	if start {
		go s.send()
	}
	conn.cancel()
	unimplemented := connect.CodeOf(err) == connect.CodeUnimplemented
	if unimplemented {
		s.singleUntil.Store(time.Now().Add(unbatchedFor).UnixNano())
	}
	if errors.Is(err, io.EOF) {
		err = connect.NewError(connect.CodeUnavailable, errors.New("forward stream ended"))
	}
	for _, batch := range pending {
		for _, w := range batch {
			if unimplemented {
				go func() {
					res, err := forwardOne(w.ctx, s.c, &pb.ApplyRequest{Envelope: w.env})
					w.done <- forwardOutcome{res, err}
				}()
				continue
			}
			w.done <- forwardOutcome{err: leaderError(err)}
		}
	}
}

// closeIdle closes a stream that carried nothing for streamIdle.
func (s *forwardStream) closeIdle(conn *streamConn) {
	s.mu.Lock()
	if s.conn != conn || len(conn.pending) > 0 {
		s.mu.Unlock()
		return
	}
	s.conn = nil
	s.mu.Unlock()
	// The node answers the close by ending the stream; receive then ends.
	_ = conn.stream.CloseRequest()
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
