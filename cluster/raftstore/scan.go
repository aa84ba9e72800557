package raftstore

import (
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/hashicorp/raft-wal/types"
)

// mappedSeg is one segment read through: what scanSegment found and, for a
// reader, the file's bytes.
type mappedSeg struct {
	*segScan
	data  []byte
	unmap func() error
}

// scanLog reads through every segment the state lists, in index order.
// Segments whose ids are in skip (sealed ones verified before: they never
// change) are not read again. With keep the files stay mapped (the caller
// unmaps them); otherwise each is unmapped once checked.
func scanLog(dir string, st types.PersistentState, keep, populate bool, skip map[uint64]bool) (segs []mappedSeg, err error) {
	defer func() {
		if err != nil {
			unmapAll(segs)
			segs = nil
		}
	}()
	if err := checkChain(metaPath(dir), st.Segments); err != nil {
		return nil, err
	}
	for i, info := range st.Segments {
		sealed := !info.SealTime.IsZero()
		if sealed && skip[info.ID] {
			continue
		}
		path := segmentPath(dir, info)
		f, err := os.Open(path)
		if errors.Is(err, fs.ErrNotExist) && !sealed && i == len(st.Segments)-1 {
			// The tail's file is created after wal-meta.db lists it: a
			// crash in between leaves it missing, and raft-wal creates it.
			segs = append(segs, mappedSeg{segScan: &segScan{info: info, path: path, missing: true}, unmap: func() error { return nil }})
			continue
		}
		if errors.Is(err, fs.ErrNotExist) {
			return segs, &DamageError{File: path, Index: info.MinIndex, Reason: "segment file listed in wal-meta.db is missing"}
		}
		if err != nil {
			return segs, err
		}
		seg, err := scanFile(f, path, info, sealed, keep, populate)
		f.Close()
		if err != nil {
			return segs, err
		}
		segs = append(segs, seg)
	}
	return segs, nil
}

func scanFile(f *os.File, path string, info types.SegmentInfo, sealed, keep, populate bool) (mappedSeg, error) {
	fi, err := f.Stat()
	if err != nil {
		return mappedSeg{}, err
	}
	data, unmap, err := mapFile(f, fi.Size(), populate)
	if err != nil {
		return mappedSeg{}, fmt.Errorf("read %s: %w", path, err)
	}
	s, err := scanSegment(path, data, info, sealed)
	if err != nil || !keep {
		unmap()
		data, unmap = nil, func() error { return nil }
	}
	if err != nil {
		return mappedSeg{}, err
	}
	return mappedSeg{segScan: s, data: data, unmap: unmap}, nil
}

func unmapAll(segs []mappedSeg) error {
	var errs []error
	for _, s := range segs {
		if s.unmap != nil {
			errs = append(errs, s.unmap())
		}
	}
	return errors.Join(errs...)
}
