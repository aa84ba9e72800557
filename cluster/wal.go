package cluster

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
)

// walStore is Raft's LogStore and StableStore: raft-boltdb's raft.db, the
// log's record, behind a write-ahead log.
//
// A bbolt commit costs two fdatasyncs (the pages, then the meta page that
// points at them), and hashicorp/raft commits each batch on the leader and
// then on each follower, one after the other: four fsyncs on a write's path
// and six per batch on three servers' shared or separate disks. Here a
// batch costs one: StoreLogs appends it to a segment file under raft/wal/,
// fdatasyncs it and returns, so an entry is on disk before Raft counts it
// stored (acknowledged writes are on a quorum's disks, as before). A
// flusher moves the entries into raft.db every walFlushInterval (or
// walFlushEntries), in one bbolt commit, synced as always, and deletes the
// segments it emptied.
//
// raft.db therefore lags the log by at most a flush interval while the node
// runs; reads through the store see both. Closing flushes everything, so a
// cleanly stopped node's raft.db holds its whole log; after a crash (kill -9,
// power loss) the next start moves the segments' entries into raft.db before
// Raft starts, and until then offline audit reads them from the segments
// (offlineLog, wal_offline.go), so it never misses an acknowledged entry. Entries are flushed before a snapshot is taken, so no snapshot is
// ever ahead of raft.db. Term and vote (StableStore) go to raft.db directly.
type walStore struct {
	bolt *boltStore
	dir  string
	log  *slog.Logger

	// flushMu orders flushes and DeleteRange; appendMu orders appends and
	// segment changes; mu guards pending for readers. Lock order: flushMu,
	// appendMu, mu.
	flushMu  sync.Mutex
	appendMu sync.Mutex
	mu       sync.RWMutex

	seg    *os.File // the segment appends go to
	segSeq uint64   // its sequence number
	// lastSeq is the highest segment number created: each new segment
	// takes the next, so that segments sort in the order appends used
	// them even when a flush and a failed append both start one.
	lastSeq atomic.Uint64
	sealed  []string // older segments, deleted once their entries are in raft.db
	pending []*raft.Log
	// pendingBytes is the size of pending's records in the segments.
	pendingBytes int
	broken       error // an append failed and the segment could not be replaced
	closeOnce    sync.Once
	closeErr     error

	kick chan struct{}
	stop chan struct{}
	done chan struct{}
}

const (
	walDirName = "wal"
	// walFlushInterval bounds how far raft.db lags the log while the node
	// runs: each flush is one bbolt commit (two fdatasyncs) however many
	// entries it carries. Measured with bench/cluster (64 clients): 100 ms
	// gave 1.31x etcd's commit rate, 500 ms 1.37x.
	walFlushInterval = 500 * time.Millisecond
	// walFlushEntries and walFlushBytes start a flush early when that many
	// entries, or bytes of them, wait.
	walFlushEntries = 16 << 10
	walFlushBytes   = 16 << 20
	// walMaxPending and walMaxPendingBytes make StoreLogs flush itself when
	// the flusher falls this far behind, bounding the memory the pending
	// entries hold.
	walMaxPending      = 64 << 10
	walMaxPendingBytes = 64 << 20
)

var walCRC = crc32.MakeTable(crc32.Castagnoli)

// openWALStore opens raft.db and the write-ahead log of a data dir. Entries
// a crash left in the log's segments are moved into raft.db first.
func openWALStore(dataDir string, logger *slog.Logger) (*walStore, error) {
	if err := os.MkdirAll(filepath.Join(dataDir, raftDir, walDirName), 0o700); err != nil {
		return nil, err
	}
	bolt, err := openLogStore(dataDir)
	if err != nil {
		return nil, err
	}
	s := &walStore{bolt: bolt, dir: filepath.Join(dataDir, raftDir, walDirName), log: logger,
		kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	if err := s.recover(); err != nil {
		bolt.Close()
		return nil, fmt.Errorf("raft write-ahead log %s: %w", s.dir, err)
	}
	go s.flusher()
	return s, nil
}

// recover moves the entries of every segment that raft.db lacks into it,
// deletes the segments and starts an empty one.
func (s *walStore) recover() error {
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return err
	}
	last, err := s.bolt.LastIndex()
	if err != nil {
		return err
	}
	segs, tail, err := readWALTail(s.dir, last, s.log)
	if err != nil {
		return err
	}
	for batch := tail; len(batch) > 0; {
		n := min(len(batch), walFlushEntries)
		if err := s.bolt.StoreLogs(batch[:n]); err != nil {
			return fmt.Errorf("move entries into raft.db: %w", err)
		}
		batch = batch[n:]
	}
	if len(tail) > 0 {
		s.log.Info("raft write-ahead log: entries moved into raft.db after an unclean stop", "entries", len(tail), "first", tail[0].Index, "last", tail[len(tail)-1].Index)
	}
	for _, name := range segs {
		if err := os.Remove(filepath.Join(s.dir, name)); err != nil {
			return err
		}
		s.lastSeq.Store(max(s.lastSeq.Load(), segmentSeq(name)))
	}
	return s.rotate()
}

// readWALTail reads the segments under dir (read-only) and returns their
// names, in append order, and the entries they hold after index last (the
// last entry raft.db holds), in index order. Those are what a node stopped
// without a clean close (a crash, kill -9) acknowledged but had not yet
// moved into raft.db. Entries at or below last are raft.db's already: an
// entry only goes into a segment when it continues the log, and raft.db
// only gets an entry at or below it by a flush (the same entry) or by a
// later write, which wins. A later record for an index replaces an earlier
// one (an append that failed and was retried). A partial last record (a
// crash during an append, never acknowledged) is ignored. The entries must
// continue raft.db's log without a gap.
func readWALTail(dir string, last uint64, logger *slog.Logger) (segs []string, tail []*raft.Log, err error) {
	segs, err = walSegments(dir)
	if err != nil {
		return nil, nil, err
	}
	byIndex := map[uint64]*raft.Log{}
	for _, name := range segs {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return nil, nil, err
		}
		entries, torn := decodeSegment(data)
		if torn && logger != nil {
			logger.Warn("raft write-ahead log: segment ends in a partial record, ignored", "segment", name)
		}
		for _, l := range entries {
			if l.Index > last {
				byIndex[l.Index] = l
			}
		}
	}
	if len(byIndex) == 0 {
		return segs, nil, nil
	}
	idx := slices.Sorted(maps.Keys(byIndex))
	if idx[0] != last+1 && last > 0 {
		return nil, nil, fmt.Errorf("the log in raft.db ends at %d but the write-ahead log goes on from %d", last, idx[0])
	}
	tail = make([]*raft.Log, 0, len(idx))
	for i, x := range idx {
		if i > 0 && x != idx[i-1]+1 {
			return nil, nil, fmt.Errorf("write-ahead log entries %d..%d are missing", idx[i-1]+1, x-1)
		}
		tail = append(tail, byIndex[x])
	}
	return segs, tail, nil
}

// segments lists the segment files in append order.
func (s *walStore) segments() ([]string, error) { return walSegments(s.dir) }

// walSegments lists the segment files under dir in append order; a
// missing dir holds none.
func walSegments(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range ents {
		if segmentSeq(e.Name()) > 0 {
			names = append(names, e.Name())
		}
	}
	slices.SortFunc(names, func(a, b string) int { return cmp.Compare(segmentSeq(a), segmentSeq(b)) })
	return names, nil
}

func segmentName(seq uint64) string { return fmt.Sprintf("wal-%016x.log", seq) }

// segmentSeq is the sequence number in a segment's name, 0 for other files.
func segmentSeq(name string) uint64 {
	hex, ok := strings.CutPrefix(name, "wal-")
	if !ok {
		return 0
	}
	if hex, ok = strings.CutSuffix(hex, ".log"); !ok {
		return 0
	}
	n, err := strconv.ParseUint(hex, 16, 64)
	if err != nil {
		return 0
	}
	return n
}

// walPrealloc is how much of a new segment is written with zeros, and
// synced, before appends go to it: an append inside that space changes no
// file metadata (size, block allocation), so its fdatasync writes the data
// alone, without a journal commit. Measured here (ext4 on a virtual disk):
// ~85 µs of CPU and ~0.27 ms per fdatasync after a 2 KB write into zeroed
// space, ~120–150 µs and ~0.3–0.6 ms after one that grows the file; zeroing
// 1 MiB costs ~0.8 ms of CPU, once per flush. An append past the space
// grows the file as before. Recovery reads up to the first all-zero
// record header (decodeSegment).
const walPrealloc = 1 << 20

var walZeros [64 << 10]byte

// createSegment creates the next segment, zero-filled (walPrealloc) and
// synced, and syncs the directory, so that the appends to it cannot outlive
// its name in a power loss.
func (s *walStore) createSegment() (f *os.File, seq uint64, err error) {
	seq = s.lastSeq.Add(1)
	f, err = os.OpenFile(filepath.Join(s.dir, segmentName(seq)), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, 0, err
	}
	for off := int64(0); off < walPrealloc && err == nil; off += int64(len(walZeros)) {
		_, err = f.WriteAt(walZeros[:], off)
	}
	if err == nil {
		err = fdatasync(f)
	}
	if err == nil {
		err = syncDir(s.dir)
	}
	if err != nil {
		f.Close()
		os.Remove(f.Name())
		return nil, 0, err
	}
	return f, seq, nil
}

// install seals the current segment and makes f, segment seq, the one
// appends go to. The caller holds appendMu.
func (s *walStore) install(f *os.File, seq uint64) {
	if s.seg != nil {
		s.seg.Close()
		s.sealed = append(s.sealed, segmentName(s.segSeq))
	}
	s.seg, s.segSeq = f, seq
}

// rotate seals the current segment and starts the next. The caller holds
// appendMu (or is recover).
func (s *walStore) rotate() error {
	f, seq, err := s.createSegment()
	if err != nil {
		return err
	}
	s.install(f, seq)
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// StoreLogs appends logs to the write-ahead log and syncs it.
func (s *walStore) StoreLogs(logs []*raft.Log) error {
	if len(logs) == 0 {
		return nil
	}
	s.appendMu.Lock()
	if s.broken != nil {
		s.appendMu.Unlock()
		return s.broken
	}
	if !s.follows(logs) {
		// Not the next entries (Raft deletes before it overwrites, so this
		// does not happen): write them to raft.db directly, in order.
		s.appendMu.Unlock()
		if err := s.flush(); err != nil {
			return err
		}
		return s.bolt.StoreLogs(logs)
	}
	rec := encodeRecord(logs)
	_, err := s.seg.Write(rec)
	if err == nil {
		err = fdatasync(s.seg)
	}
	if err != nil {
		// The segment may end in part of this record: appends must not
		// follow it, or recovery would stop before them.
		if rerr := s.rotate(); rerr != nil {
			s.broken = fmt.Errorf("raft write-ahead log: %w (and no new segment: %w)", err, rerr)
		}
		s.appendMu.Unlock()
		return fmt.Errorf("raft write-ahead log: %w", err)
	}
	s.mu.Lock()
	s.pending = append(s.pending, logs...)
	s.pendingBytes += len(rec)
	n, size := len(s.pending), s.pendingBytes
	s.mu.Unlock()
	s.appendMu.Unlock()
	switch {
	case n >= walMaxPending || size >= walMaxPendingBytes:
		return s.flush()
	case n >= walFlushEntries || size >= walFlushBytes:
		select {
		case s.kick <- struct{}{}:
		default:
		}
	}
	return nil
}

// follows reports whether logs continue the log, in order. The caller
// holds appendMu.
func (s *walStore) follows(logs []*raft.Log) bool {
	for i := 1; i < len(logs); i++ {
		if logs[i].Index != logs[i-1].Index+1 {
			return false
		}
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if n := len(s.pending); n > 0 {
		return logs[0].Index == s.pending[n-1].Index+1
	}
	last, err := s.bolt.LastIndex()
	return err == nil && (logs[0].Index == last+1 || last == 0)
}

// StoreLog stores one entry.
func (s *walStore) StoreLog(l *raft.Log) error { return s.StoreLogs([]*raft.Log{l}) }

// GetLog reads an entry: from the entries not yet flushed, or from raft.db.
// An entry leaves pending only once raft.db holds it.
//
// An entry from pending shares its Data with the raft.Log that Raft (and
// its LogCache) holds, so out is cleared before raft.db is read into it:
// raft-boltdb decodes into the slices out already has when they are big
// enough, and a caller reading entries in turn into one raft.Log (a
// Cursor, caughtUp) would otherwise write entry i+1 over entry i's bytes
// in Raft's own copy once a flush moved i+1 into raft.db between two reads
// (jepsen seed 835667773: a follower catching up was sent the corrupted
// copy and applied an undecodable entry).
func (s *walStore) GetLog(index uint64, out *raft.Log) error {
	*out = raft.Log{}
	s.mu.RLock()
	if n := len(s.pending); n > 0 && index >= s.pending[0].Index && index <= s.pending[n-1].Index {
		*out = *s.pending[index-s.pending[0].Index]
		s.mu.RUnlock()
		return nil
	}
	s.mu.RUnlock()
	return s.bolt.GetLog(index, out)
}

// FirstIndex is the first index in the log, 0 when it is empty.
func (s *walStore) FirstIndex() (uint64, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	first, err := s.bolt.FirstIndex()
	if err == nil && first == 0 && len(s.pending) > 0 {
		first = s.pending[0].Index
	}
	return first, err
}

// LastIndex is the last index in the log, 0 when it is empty.
func (s *walStore) LastIndex() (uint64, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if n := len(s.pending); n > 0 {
		return s.pending[n-1].Index, nil
	}
	return s.bolt.LastIndex()
}

// DeleteRange deletes entries min..max, inclusive. Raft does so on a
// follower whose uncommitted tail a new leader overwrites (the log is never
// compacted). Everything is flushed into raft.db first and the write-ahead
// log emptied durably, and only then are the entries deleted from raft.db:
// a crash at any point leaves either the entries still in raft.db (the
// delete never happened) or deleted with no segment that holds them, so a
// recovery or an offline reader can never bring them back.
func (s *walStore) DeleteRange(min, max uint64) error {
	s.flushMu.Lock()
	defer s.flushMu.Unlock()
	if err := s.flushLocked(); err != nil {
		return err
	}
	s.appendMu.Lock()
	err := s.rotate()
	if err == nil {
		err = s.removeSealed(true)
	}
	s.appendMu.Unlock()
	if err != nil {
		return err
	}
	return s.bolt.DeleteRange(min, max)
}

// removeSealed deletes the sealed segments, whose entries raft.db holds.
func (s *walStore) removeSealed(sync bool) error {
	for _, name := range s.sealed {
		if err := os.Remove(filepath.Join(s.dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	s.sealed = nil
	if sync {
		return syncDir(s.dir)
	}
	return nil
}

// flush moves the pending entries into raft.db in one commit.
func (s *walStore) flush() error {
	s.flushMu.Lock()
	defer s.flushMu.Unlock()
	return s.flushLocked()
}

func (s *walStore) flushLocked() error {
	s.mu.RLock()
	n := len(s.pending)
	s.mu.RUnlock()
	if n == 0 {
		return nil
	}
	// Later appends go to a new segment, so that the ones sealed now hold
	// only entries this flush moves. It is created before appends are held
	// up: creating it syncs the directory.
	next, seq, err := s.createSegment()
	if err != nil {
		return fmt.Errorf("raft write-ahead log: %w", err)
	}
	s.appendMu.Lock()
	if seq > s.segSeq {
		s.install(next, seq)
	} else {
		// An append that failed rotated meanwhile, to a later segment:
		// start after that one.
		next.Close()
		os.Remove(next.Name())
		err = s.rotate()
	}
	s.mu.RLock()
	batch := s.pending
	s.mu.RUnlock()
	s.appendMu.Unlock()
	if err != nil {
		return fmt.Errorf("raft write-ahead log: %w", err)
	}
	if err := s.bolt.StoreLogs(batch); err != nil {
		return err
	}
	s.mu.Lock()
	s.pending = slices.Clone(s.pending[len(batch):])
	s.pendingBytes = 0
	for _, l := range s.pending {
		s.pendingBytes += recordHeader + len(l.Data) + len(l.Extensions) + 16
	}
	s.mu.Unlock()
	s.appendMu.Lock()
	defer s.appendMu.Unlock()
	// Deleting needs no sync: a segment that outlives a crash only holds
	// entries raft.db already has, which recovery writes again unchanged.
	return s.removeSealed(false)
}

// flusher flushes every walFlushInterval, or sooner when entries pile up.
func (s *walStore) flusher() {
	defer close(s.done)
	t := time.NewTicker(walFlushInterval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		case <-s.kick:
		}
		if err := s.flush(); err != nil {
			s.log.Error("raft write-ahead log: move entries into raft.db", "err", err)
		}
	}
}

// Close flushes every entry into raft.db and closes it. Later calls
// return the first one's result.
func (s *walStore) Close() error {
	s.closeOnce.Do(func() { s.closeErr = s.close() })
	return s.closeErr
}

func (s *walStore) close() error {
	close(s.stop)
	<-s.done
	err := s.flush()
	s.appendMu.Lock()
	if s.seg != nil {
		s.seg.Close()
		if err == nil {
			s.sealed = append(s.sealed, segmentName(s.segSeq))
			err = s.removeSealed(true)
		}
		s.seg = nil
	}
	s.appendMu.Unlock()
	return errors.Join(err, s.bolt.Close())
}

// StableStore: term and vote, written to raft.db at once (rare).
func (s *walStore) Set(k, v []byte) error              { return s.bolt.Set(k, v) }
func (s *walStore) Get(k []byte) ([]byte, error)       { return s.bolt.Get(k) }
func (s *walStore) SetUint64(k []byte, v uint64) error { return s.bolt.SetUint64(k, v) }
func (s *walStore) GetUint64(k []byte) (uint64, error) { return s.bolt.GetUint64(k) }

// A record is one StoreLogs batch: its payload's length and CRC-32C, then the
// payload, each entry as uvarint index, term, type, appended-at (varint unix
// nanoseconds, 0 for none), then data and extensions, each uvarint length
// first.
const recordHeader = 8

func encodeRecord(logs []*raft.Log) []byte {
	size := recordHeader
	for _, l := range logs {
		size += 5*binary.MaxVarintLen64 + len(l.Data) + len(l.Extensions)
	}
	buf := make([]byte, recordHeader, size)
	for _, l := range logs {
		buf = binary.AppendUvarint(buf, l.Index)
		buf = binary.AppendUvarint(buf, l.Term)
		buf = binary.AppendUvarint(buf, uint64(l.Type))
		var at int64
		if !l.AppendedAt.IsZero() {
			at = l.AppendedAt.UnixNano()
		}
		buf = binary.AppendVarint(buf, at)
		buf = binary.AppendUvarint(buf, uint64(len(l.Data)))
		buf = append(buf, l.Data...)
		buf = binary.AppendUvarint(buf, uint64(len(l.Extensions)))
		buf = append(buf, l.Extensions...)
	}
	payload := buf[recordHeader:]
	binary.LittleEndian.PutUint32(buf[0:4], uint32(len(payload)))
	binary.LittleEndian.PutUint32(buf[4:8], crc32.Checksum(payload, walCRC))
	return buf
}

// decodeSegment returns the entries of a segment's whole records; torn is
// set when it ends in an incomplete or damaged one.
func decodeSegment(data []byte) (logs []*raft.Log, torn bool) {
	for len(data) > 0 {
		if len(data) < recordHeader {
			return logs, true
		}
		n := int(binary.LittleEndian.Uint32(data[0:4]))
		if n == 0 && binary.LittleEndian.Uint32(data[4:8]) == 0 {
			// No record is empty: zeros are a never written remainder
			// (a file system may show a crashed append's blocks so).
			return logs, false
		}
		if n > len(data)-recordHeader || crc32.Checksum(data[recordHeader:recordHeader+n], walCRC) != binary.LittleEndian.Uint32(data[4:8]) {
			return logs, true
		}
		entries, ok := decodePayload(data[recordHeader : recordHeader+n])
		if !ok {
			return logs, true
		}
		logs = append(logs, entries...)
		data = data[recordHeader+n:]
	}
	return logs, false
}

func decodePayload(p []byte) ([]*raft.Log, bool) {
	r := bytes.NewReader(p)
	var logs []*raft.Log
	for r.Len() > 0 {
		var l raft.Log
		var typ uint64
		var at int64
		var err error
		if l.Index, err = binary.ReadUvarint(r); err != nil {
			return nil, false
		}
		if l.Term, err = binary.ReadUvarint(r); err != nil {
			return nil, false
		}
		if typ, err = binary.ReadUvarint(r); err != nil || typ > 255 {
			return nil, false
		}
		l.Type = raft.LogType(typ)
		if at, err = binary.ReadVarint(r); err != nil {
			return nil, false
		}
		if at != 0 {
			l.AppendedAt = time.Unix(0, at)
		}
		var ok bool
		if l.Data, ok = readBytes(r); !ok {
			return nil, false
		}
		if l.Extensions, ok = readBytes(r); !ok {
			return nil, false
		}
		logs = append(logs, &l)
	}
	return logs, true
}

func readBytes(r *bytes.Reader) ([]byte, bool) {
	n, err := binary.ReadUvarint(r)
	if err != nil || n > uint64(r.Len()) {
		return nil, false
	}
	if n == 0 {
		return nil, true
	}
	b := make([]byte, n)
	_, err = r.Read(b)
	return b, err == nil
}
