package cluster

import (
	"errors"

	"github.com/gpuplane/gpuplane/cluster/auditrec"
	"github.com/gpuplane/gpuplane/cluster/events"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// ErrNoLog is returned by audit requests to a client node, which keeps no
// Raft log.
var ErrNoLog = errors.New("this node is not a server and keeps no log: ask a server")

// LogFiles returns this server's log and its audit records, read while it
// runs. Callers bound what they read by AppliedIndex: entries after it may
// not be committed yet.
func (c *Cluster) LogFiles() (events.LogFiles, error) {
	if !c.IsServer() {
		return events.LogFiles{}, ErrNoLog
	}
	return events.LogFiles{Log: c.store, Hashes: c.fsm.hashes, SnapshotDir: auditrec.SnapshotsDir(RaftDir(c.cfg.DataDir)), BasePath: c.auditBasePath()}, nil
}

// Subscribe subscribes to this server's shared event feed (events.Feed), starting
// it on first use. It is an error on a client node (ErrNoLog).
func (c *Cluster) Subscribe(from uint64, filter *pb.EventFilter) (*events.Subscription, error) {
	f, err := c.eventFeed()
	if err != nil {
		return nil, err
	}
	return f.Subscribe(from, filter)
}

// eventFeed returns the server's feed, started on first use (and again
// after a failure reading the log, which its subscribers were told).
func (c *Cluster) eventFeed() (*events.Feed, error) {
	c.feedMu.Lock()
	defer c.feedMu.Unlock()
	if c.feedStopped {
		return nil, ErrShutdown
	}
	if c.feed != nil {
		select {
		case <-c.feed.Done():
			c.feed = nil // failed: start again
		default:
			return c.feed, nil
		}
	}
	f, err := events.NewFeed(c, events.DefaultFeedWindow, events.DefaultFeedBuffer)
	if err != nil {
		return nil, err
	}
	c.feed = f
	return f, nil
}

// stopFeed stops the feed before the log it reads is closed.
func (c *Cluster) stopFeed() {
	c.feedMu.Lock()
	f := c.feed
	c.feedStopped = true
	c.feedMu.Unlock()
	if f != nil {
		f.Stop(ErrShutdown)
	}
}
