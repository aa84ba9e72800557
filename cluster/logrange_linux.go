package cluster

import "syscall"

// offlineMmapFlags populates the offline reader's mapping of raft.db up front.
// bbolt advises the kernel that its mapping is read at random
// (MADV_RANDOM), which turns a replay's front-to-back pass into one page
// fault per 4 KiB page: half a second or more for a million-entry log, and
// far more on virtual machines where faults are dear. A replay always reads
// the log from index 1, so mapping all of it at once costs nothing extra.
const offlineMmapFlags = syscall.MAP_POPULATE
