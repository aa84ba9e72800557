package rpc

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"connectrpc.com/connect"

	"github.com/gpuplane/gpuplane/cluster"
	"github.com/gpuplane/gpuplane/cluster/raftstore"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// resultError turns a rejected result into a Connect error whose code matches
// the rejection and whose message lists every violation; the violations also
// travel as a Violations error detail so that clients can print them one per
// line. An accepted result gives nil.
func resultError(res *pb.Result) error {
	if res.GetCode() == pb.Code_CODE_OK {
		return nil
	}
	msg := res.GetMessage()
	if vs := res.GetViolations(); len(vs) > 0 {
		parts := make([]string, len(vs))
		for i, v := range vs {
			parts[i] = v.Field + ": " + v.Description
		}
		msg += ": " + strings.Join(parts, "; ")
	}
	err := connect.NewError(connectCode(res.GetCode()), errors.New(msg))
	if len(res.GetViolations()) > 0 {
		if d, derr := connect.NewErrorDetail(&pb.Violations{Violations: res.GetViolations()}); derr == nil {
			err.AddDetail(d)
		}
	}
	return err
}

func connectCode(c pb.Code) connect.Code {
	switch c {
	case pb.Code_CODE_INVALID_ARGUMENT:
		return connect.CodeInvalidArgument
	case pb.Code_CODE_NOT_FOUND:
		return connect.CodeNotFound
	case pb.Code_CODE_ALREADY_EXISTS:
		return connect.CodeAlreadyExists
	case pb.Code_CODE_FAILED_PRECONDITION:
		return connect.CodeFailedPrecondition
	case pb.Code_CODE_CONFLICT:
		return connect.CodeAborted
	}
	return connect.CodeInternal
}

// backendError maps errors from the cluster (not state-machine rejections).
func backendError(op string, err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	switch {
	case errors.As(err, &ce):
		return err
	case errors.Is(err, cluster.ErrPeerAlive):
		return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("%s: %w", op, err))
	case errors.Is(err, cluster.ErrUnknownPeer):
		return connect.NewError(connect.CodeNotFound, fmt.Errorf("%s: %w", op, err))
	case errors.Is(err, raftstore.ErrWritesRefused):
		return connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("%s: %w", op, err))
	case errors.Is(err, cluster.ErrNoLeader), errors.Is(err, cluster.ErrNotLeader), errors.Is(err, cluster.ErrShutdown):
		return connect.NewError(connect.CodeUnavailable, fmt.Errorf("%s: %w", op, err))
	case errors.Is(err, context.DeadlineExceeded):
		return connect.NewError(connect.CodeDeadlineExceeded, fmt.Errorf("%s: %w", op, err))
	case errors.Is(err, context.Canceled):
		return connect.NewError(connect.CodeCanceled, fmt.Errorf("%s: %w", op, err))
	}
	return connect.NewError(connect.CodeUnavailable, fmt.Errorf("%s: %w", op, err))
}

func notFound(format string, args ...any) error {
	return connect.NewError(connect.CodeNotFound, fmt.Errorf(format, args...))
}

func errUnknownLeader(id string) error {
	return fmt.Errorf("leader %q has not registered its API address yet", id)
}
