package auditrec

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
)

// HashesFile, in the raft dir, records the hash chain head the live state
// machine computed after each command entry it applied.
const HashesFile = "hashes"

const hashSize = sha256.Size

// Hashes is the per-entry record that lets `audit verify` name the first
// entry of a log that no longer hashes the way it did when it was applied
// (a log altered on disk), offline as well as live. The hash chain alone only
// says that some entry up to a snapshot's index changed.
//
// The file holds one 32-byte record per log index, at offset (index-1)*32;
// an all-zero record means "not recorded" (no-ops, barriers, configuration
// changes, or entries applied before the file existed). Records are written
// once: when an entry is applied again (a restart replays the entries after
// the latest snapshot) a different hash is reported and the first one kept,
// so replaying an altered log cannot launder the record. The file is not
// fsynced: it is derived data, and a record lost in a crash only means that
// entry is checked against the chain heads instead.
type Hashes struct {
	f   *os.File
	log *slog.Logger
	// pending holds records of the batch being applied, flushed together.
	pending []hashRecord
	// size is how long the file is, as far as this process knows: records
	// past it are all zero and need not be read before they are written
	// (the usual case: the newest entries).
	size int64
	// failing counts records lost since writes began to fail (a full
	// disk): the failure is logged once, and the recovery once, instead
	// of once per entry applied.
	failing int
	// firstLost is the index of the first record lost in this outage.
	firstLost uint64
}

type hashRecord struct {
	index uint64
	hash  [hashSize]byte
}

// OpenHashes opens (or, unless readOnly, creates) the record file. A
// read-only open of a missing file gives a log that records nothing.
func OpenHashes(path string, readOnly bool, log *slog.Logger) (*Hashes, error) {
	flag := os.O_RDWR | os.O_CREATE
	if readOnly {
		flag = os.O_RDONLY
	}
	f, err := os.OpenFile(path, flag, 0o600)
	if readOnly && errors.Is(err, fs.ErrNotExist) {
		return &Hashes{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open entry hashes: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("open entry hashes: %w", err)
	}
	if log == nil {
		log = slog.Default()
	}
	return &Hashes{f: f, log: log, size: st.Size()}, nil
}

// LastRecorded is the highest entry index the file may hold a record for
// (its length in records).
func (h *Hashes) LastRecorded() uint64 {
	if h == nil || h.f == nil {
		return 0
	}
	return uint64(h.size / hashSize)
}

// Close closes the file.
func (h *Hashes) Close() error {
	if h == nil || h.f == nil {
		return nil
	}
	return h.f.Close()
}

// Add queues the hash head after entry index; Flush writes the queue.
func (h *Hashes) Add(index uint64, head [hashSize]byte) {
	if h == nil || h.f == nil || index == 0 {
		return
	}
	h.pending = append(h.pending, hashRecord{index, head})
}

// Flush writes the queued records, one write per run of consecutive indexes.
// A record already on file is kept; a different new one is logged, because
// it means the entry was altered after it was first applied.
func (h *Hashes) Flush() {
	if h == nil || h.f == nil || len(h.pending) == 0 {
		return
	}
	recs := h.pending
	h.pending = h.pending[:0]
	for start := 0; start < len(recs); {
		end := start + 1
		for end < len(recs) && recs[end].index == recs[end-1].index+1 {
			end++
		}
		h.writeRun(recs[start:end])
		start = end
	}
}

func (h *Hashes) writeRun(run []hashRecord) {
	off := int64(run[0].index-1) * hashSize
	buf := make([]byte, len(run)*hashSize)
	if off < h.size {
		n, err := h.f.ReadAt(buf[:min(int64(len(buf)), h.size-off)], off)
		if err != nil && !errors.Is(err, io.EOF) {
			h.log.Error("read entry hashes", "index", run[0].index, "err", err)
			return
		}
		clear(buf[n:])
	}
	var zero [hashSize]byte
	for i, r := range run {
		rec := buf[i*hashSize : (i+1)*hashSize]
		switch {
		case bytes.Equal(rec, zero[:]):
			copy(rec, r.hash[:])
		case !bytes.Equal(rec, r.hash[:]):
			h.log.Error("log entry hashes differently than when it was first applied: the log was altered on disk; run 'gpuplane audit verify'",
				"index", r.index, "first", hex.EncodeToString(rec), "now", hex.EncodeToString(r.hash[:]))
		}
	}
	if _, err := h.f.WriteAt(buf, off); err != nil {
		if h.failing == 0 {
			h.firstLost = run[0].index
			h.log.Error("write entry hashes; records are skipped (those entries are checked against the chain heads) until a write succeeds",
				"index", run[0].index, "err", err)
		}
		h.failing += len(run)
		return
	}
	if h.failing > 0 {
		h.log.Warn("entry hashes written again", "index", run[0].index,
			"skipped", h.failing, "firstSkipped", h.firstLost)
		h.failing = 0
	}
	h.size = max(h.size, off+int64(len(buf)))
}

// At returns the recorded hash head after entry index, "" when none.
func (h *Hashes) At(index uint64) (string, error) {
	if h == nil || h.f == nil || index == 0 {
		return "", nil
	}
	var rec [hashSize]byte
	_, err := h.f.ReadAt(rec[:], int64(index-1)*hashSize)
	if errors.Is(err, io.EOF) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read entry hash %d: %w", index, err)
	}
	if rec == [hashSize]byte{} {
		return "", nil
	}
	return hex.EncodeToString(rec[:]), nil
}

// HashReader reads records in index order, a chunk at a time.
type HashReader struct {
	h     *Hashes
	start uint64 // index of the first record in buf
	buf   []byte
}

const hashChunk = 8192

// Reader returns a reader of the records in index order.
func (h *Hashes) Reader() *HashReader { return &HashReader{h: h} }

// At returns the recorded hash after entry index, "" when none.
func (r *HashReader) At(index uint64) (string, error) {
	if r.h == nil || r.h.f == nil || index == 0 {
		return "", nil
	}
	if index < r.start || index >= r.start+uint64(len(r.buf)/hashSize) || r.start == 0 {
		buf := make([]byte, hashChunk*hashSize)
		n, err := r.h.f.ReadAt(buf, int64(index-1)*hashSize)
		if err != nil && !errors.Is(err, io.EOF) {
			return "", fmt.Errorf("read entry hashes at %d: %w", index, err)
		}
		r.start, r.buf = index, buf[:n-n%hashSize]
		if len(r.buf) == 0 {
			return "", nil
		}
	}
	off := (index - r.start) * hashSize
	rec := r.buf[off : off+hashSize]
	if bytes.Equal(rec, make([]byte, hashSize)) {
		return "", nil
	}
	return hex.EncodeToString(rec), nil
}
