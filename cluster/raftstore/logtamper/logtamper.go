// Package logtamper rewrites a stopped node's Raft log for tests of the
// audit: it writes through the log store, as someone with write access to
// the data dir could, so the store's own checksums stay right and only the
// audit's hash chain can tell.
package logtamper

import (
	"errors"

	"github.com/hashicorp/raft"

	"github.com/gpuplane/gpuplane/cluster/raftstore"
)

// Rewrite reads every entry of the log in dir, replaces the first one that
// change alters (change returns true), writes the log again and returns the
// altered entry's index.
func Rewrite(dir string, change func(*raft.Log) bool) (uint64, error) {
	store, err := raftstore.Open(dir, raftstore.Options{})
	if err != nil {
		return 0, err
	}
	defer store.Close()
	first, err := store.FirstIndex()
	if err != nil {
		return 0, err
	}
	last, err := store.LastIndex()
	if err != nil {
		return 0, err
	}
	var logs []*raft.Log
	altered := uint64(0)
	for i := first; i <= last; i++ {
		l := &raft.Log{}
		if err := store.GetLog(i, l); err != nil {
			return 0, err
		}
		if altered == 0 && change(l) {
			altered = i
		}
		logs = append(logs, l)
	}
	if altered == 0 {
		return 0, errors.New("no entry to alter")
	}
	if err := store.DeleteRange(first, last); err != nil {
		return 0, err
	}
	if err := store.StoreLogs(logs); err != nil {
		return 0, err
	}
	return altered, nil
}
