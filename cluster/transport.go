package cluster

import (
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/gpuplane/gpuplane/cluster/tlsutil"
)

// contactTransport is raft's TCP transport that also records, per server,
// when an AppendEntries call to it last succeeded. Only a leader sends
// AppendEntries, and it sends one at least every HeartbeatTimeout/10 to each
// follower, so on the leader this is each follower's last contact to within
// that interval. Raft itself reports last contact only for the local node.
// Embedding keeps the optional interfaces raft checks for (pre-vote, close).
type contactTransport struct {
	*raft.NetworkTransport

	mu      sync.Mutex
	contact map[raft.ServerID]time.Time
}

// newTransport listens for Raft on bind: over mutual TLS when t is set,
// plain TCP otherwise.
func newTransport(bind, advertise string, t *tlsutil.TLS, logger hclog.Logger) (*contactTransport, error) {
	adv, err := net.ResolveTCPAddr("tcp", advertise)
	if err != nil {
		return nil, fmt.Errorf("raft advertise address %q: %w", advertise, err)
	}
	// Pool of 3 connections per peer, as Consul and Nomad use; 10 s I/O timeout
	// bounds a stuck peer without cutting off a large snapshot install.
	//
	// MaxRPCsInFlight 1: no pipelining. A follower syncs its log once per
	// AppendEntries it gets, and an fdatasync costs CPU whatever it carries;
	// with one request in flight the entries that arrive during a round trip
	// go out together in the next one, so under load there are fewer, larger
	// appends (and syncs) on each follower. With one client it changes
	// nothing (each write is its own round trip anyway). The commit benchmark
	// (bench/cluster) measures it.
	const pool, timeout = 3, 10 * time.Second
	cfg := &raft.NetworkTransportConfig{MaxPool: pool, Timeout: timeout, Logger: logger, MaxRPCsInFlight: 1}
	var nt *raft.NetworkTransport
	if t == nil {
		nt, err = raft.NewTCPTransportWithConfig(bind, adv, cfg)
	} else {
		var stream *tlsutil.StreamLayer
		if stream, err = tlsutil.NewStreamLayer(bind, adv, t); err == nil {
			cfg.Stream = stream
			nt = raft.NewNetworkTransportWithConfig(cfg)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("raft transport on %s: %w", bind, err)
	}
	return &contactTransport{NetworkTransport: nt, contact: map[raft.ServerID]time.Time{}}, nil
}

func (t *contactTransport) AppendEntries(id raft.ServerID, target raft.ServerAddress, args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) error {
	err := t.NetworkTransport.AppendEntries(id, target, args, resp)
	if err == nil {
		t.mu.Lock()
		t.contact[id] = time.Now()
		t.mu.Unlock()
	}
	return err
}

// lastContact returns when id last answered an AppendEntries from this node.
func (t *contactTransport) lastContact(id raft.ServerID) (time.Time, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	at, ok := t.contact[id]
	return at, ok
}
