// Package cluster runs a node's Raft server and is the only way writes reach
// the replicated state and the way reads see it consistently.
//
// It owns: Raft setup (the log and stable store of package raftstore, file
// snapshots, the TCP transport, over mutual TLS from package tlsutil when
// configured, timing), gossip with memberlist (optionally encrypted) and
// membership (bootstrap-expect, join, leave, remove-peer, the leader's
// reconcile of gossip into the log), the leader's placer (which runs package
// scheduler), the server's shared event feed (package events, which also
// holds the Cursor that audit and compaction replay with), compaction of
// the log behind an archive, the data dir layout, the raft.FSM wrapper
// that feeds committed entries to the pure fsm package under a lock, the
// write path (request ids,
// the leader's proposal time, leader forwarding through a Forwarder, retries
// while leadership moves), linearizable and stale reads, waiting for an
// index to be applied, and the node's Raft status.
//
// Where things are: cluster.go, config.go, transport.go (Raft setup);
// apply.go, read.go (writes and reads); fsm.go (the raft.FSM wrapper);
// gossip.go, membership.go, servers.go, leader.go (membership); placer.go;
// logfiles.go (the log and its audit records as packages audit and events
// read them, and the server's event feed); compact.go (compaction behind an
// archive); datadir.go (the data dir and node id); resources.go (what
// grows with the history);
// tenants.go (the gateway's tenant lookups); hclog.go (Raft's logs into
// slog).
//
// It must never decode or interpret log entries to change state itself
// (fsm.ApplyBytes does, so live apply, restore, events and offline replay
// share one code path; package events decodes entries only to describe and
// filter them), never drop log entries except behind a verified archive
// (docs/audit.md, docs/archive.md: otherwise every server keeps every entry
// from index 1), never acknowledge a write before it is committed and
// fsynced, and never let anything touch the fsm.FSM outside its lock.
//
// A typical agent:
//
//	c, err := cluster.New(cluster.Config{
//		NodeName: "gpu-1", DataDir: dir, RaftBind: "10.0.0.5:7411",
//		Server: true, Bootstrap: dev, Logger: logger,
//	})
//	...
//	c.SetForwarder(rpcForwarder) // writes on followers go to the leader
//	res, err := c.Apply(ctx, &pb.Envelope{Command: ...})
//	err = c.Read(ctx, false, func(f *fsm.FSM) error { nodes = f.Nodes(); return nil })
//	defer c.Shutdown()
package cluster
