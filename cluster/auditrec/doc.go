// Package auditrec owns the files a server keeps beside its Raft log for
// audit, and reads Raft's snapshots for it: the hash chain head after each
// applied command entry (raft/hashes, written by the live state machine),
// the audit base a compacted log's replays start from
// (raft/audit-base.state), and the snapshots in raft/snapshots.
//
// Package cluster writes the records as it applies entries; package audit
// reads them. It imports neither, so that both can use it.
package auditrec
