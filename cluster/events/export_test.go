package events

// The feed's tests build their logs with cluster.Plan, so they live in
// package events_test (cluster imports events).

var ReplicasEqual = replicasEqual

// FeedPos is the next index f reads.
func FeedPos(f *Feed) uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.pos
}
