// Package raftstore keeps a server's Raft log and stable store (term, vote)
// with hashicorp/raft-wal, Consul's log store: checksummed, versioned
// segment files and a bbolt file of metadata (wal-meta.db), in raft-wal's own
// formats. Nothing here writes a format of its own.
//
// What this package adds around raft-wal:
//
//   - Corruption is never silent. raft-wal checks only the last batch of the
//     newest segment when it opens, and treats anything unreadable there as a
//     torn final write. Open (and OpenReadOnly) first read every segment
//     through (verify.go): every batch's CRC, every frame, sealed segments'
//     indexes, the files' sizes. A damaged record anywhere except an
//     unfinished final write is a *DamageError naming the file, the offset and
//     the first entry index it affects, and the store does not open.
//   - An unfinished final write (never acknowledged) is told from damage the
//     way etcd's WAL tells a torn entry: part of it was never written (an
//     all-zero sector, segments being preallocated with zeros), or it never
//     got as far as its commit frame. It is zeroed before raft-wal opens, so
//     later appends never leave stale bytes behind the log's end.
//   - A damaged or truncated wal-meta.db is an error, not a crash: it is
//     checked read-only, with memory faults turned into errors, before
//     raft-wal's own bbolt handle opens it.
//   - A segment is created whole or not at all: raft-wal's file system
//     leaves the file behind, empty, when its preallocation fails, and
//     raft-wal would then append to it without its reservation (wholeFS
//     removes it). A tail shorter than its size limit that holds only zeros
//     is such a creation, never written to: Open removes it and raft-wal
//     creates it again, or, without room, the rotation is undone.
//   - A full disk refuses writes with a clear error, naming the free space
//     they wait for (roomNeeded), and recovers by itself: raft-wal seals a
//     full segment and creates the next; when that fails every later append
//     fails until the log is opened again. Store reopens the log once space
//     is back, finishing the interrupted rotation, so the node takes writes
//     again without a restart; a restart on a full disk needs no new space.
//     Before it comes to that, Admit refuses commands that would take the
//     newest segment's last bytes while there is no room for the next, so
//     that a leader can still write its own entries (its election no-op,
//     read barriers) and a single server keeps serving reads.
//   - One process per data dir: an exclusive lock taken without waiting.
//   - Offline readers (audit) read the same files read-only, mapped, without
//     raft-wal's writer (which repairs and deletes files when it opens).
//   - A data dir of an earlier gpuplane (raft.db written by raft-boltdb's
//     format, plus its own write-ahead segments) is converted on first start
//     (MigrateLegacy).
package raftstore
