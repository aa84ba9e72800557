package cluster

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

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/gpuplane/gpuplane/cluster/raftstore"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// LogReader is what the audit and event code reads a Raft log through: the
// live node's store, or a stopped node's log opened read-only (OpenOffline).
type LogReader interface {
	FirstIndex() (uint64, error)
	LastIndex() (uint64, error)
	GetLog(index uint64, log *raft.Log) error
}

// Offline is a stopped node's data dir opened read-only for audit: its Raft
// log, the per-entry hashes its state machine recorded, and its snapshots.
// Close it to release the data dir.
type Offline struct {
	*History
	store  *offlineLog
	hashes *hashLog
}

// OpenOffline opens a stopped node's data dir read-only. It fails at once,
// naming the cause, when an agent is running on the dir, and with an error
// naming the file, offset and entry index when the log is damaged.
func OpenOffline(dataDir string) (*Offline, error) {
	dir := LogDir(dataDir)
	r, err := raftstore.OpenReadOnly(dir)
	if errors.Is(err, raftstore.ErrNoLog) && raftstore.HasLegacy(filepath.Join(dataDir, raftDir)) {
		return nil, fmt.Errorf("data dir %s holds a Raft log in the layout of an earlier gpuplane (raft/raft.db): start this version's agent on it once (it converts the log), then stop it and run audit again", dataDir)
	}
	if errors.Is(err, raftstore.ErrNoLog) {
		return nil, fmt.Errorf("open %s: no Raft log in data dir %s: %w", dir, dataDir, err)
	}
	if err != nil {
		return nil, fmt.Errorf("open the Raft log read-only: %w", err)
	}
	log := &offlineLog{r}
	hashes, err := openHashLog(filepath.Join(dataDir, raftDir, hashesFile), true)
	if err != nil {
		r.Close()
		return nil, err
	}
	return &Offline{
		History: &History{log: log, hashes: hashes, snapshotDir: filepath.Join(dataDir, raftDir, "snapshots"),
			basePath: filepath.Join(dataDir, raftDir, auditBaseFile)},
		store: log, hashes: hashes,
	}, nil
}

// Close releases the data dir.
func (o *Offline) Close() error {
	return errors.Join(o.hashes.close(), o.store.Close())
}

// snapshotMeta is what audit reads of a snapshot's meta.json.
type snapshotMeta struct {
	Index uint64
	CRC   []byte
}

func readSnapshotMeta(dir string) (snapshotMeta, error) {
	var meta snapshotMeta
	metaBytes, err := os.ReadFile(filepath.Join(dir, "meta.json"))
	if err != nil {
		return meta, fmt.Errorf("snapshot %s: %w", filepath.Base(dir), err)
	}
	if err := json.Unmarshal(metaBytes, &meta); err != nil {
		return meta, fmt.Errorf("snapshot %s: meta.json: %w", filepath.Base(dir), err)
	}
	return meta, nil
}

// readSnapshotBytes reads a snapshot's state.bin, checked against the CRC
// its meta.json records.
func readSnapshotBytes(dir string) ([]byte, error) {
	meta, err := readSnapshotMeta(dir)
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

// snapshotState is one state snapshot found in a data dir.
type snapshotState struct {
	id    string
	state *pb.State
	err   error // set when the snapshot cannot be read or fails its CRC
}

// readSnapshots reads every complete snapshot under dir (raft's
// FileSnapshotStore layout: <id>/meta.json and <id>/state.bin, whose CRC-64
// meta.json records), oldest first. A missing dir holds none. It opens files
// read-only: raft's own store would create the dir and test it for writing.
func readSnapshots(dir string) ([]snapshotState, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read snapshots: %w", err)
	}
	var out []snapshotState
	for _, e := range entries {
		if !e.IsDir() || strings.HasSuffix(e.Name(), ".tmp") {
			continue
		}
		s := snapshotState{id: e.Name()}
		s.state, s.err = readSnapshot(filepath.Join(dir, e.Name()))
		out = append(out, s)
	}
	// Snapshot ids are term-index-time, zero-padded only in part: order by
	// applied index where it is known, by name otherwise.
	sort.SliceStable(out, func(i, j int) bool {
		return out[i].state.GetAppliedIndex() < out[j].state.GetAppliedIndex()
	})
	return out, nil
}

func readSnapshot(dir string) (*pb.State, error) {
	data, err := readSnapshotBytes(dir)
	if err != nil {
		return nil, err
	}
	st := &pb.State{}
	if err := proto.Unmarshal(data, st); err != nil {
		return nil, fmt.Errorf("snapshot %s: decode state: %w", filepath.Base(dir), err)
	}
	return st, nil
}
