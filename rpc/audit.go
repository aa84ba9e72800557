package rpc

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"time"

	"connectrpc.com/connect"

	"github.com/gpuplane/gpuplane/cluster/audit"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
	"github.com/gpuplane/gpuplane/proto/gpuplane/v1/gpuplanev1connect"
)

// Log sends the events of the node's applied log that the request selects.
func (h *eventHandlers) Log(ctx context.Context, req *connect.Request[pb.LogRequest], stream *connect.ServerStream[pb.LogResponse]) error {
	b, err := h.logBackend()
	if err != nil {
		return err
	}
	hist, err := audit.Live(b)
	if err != nil {
		return logError("audit log", err)
	}
	applied, _ := b.Progress()
	err = hist.Log(req.Msg, applied, func(ev *pb.Event) error { return stream.Send(&pb.LogResponse{Event: ev}) })
	return logError("audit log", err)
}

// Replay rebuilds the state as of an entry from the node's own log.
func (h *eventHandlers) Replay(ctx context.Context, req *connect.Request[pb.ReplayRequest]) (*connect.Response[pb.ReplayResponse], error) {
	b, err := h.logBackend()
	if err != nil {
		return nil, err
	}
	hist, err := audit.Live(b)
	if err != nil {
		return nil, logError("replay", err)
	}
	applied, _ := b.Progress()
	resp, err := hist.Replay(req.Msg, applied)
	if err != nil {
		return nil, logError("replay", err)
	}
	return connect.NewResponse(resp), nil
}

func (h *eventHandlers) HashAt(ctx context.Context, req *connect.Request[pb.HashAtRequest]) (*connect.Response[pb.HashAtResponse], error) {
	b, err := h.logBackend()
	if err != nil {
		return nil, err
	}
	index, hash, err := audit.HashAt(b, req.Msg.GetIndex())
	if err != nil {
		return nil, connect.NewError(connect.CodeOutOfRange, err)
	}
	return connect.NewResponse(&pb.HashAtResponse{Index: index, Hash: hash}), nil
}

// peerWait bounds how long the verifier waits to apply what a peer has
// applied before comparing with it.
const peerWait = 10 * time.Second

// Verify checks every server of the cluster (or, with local, only this one).
//
// Servers apply entries at slightly different times, so no single index is
// "now" for all of them. Each server first checks itself: it reads its
// applied index, hash head and state together, replays its own log to that
// index and compares (History.Verify). The verifier then waits until it has
// applied the highest index any server reported, and compares each server's
// head with its own recorded head as of that server's index; because the
// verifier has itself just been checked against its replay, agreement means
// the server's live state is what replaying the log gives. Where they differ,
// it bisects over both servers' per-entry records to name the first index
// where they part (the chain covers every entry, so once they differ they
// differ for good).
func (h *eventHandlers) Verify(ctx context.Context, req *connect.Request[pb.VerifyRequest]) (*connect.Response[pb.VerifyResponse], error) {
	b, err := h.logBackend()
	if err != nil {
		return nil, err
	}
	if req.Msg.GetLocal() {
		v, err := audit.VerifyLocal(ctx, b)
		if err != nil {
			return nil, logError("verify", err)
		}
		return connect.NewResponse(verifyResponse([]*pb.ServerVerification{v})), nil
	}
	addrs, err := b.ServerAddresses()
	if err != nil {
		return nil, logError("verify", err)
	}
	ids := make([]string, 0, len(addrs))
	for id := range addrs {
		if id != b.NodeName() {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	type peer struct {
		v        *pb.ServerVerification
		client   gpuplanev1connect.AuditServiceClient
		answered bool
	}
	peers := make([]peer, len(ids))
	highest := uint64(0)
	for i, id := range ids {
		peers[i].v = &pb.ServerVerification{Server: id}
		if addrs[id] == "" {
			peers[i].v.Problems = []string{"server " + id + " has not registered its API address: it cannot be asked"}
			continue
		}
		peers[i].client = gpuplanev1connect.NewAuditServiceClient(h.http(), BaseURL(addrs[id]), connect.WithReadMaxBytes(MaxMessageBytes))
		resp, err := peers[i].client.Verify(ctx, connect.NewRequest(&pb.VerifyRequest{Local: true}))
		if err != nil {
			peers[i].v.Problems = []string{fmt.Sprintf("server %s at %s: %v", id, addrs[id], err)}
			continue
		}
		if len(resp.Msg.GetServers()) != 1 {
			peers[i].v.Problems = []string{fmt.Sprintf("server %s answered %d verifications, want 1", id, len(resp.Msg.GetServers()))}
			continue
		}
		peers[i].v, peers[i].answered = resp.Msg.GetServers()[0], true
		highest = max(highest, peers[i].v.GetAppliedIndex())
	}
	wctx, cancel := context.WithTimeout(ctx, peerWait)
	err = b.WaitApplied(wctx, highest)
	cancel()
	if err != nil {
		return nil, logError("verify", fmt.Errorf("wait to apply index %d that a peer has applied: %w", highest, err))
	}
	self, err := audit.VerifyLocal(ctx, b)
	if err != nil {
		return nil, logError("verify", err)
	}
	all := []*pb.ServerVerification{self}
	for _, p := range peers {
		if p.answered {
			h.compare(ctx, b, self, p.v, p.client)
		}
		all = append(all, p.v)
	}
	return connect.NewResponse(verifyResponse(all)), nil
}

// compare checks peer's head against this server's record as of the same
// index and, where they differ, bisects for the first index where they part.
func (h *eventHandlers) compare(ctx context.Context, b LogBackend, self, peer *pb.ServerVerification, client gpuplanev1connect.AuditServiceClient) {
	fail := func(index uint64, format string, args ...any) {
		peer.Ok = false
		peer.Problems = append(peer.Problems, fmt.Sprintf(format, args...))
		if index != 0 && (peer.FirstDivergence == 0 || index < peer.FirstDivergence) {
			peer.FirstDivergence = index
		}
	}
	_, mine, err := audit.HashAt(b, peer.GetAppliedIndex())
	if err != nil || mine == "" {
		fail(0, "cannot compare with %s at index %d: this server has no record there (%v)", peer.Server, peer.GetAppliedIndex(), err)
		return
	}
	if mine == peer.GetHash() {
		return
	}
	peerAt := func(i uint64) (string, error) {
		resp, err := client.HashAt(ctx, connect.NewRequest(&pb.HashAtRequest{Index: i}))
		if err != nil {
			return "", err
		}
		return resp.Msg.GetHash(), nil
	}
	// Invariant: the two agree as of lo (0: the empty state), differ as of hi.
	lo, hi := uint64(0), peer.GetAppliedIndex()
	exact := true
	for exact && hi-lo > 1 {
		mid := lo + (hi-lo)/2
		_, a, err := audit.HashAt(b, mid)
		if err != nil {
			break
		}
		p, err := peerAt(mid)
		if err != nil {
			fail(0, "bisect with %s: %v", peer.Server, err)
			break
		}
		if a == "" || p == "" {
			exact = false // no record there: the range is all that is known
			break
		}
		if a == p {
			lo = mid
		} else {
			hi = mid
		}
	}
	if !exact {
		fail(hi, "%s parts from %s after index %d, at or before %d: at %d its hash is %s where %s's is %s",
			peer.Server, self.Server, lo, hi, peer.GetAppliedIndex(), peer.GetHash(), self.Server, mine)
		return
	}
	fail(hi, "%s parts from %s at index %d (at %d its hash is %s where %s's is %s)",
		peer.Server, self.Server, hi, peer.GetAppliedIndex(), peer.GetHash(), self.Server, mine)
}

func verifyResponse(servers []*pb.ServerVerification) *pb.VerifyResponse {
	out := &pb.VerifyResponse{Ok: true, Servers: servers}
	for _, v := range servers {
		if !v.GetOk() || len(v.GetProblems()) > 0 {
			out.Ok = false
		}
		if d := v.GetFirstDivergence(); d != 0 && (out.FirstDivergence == 0 || d < out.FirstDivergence) {
			out.FirstDivergence = d
		}
	}
	return out
}

func (h *eventHandlers) http() *http.Client {
	if h.peerHTTP != nil {
		return h.peerHTTP
	}
	return verifyHTTP
}

// verifyHTTP carries the verifier's requests to its peers.
var verifyHTTP = HTTPClient()

// entriesBatch is how many entries one EntriesResponse carries.
const entriesBatch = 256

// Entries streams the node's log entries as stored, for `audit archive`.
func (h *eventHandlers) Entries(ctx context.Context, req *connect.Request[pb.EntriesRequest], stream *connect.ServerStream[pb.EntriesResponse]) error {
	b, err := h.logBackend()
	if err != nil {
		return err
	}
	hist, err := audit.Live(b)
	if err != nil {
		return logError("audit entries", err)
	}
	applied, _ := b.Progress()
	from, to := max(req.Msg.GetFromIndex(), 1), applied
	if t := req.Msg.GetToIndex(); t != 0 {
		if t > applied {
			return logError("audit entries", fmt.Errorf("%w: index %d is beyond the last applied entry, %d", audit.ErrBeyondLog, t, applied))
		}
		to = t
	}
	batch := &pb.EntriesResponse{}
	err = hist.Entries(from, to, func(e *pb.ArchivedEntry) error {
		batch.Entries = append(batch.Entries, e)
		if len(batch.Entries) < entriesBatch {
			return nil
		}
		err := stream.Send(batch)
		batch.Entries = batch.Entries[:0]
		return err
	})
	if err == nil && len(batch.Entries) > 0 {
		err = stream.Send(batch)
	}
	return logError("audit entries", err)
}

// Compact drops the entries before req.before_index from every server's log
// (or, with local, this server's): each checks the archive's hash head
// against its own record first (cluster.Cluster.Compact).
func (h *eventHandlers) Compact(ctx context.Context, req *connect.Request[pb.CompactRequest]) (*connect.Response[pb.CompactResponse], error) {
	b, err := h.logBackend()
	if err != nil {
		return nil, err
	}
	local := func() *pb.ServerCompaction {
		sc := &pb.ServerCompaction{Server: b.NodeName()}
		first, err := b.Compact(ctx, req.Msg.GetBeforeIndex(), req.Msg.GetHash())
		sc.FirstIndex, sc.Ok = first, err == nil
		if err != nil {
			sc.Problem = err.Error()
		}
		return sc
	}
	all := []*pb.ServerCompaction{local()}
	if !req.Msg.GetLocal() {
		addrs, err := b.ServerAddresses()
		if err != nil {
			return nil, logError("compact", err)
		}
		ids := make([]string, 0, len(addrs))
		for id := range addrs {
			if id != b.NodeName() {
				ids = append(ids, id)
			}
		}
		slices.Sort(ids)
		for _, id := range ids {
			sc := &pb.ServerCompaction{Server: id}
			all = append(all, sc)
			if addrs[id] == "" {
				sc.Problem = "server " + id + " has not registered its API address: it cannot be asked"
				continue
			}
			client := gpuplanev1connect.NewAuditServiceClient(h.http(), BaseURL(addrs[id]), connect.WithReadMaxBytes(MaxMessageBytes))
			preq := connect.NewRequest(&pb.CompactRequest{BeforeIndex: req.Msg.GetBeforeIndex(), Hash: req.Msg.GetHash(), Local: true})
			// Each server decides as the operator's token allows: the
			// token travels with the request to every peer.
			if auth := req.Header().Get("Authorization"); auth != "" {
				preq.Header().Set("Authorization", auth)
			}
			resp, err := client.Compact(ctx, preq)
			switch {
			case err != nil:
				sc.Problem = fmt.Sprintf("server %s at %s: %v", id, addrs[id], err)
			case len(resp.Msg.GetServers()) != 1:
				sc.Problem = fmt.Sprintf("server %s answered %d compactions, want 1", id, len(resp.Msg.GetServers()))
			default:
				all[len(all)-1] = resp.Msg.GetServers()[0]
			}
		}
	}
	out := &pb.CompactResponse{Ok: true, Servers: all}
	for _, sc := range all {
		out.Ok = out.Ok && sc.GetOk()
	}
	return connect.NewResponse(out), nil
}
