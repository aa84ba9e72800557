package auditrec

import (
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc64"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"google.golang.org/protobuf/proto"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// SnapshotsDir is where Raft's file snapshot store keeps its snapshots in
// raftDir.
func SnapshotsDir(raftDir string) string { return filepath.Join(raftDir, "snapshots") }

// SnapshotMeta is what audit reads of a snapshot's meta.json.
type SnapshotMeta struct {
	Index uint64
	CRC   []byte
}

// ReadSnapshotMeta reads the meta.json of the snapshot in dir.
func ReadSnapshotMeta(dir string) (SnapshotMeta, error) {
	var meta SnapshotMeta
	metaBytes, err := os.ReadFile(filepath.Join(dir, "meta.json"))
	if err != nil {
		return meta, fmt.Errorf("snapshot %s: %w", filepath.Base(dir), err)
	}
	if err := json.Unmarshal(metaBytes, &meta); err != nil {
		return meta, fmt.Errorf("snapshot %s: meta.json: %w", filepath.Base(dir), err)
	}
	return meta, nil
}

// ReadSnapshotBytes reads a snapshot's state.bin, checked against the CRC
// its meta.json records.
func ReadSnapshotBytes(dir string) ([]byte, error) {
	meta, err := ReadSnapshotMeta(dir)
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile(filepath.Join(dir, "state.bin"))
	if err != nil {
		return nil, fmt.Errorf("snapshot %s: %w", filepath.Base(dir), err)
	}
	h := crc64.New(crc64.MakeTable(crc64.ECMA))
	h.Write(data)
	if len(meta.CRC) > 0 && string(h.Sum(nil)) != string(meta.CRC) {
		return nil, fmt.Errorf("snapshot %s: state.bin does not match the CRC in meta.json: altered or corrupt", filepath.Base(dir))
	}
	return data, nil
}

// Snapshot is one state snapshot found in a data dir.
type Snapshot struct {
	ID    string
	State *pb.State
	Err   error // set when the snapshot cannot be read or fails its CRC
}

// ReadSnapshots reads every complete snapshot under dir (raft's
// FileSnapshotStore layout: <id>/meta.json and <id>/state.bin, whose CRC-64
// meta.json records), oldest first. A missing dir holds none. It opens files
// read-only: raft's own store would create the dir and test it for writing.
func ReadSnapshots(dir string) ([]Snapshot, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read snapshots: %w", err)
	}
	var out []Snapshot
	for _, e := range entries {
		if !e.IsDir() || strings.HasSuffix(e.Name(), ".tmp") {
			continue
		}
		s := Snapshot{ID: e.Name()}
		s.State, s.Err = readSnapshot(filepath.Join(dir, e.Name()))
		out = append(out, s)
	}
	// Snapshot ids are term-index-time, zero-padded only in part: order by
	// applied index where it is known, by name otherwise.
	sort.SliceStable(out, func(i, j int) bool {
		return out[i].State.GetAppliedIndex() < out[j].State.GetAppliedIndex()
	})
	return out, nil
}

func readSnapshot(dir string) (*pb.State, error) {
	data, err := ReadSnapshotBytes(dir)
	if err != nil {
		return nil, err
	}
	st := &pb.State{}
	if err := proto.Unmarshal(data, st); err != nil {
		return nil, fmt.Errorf("snapshot %s: decode state: %w", filepath.Base(dir), err)
	}
	return st, nil
}
