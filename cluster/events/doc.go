// Package events turns a server's Raft log into events: what each committed
// entry did, with its result, the state's hash head after it, and the
// resources it concerns (docs/audit.md, EventService).
//
// It owns: the log as audit and events read it (LogFiles, LogReader,
// LogRanger), the Cursor, which replays the log from index 1 (or a
// compacted log's audit base) through fsm.ApplyBytes into a private state
// machine and yields the events from an index on, and the Feed, a server's
// one replay shared by all its followed event streams, each with a bounded
// buffer. It reaches the server only through the Server interface
// (*cluster.Cluster: its log files and its applied index); package cluster
// starts a server's Feed on first use and stops it before closing the log.
//
// It must never write to a log, never change state except by replaying
// entries through fsm.ApplyBytes (it decodes entries a second time only to
// describe and filter them), and never skip an event: a stream that falls
// behind is cut off naming the index to resume from.
//
// Where things are: log.go (LogFiles and the readers); cursor.go (the
// Cursor and the events it builds); feed.go (the Feed and its
// subscriptions).
package events
