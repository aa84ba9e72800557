package cluster

import (
	"io/fs"
	"path/filepath"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/gpuplane/gpuplane/fsm"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// Resources reports what this server holds that grows with the cluster's
// history (docs/audit.md): the log's files and its oldest and newest index, the
// latest snapshot, and the state machine's request-id table. A client node
// holds none of it: nil.
func (c *Cluster) Resources() *pb.ServerResources {
	if !c.IsServer() || c.store == nil {
		return nil
	}
	r := &pb.ServerResources{}
	_ = filepath.WalkDir(c.store.Dir(), func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if info, err := d.Info(); err == nil {
				r.LogBytes += uint64(info.Size())
			}
		}
		return nil
	})
	r.FirstIndex, _ = c.store.FirstIndex()
	r.LastIndex, _ = c.store.LastIndex()
	if metas, err := c.snaps.List(); err == nil && len(metas) > 0 {
		r.SnapshotBytes, r.SnapshotIndex = uint64(metas[0].Size), metas[0].Index
	}
	c.View(func(f *fsm.FSM) {
		st := f.RequestStats()
		r.RequestEntries, r.RequestLive, r.RequestBytes = uint64(st.Entries), uint64(st.Live), uint64(st.Bytes)
		r.RequestWindow = durationpb.New(f.RequestWindow())
		if t := f.LogTime(); !t.IsZero() {
			r.LogTime = timestamppb.New(t)
		}
	})
	return r
}
