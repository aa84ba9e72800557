package rpc

import (
	"context"
	"errors"
	"net/http"
	"time"

	"connectrpc.com/connect"

	"github.com/gpuplane/gpuplane/cluster"
	"github.com/gpuplane/gpuplane/cluster/audit"
	"github.com/gpuplane/gpuplane/cluster/events"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// LogBackend is what the event and audit services need from a server: its
// own log and the state machine's progress through it. *cluster.Cluster
// implements it; a Backend that does not gets Unimplemented answers.
type LogBackend interface {
	// Server gives the node's log and live state to package audit (an
	// error on client nodes).
	audit.Server
	// Progress returns the applied index and a channel closed when it changes.
	Progress() (uint64, <-chan struct{})
	WaitApplied(ctx context.Context, index uint64) error
	// ServerAddresses maps every Raft server's id to its API address.
	ServerAddresses() (map[string]string, error)
	// Compact drops the log's entries before an index that an archive
	// holds, checking the archive's hash head there.
	Compact(ctx context.Context, before uint64, hash string) (uint64, error)
	// Subscribe follows the server's shared event feed (events.Feed)
	// from an index; events.ErrNotInFeed when the feed no longer holds it.
	Subscribe(from uint64, filter *pb.EventFilter) (*events.Subscription, error)
}

var _ LogBackend = (*cluster.Cluster)(nil)

// eventHandlers serves EventService and AuditService from one node's log.
type eventHandlers struct {
	b LogBackend
	// closing is closed when the server shuts down, ending open streams so
	// that their clients resume elsewhere.
	closing <-chan struct{}
	// peerHTTP carries requests to other servers (verify); nil: verifyHTTP.
	peerHTTP *http.Client
}

// followPoll bounds how long a follow stream waits before it looks at the
// applied index again (it is normally woken as soon as it changes).
const followPoll = time.Second

func (h *eventHandlers) logBackend() (LogBackend, error) {
	if h.b == nil {
		return nil, connect.NewError(connect.CodeUnimplemented, errors.New("this server does not serve its log"))
	}
	return h.b, nil
}

// Watch streams events from the node's applied log: first everything from
// from_index up to the applied index, then, with follow, each entry as it is
// applied. A follower serves it from its own log, so a client may resume on
// any node from the index after its last event.
func (h *eventHandlers) Watch(ctx context.Context, req *connect.Request[pb.WatchRequest], stream *connect.ServerStream[pb.WatchResponse]) error {
	b, err := h.logBackend()
	if err != nil {
		return err
	}
	hist, err := audit.Live(b)
	if err != nil {
		return backendError("watch", err)
	}
	send := func(ev *pb.Event) error { return stream.Send(&pb.WatchResponse{Event: ev}) }
	if req.Msg.GetFollow() {
		// Answer the call now: a client waits for the response headers
		// before it reads, and a filtered stream may have nothing to send
		// for a long time. A client node's executor takes its first
		// snapshot, then opens the stream, and acts on neither until the
		// call returns: without this, replicas placed on it before it
		// connected stayed unstarted until the next event about the node.
		if err := stream.Send(nil); err != nil {
			return err
		}
		sub, err := b.Subscribe(req.Msg.GetFromIndex(), req.Msg.GetFilter())
		switch {
		case err == nil:
			defer sub.Close()
			return h.follow(ctx, sub, send)
		case !errors.Is(err, events.ErrNotInFeed):
			return logError("watch", err)
		}
		// A stream from before what the feed holds replays the log
		// itself, then follows it.
	}
	cur := hist.Cursor(req.Msg.GetFromIndex(), req.Msg.GetFilter())
	poll := time.NewTicker(followPoll)
	defer poll.Stop()
	for {
		applied, advanced := b.Progress()
		if err := cur.Advance(applied, send); err != nil {
			return logError("watch", err)
		}
		if !req.Msg.GetFollow() {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-h.closing:
			return errClosing
		case <-advanced:
		case <-poll.C:
		}
	}
}

var errClosing = connect.NewError(connect.CodeUnavailable, errors.New("server shutting down: resume on another node"))

// follow sends a subscription's events until the client goes, the server
// closes, or the subscription ends: a stream that fell behind the log ends
// with ResourceExhausted naming the index to resume from (every event
// before it was sent), which a client resumes from, on any server.
func (h *eventHandlers) follow(ctx context.Context, sub *events.Subscription, send func(*pb.Event) error) error {
	for _, ev := range sub.Backlog() {
		if err := send(ev); err != nil {
			return err
		}
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-h.closing:
			return errClosing
		case ev, ok := <-sub.C():
			if !ok {
				return logError("watch", sub.Err())
			}
			if err := send(ev); err != nil {
				return err
			}
		}
	}
}

// logError maps errors from reading the log. A send that failed because the
// client went away is returned as it is.
func logError(op string, err error) error {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return err
	}
	switch {
	case errors.Is(err, audit.ErrBeyondLog):
		return connect.NewError(connect.CodeOutOfRange, err)
	case errors.Is(err, cluster.ErrNoLog):
		return connect.NewError(connect.CodeFailedPrecondition, err)
	case errors.Is(err, events.ErrFellBehind):
		return connect.NewError(connect.CodeResourceExhausted, err)
	case errors.Is(err, cluster.ErrShutdown):
		return errClosing
	}
	return backendError(op, err)
}
