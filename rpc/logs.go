package rpc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"

	"connectrpc.com/connect"

	"github.com/gpuplane/gpuplane/fsm"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
	"github.com/gpuplane/gpuplane/proto/gpuplane/v1/gpuplanev1connect"
)

// LogReader writes a replica's engine log kept on this node to w, then, with
// follow, what the engine writes next until ctx ends.
type LogReader func(ctx context.Context, model string, replica uint32, follow bool, w io.Writer) error

// logHandlers serves engine logs from this node, or relays them from the node
// that runs the replica.
type logHandlers struct {
	b     Backend
	node  string
	read  LogReader
	peers *http.Client
}

// streamWriter sends what the log reader writes as stream messages.
type streamWriter struct {
	mu     sync.Mutex
	stream *connect.ServerStream[pb.ReplicaLogsResponse]
}

func (w *streamWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for chunk := p; len(chunk) > 0; {
		n := min(len(chunk), 64<<10)
		if err := w.stream.Send(&pb.ReplicaLogsResponse{Data: chunk[:n]}); err != nil {
			return 0, err
		}
		chunk = chunk[n:]
	}
	return len(p), nil
}

func (h *logHandlers) ReplicaLogs(ctx context.Context, req *connect.Request[pb.ReplicaLogsRequest], stream *connect.ServerStream[pb.ReplicaLogsResponse]) error {
	m := req.Msg
	var node, addr string
	err := h.b.Read(ctx, true, func(f *fsm.FSM) error {
		if _, _, ok := f.Model(m.Model); !ok {
			return notFound("deployment %q not found", m.Model)
		}
		for _, r := range f.Replicas(m.Model, "") {
			if r.Index == m.Replica {
				node = r.Node
			}
		}
		if n, ok := f.Node(node); ok {
			addr = n.Address
		}
		return nil
	})
	if err != nil {
		return backendError("logs", err)
	}
	switch {
	case node == "" && h.read == nil:
		return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("replica %s/%d is not placed on any node", m.Model, m.Replica))
	case node == "" || node == h.node:
		// Pending replicas may still have a log here from an earlier run.
		if h.read == nil {
			return connect.NewError(connect.CodeUnimplemented, fmt.Errorf("node %s runs no engines", h.node))
		}
		err := h.read(ctx, m.Model, m.Replica, m.Follow, &streamWriter{stream: stream})
		if err != nil && ctx.Err() == nil {
			return connect.NewError(connect.CodeNotFound, err)
		}
		return nil
	}
	if addr == "" {
		return connect.NewError(connect.CodeUnavailable, fmt.Errorf("node %s runs replica %s/%d but its address is unknown", node, m.Model, m.Replica))
	}
	client := gpuplanev1connect.NewLogServiceClient(h.peers, BaseURL(addr))
	up, err := client.ReplicaLogs(ctx, connect.NewRequest(m))
	if err != nil {
		return err
	}
	defer up.Close()
	for up.Receive() {
		if err := stream.Send(up.Msg()); err != nil {
			return err
		}
	}
	if err := up.Err(); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}
