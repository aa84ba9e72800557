package raftstore

import (
	"sync/atomic"
	"syscall"

	"github.com/hashicorp/raft-wal/fs"
	"github.com/hashicorp/raft-wal/types"
)

// datasyncFS is raft-wal's file system, except that a segment's syncs after
// its first are fdatasync(2) instead of fsync(2), as etcd syncs its WAL.
//
// Why it is safe: raft-wal preallocates every segment to its full size when
// it creates it, and the first sync of a file (fsync, plus its directory
// for a new file, as raft-wal does it) makes that size and the file's
// existence durable. After that an append changes the file's data only:
// fdatasync writes the data and whatever metadata is needed to read it back
// (on ext4 and XFS the conversion of preallocated blocks to written ones),
// and skips only timestamps. fsync also forces a journal commit for the
// modification time on every sync, a wait on the leader's write path and
// then again on each follower's (hashicorp/raft stores on the leader
// before it replicates); the commit benchmark (bench/cluster) measures it.
type datasyncFS struct{ *fs.FS }

func newDatasyncFS() datasyncFS { return datasyncFS{fs.New()} }

func (d datasyncFS) Create(dir, name string, size uint64) (types.WritableFile, error) {
	f, err := d.FS.Create(dir, name, size)
	if err != nil {
		return nil, err
	}
	return &datasyncFile{WritableFile: f}, nil
}

func (d datasyncFS) OpenWriter(dir, name string) (types.WritableFile, error) {
	f, err := d.FS.OpenWriter(dir, name)
	if err != nil {
		return nil, err
	}
	return &datasyncFile{WritableFile: f}, nil
}

// datasyncFile syncs with the file's own Sync the first time and with
// fdatasync after that.
type datasyncFile struct {
	types.WritableFile
	synced atomic.Bool
}

func (f *datasyncFile) Sync() error {
	rc, ok := f.WritableFile.(syscall.Conn)
	if !ok || !f.synced.Load() {
		if err := f.WritableFile.Sync(); err != nil {
			return err
		}
		f.synced.Store(true)
		return nil
	}
	raw, err := rc.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := raw.Control(func(fd uintptr) { serr = datasync(fd) }); err != nil {
		return err
	}
	return serr
}
