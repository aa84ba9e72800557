// Package audit reads a server's Raft log for people who check it: the
// event log, the state as of any entry or time, verification of the log
// against what the state machine recorded when it applied each entry
// (docs/audit.md), and archives of sealed stretches of the log that let
// servers compact theirs (docs/archive.md).
//
// It reads a running server through the narrow Server interface
// (*cluster.Cluster: its log files and live state) and a stopped one's data
// dir read-only (OpenOffline). Every replay goes through events.Cursor
// (package events), so through fsm.ApplyBytes, the code the live cluster
// applies entries with.
//
// It must never write to a server's log or its records (Cluster.Compact,
// in package cluster, is the one place entries are dropped), and never
// apply an entry any other way than through the Cursor.
//
// Where things are: history.go (History: events, replay, verify; the live
// server's VerifyLocal and HashAt); offline.go (a stopped node's data dir);
// logrange.go (its log read and decoded ahead of the replay); archive.go
// (archives).
package audit
