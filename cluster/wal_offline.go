package cluster

import (
	"fmt"

	"github.com/hashicorp/raft"

	"github.com/gpuplane/gpuplane/fsm"
)

// offlineLog is a stopped node's whole log: raft.db, then the entries its
// write-ahead log holds beyond raft.db's last. A node stopped cleanly has
// moved every entry into raft.db and tail is empty; one killed (kill -9, a
// crash, a power loss) may hold up to a flush interval of acknowledged
// entries only in raft/wal/ until its next start moves them. Offline audit
// reads them from there, read-only, so that it shows every entry the node
// acknowledged, exactly as the node will have them when it starts again
// (walStore.recover reads the segments the same way: readWALTail).
type offlineLog struct {
	*boltLogs
	boltLast uint64
	tail     []*raft.Log // tail[i].Index == boltLast+1+i
}

var _ logRanger = (*offlineLog)(nil)

// openOfflineLog reads the write-ahead log under walDir after raft.db's
// entries. Without a tail it returns bolt itself.
func openOfflineLog(bolt *boltLogs, walDir string) (logRanger, error) {
	last, err := bolt.LastIndex()
	if err != nil {
		return nil, err
	}
	_, tail, err := readWALTail(walDir, last, nil)
	if err != nil {
		return nil, fmt.Errorf("raft write-ahead log %s: %w", walDir, err)
	}
	if len(tail) == 0 {
		return bolt, nil
	}
	return &offlineLog{boltLogs: bolt, boltLast: tail[0].Index - 1, tail: tail}, nil
}

func (o *offlineLog) FirstIndex() (uint64, error) {
	if o.boltLast == 0 {
		return o.tail[0].Index, nil
	}
	return o.boltLogs.FirstIndex()
}

func (o *offlineLog) LastIndex() (uint64, error) { return o.tail[len(o.tail)-1].Index, nil }

func (o *offlineLog) GetLog(index uint64, l *raft.Log) error {
	if index <= o.boltLast {
		return o.boltLogs.GetLog(index, l)
	}
	if i := index - o.boltLast - 1; i < uint64(len(o.tail)) {
		*l = *o.tail[i]
		return nil
	}
	return raft.ErrLogNotFound
}

// RangeLogs reads raft.db's part of from..to with boltLogs.RangeLogs, then
// the tail's part (at most a flush interval of entries) one at a time.
func (o *offlineLog) RangeLogs(from, to uint64, ahead func([]fsm.Entry), fn func(*raft.Log, *fsm.Entry) error) error {
	if from > to {
		return nil
	}
	if from <= o.boltLast {
		if err := o.boltLogs.RangeLogs(from, min(to, o.boltLast), ahead, fn); err != nil {
			return err
		}
		from = o.boltLast + 1
	}
	for i := from; i <= to; i++ {
		var l raft.Log
		if err := o.GetLog(i, &l); err != nil {
			return fmt.Errorf("%w: %d", err, i)
		}
		var e *fsm.Entry
		if l.Type == raft.LogCommand {
			d := fsm.DecodeEntry(l.Data)
			e = &d
		}
		if err := fn(&l, e); err != nil {
			return err
		}
	}
	return nil
}
