// Package cluster runs a node's Raft server and is the only way writes reach
// the replicated state and the way reads see it consistently.
//
// It owns: Raft setup (the bbolt log and stable store, file snapshots, the
// TCP transport, mutual TLS when configured, timing), gossip with memberlist
// (optionally encrypted) and membership (bootstrap-expect, join, leave,
// remove-peer, the leader's reconcile of gossip into the log), the leader's
// placer, the event stream and audit over the log, the data dir layout, the raft.FSM wrapper that feeds
// committed entries to the pure fsm package under a lock, the write path
// (request ids, the leader's proposal time, leader forwarding through a
// Forwarder, retries while leadership moves), linearizable and stale reads,
// waiting for an index to be applied, and the node's Raft status.
//
// It must never decode or interpret log entries to change state itself
// (fsm.ApplyBytes does, so live apply, restore, events and offline replay
// share one code path; events.go decodes entries only to describe and filter
// them), never compact the log away (docs/audit.md: every server keeps every entry from index
// 1), never acknowledge a write before it is committed and fsynced, and never
// let anything touch the fsm.FSM outside its lock.
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
