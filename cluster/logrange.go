package cluster

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/hashicorp/go-msgpack/v2/codec"
	"github.com/hashicorp/raft"
	"go.etcd.io/bbolt"

	"github.com/gpuplane/gpuplane/fsm"
)

// logRanger is a LogReader that can also read a run of entries in one pass.
// The Cursor uses it when the log offers it: replaying a million entries one
// GetLog at a time costs a bolt transaction, a B-tree descent and a fresh
// msgpack decoder (with its type caches) per entry, which is most of the
// reading cost.
type logRanger interface {
	LogReader
	// RangeLogs calls fn with the entries from..to in index order, stopping at
	// the first error fn returns. With a command entry comes its Envelope
	// decoded ahead (fsm.DecodeEntry of l.Data, for fsm.ApplyEntry), nil
	// with any other. fn may keep none of l, e, e's messages (which may be
	// recycled for later entries) or l.Data (which may be the store's
	// memory) once it returns. A missing index is
	// raft.ErrLogNotFound. ahead, unless nil, is called with each run of
	// entries before fn sees them (zero for entries that are not commands),
	// to prefetch what applying them will read.
	RangeLogs(from, to uint64, ahead func([]fsm.Entry), fn func(l *raft.Log, e *fsm.Entry) error) error
}

// boltLogs reads raft-boltdb/v2's log bucket of a bbolt file directly: the
// offline reader (OpenOffline), which owns the file read-only, so the store's
// own code never runs on it. The format is raft-boltdb's: key the index as
// 8 big-endian bytes, value the raft.Log in msgpack, decoded here with the
// same codec and default handle raft-boltdb uses.
type boltLogs struct {
	db *bbolt.DB
}

var (
	boltLogsBucket = []byte("logs") // raft-boltdb's dbLogs
	// msgpackHandle is shared by every decoder: a handle caches per-type
	// decoding plans, so reusing one (it is safe for concurrent use once
	// configured) is what makes decoding cheap. raft-boltdb builds a new one
	// per GetLog; decoding is the same, its options being the defaults.
	msgpackHandle = &codec.MsgpackHandle{}
)

var _ logRanger = (*boltLogs)(nil)

func (b *boltLogs) FirstIndex() (uint64, error) { return b.edge(true) }
func (b *boltLogs) LastIndex() (uint64, error)  { return b.edge(false) }

func (b *boltLogs) edge(first bool) (uint64, error) {
	var idx uint64
	err := b.db.View(func(tx *bbolt.Tx) error {
		bk := tx.Bucket(boltLogsBucket)
		if bk == nil {
			return nil
		}
		var k []byte
		if first {
			k, _ = bk.Cursor().First()
		} else {
			k, _ = bk.Cursor().Last()
		}
		if len(k) == 8 {
			idx = binary.BigEndian.Uint64(k)
		}
		return nil
	})
	return idx, err
}

func (b *boltLogs) GetLog(index uint64, l *raft.Log) error {
	return b.db.View(func(tx *bbolt.Tx) error {
		bk := tx.Bucket(boltLogsBucket)
		if bk == nil {
			return raft.ErrLogNotFound
		}
		var key [8]byte
		binary.BigEndian.PutUint64(key[:], index)
		val := bk.Get(key[:])
		if val == nil {
			return raft.ErrLogNotFound
		}
		*l = raft.Log{}
		// The hand-written decoder first, as readRange does (the library
		// decodes by reflection); its slices alias bbolt's memory, valid
		// only in this transaction, so they are copied out.
		if decodeStoredLog(val, l, nil) {
			l.Data, l.Extensions = bytes.Clone(l.Data), bytes.Clone(l.Extensions)
			return nil
		}
		*l = raft.Log{}
		return codec.NewDecoderBytes(val, msgpackHandle).Decode(l)
	})
}

// RangeLogs reads and decodes entries on a goroutine of its own, a batch at
// a time, while fn runs on the caller's: a replay's reading (the bbolt
// cursor, the msgpack of each raft.Log and the protobuf of each Envelope) and
// applying (the state machine) then take a core each. A few batches are in
// flight at most, so memory stays flat whatever the range. Data and
// Extensions are bbolt's memory, not copies: the read transaction stays open
// until fn has seen the last entry.
func (b *boltLogs) RangeLogs(from, to uint64, ahead func([]fsm.Entry), fn func(*raft.Log, *fsm.Entry) error) (err error) {
	if from > to {
		return nil
	}
	apply := func(batch *logBatch) error {
		n := len(batch.logs)
		for i := range n {
			// Prefetch a short way ahead: far enough for the loads to
			// overlap, near enough that they are still cached when used.
			if ahead != nil && i%prefetchAhead == 0 {
				if i == 0 {
					ahead(batch.entries[:min(prefetchAhead, n)])
				}
				ahead(batch.entries[min(i+prefetchAhead, n):min(i+2*prefetchAhead, n)])
			}
			if err := fn(&batch.logs[i], batch.entry(i)); err != nil {
				return err
			}
		}
		return nil
	}
	if to-from < rangeBatch {
		// Too few to be worth a goroutine (an event stream's next few).
		return b.db.View(func(tx *bbolt.Tx) error {
			return b.readRange(tx, from, to, &logBatch{dec: &fsm.Decoder{}}, func(batch *logBatch) (*logBatch, error) {
				err := apply(batch)
				batch.reset()
				return batch, err
			})
		})
	}
	// rangeBatches batches circulate: filled by the reader, applied, handed
	// back through free. The reader waits for a free one, so the applier can
	// lag by all of them but no more.
	full := make(chan *logBatch, rangeBatches)
	free := make(chan *logBatch, rangeBatches)
	names := &fsm.Decoder{Slab: rangeBatch} // the batches' decoders share its names
	for range rangeBatches - 1 {
		free <- newLogBatch(names)
	}
	stop := make(chan struct{})     // closed by the applier: read no more
	consumed := make(chan struct{}) // closed by the applier: done with every entry
	done := make(chan error, 1)
	go func() {
		done <- b.db.View(func(tx *bbolt.Tx) error {
			err := b.readRange(tx, from, to, newLogBatch(names), func(batch *logBatch) (*logBatch, error) {
				full <- batch // never blocks: at most rangeBatches exist
				select {
				case next := <-free:
					return next, nil
				case <-stop:
					return nil, errRangeStopped
				}
			})
			close(full)
			// The entries alias the transaction's memory: keep it until
			// the applier is through with them.
			<-consumed
			return err
		})
	}()
	defer func() {
		// However the applier leaves (done, failed, panicked), stop the
		// reader and release it: its open transaction would keep the
		// database from closing.
		close(stop)
		for range full {
		}
		close(consumed)
		if rerr := <-done; err == nil {
			err = rerr
		}
	}()
	for batch := range full {
		if err := apply(batch); err != nil {
			return err
		}
		batch.reset()
		free <- batch
	}
	return nil
}

var errRangeStopped = errors.New("range stopped")

// rangeBatch entries are read and decoded together, and rangeBatches such
// batches may wait to be applied: enough to ride out the moments when one
// side stalls (a collection, a page fault, another process on its core).
// The applier prefetches prefetchAhead entries ahead.
const (
	rangeBatch    = 256
	rangeBatches  = 16
	prefetchAhead = 32
)

// logBatch is a run of entries read by readRange, each command with its
// decoded Envelope. Its Decoder decodes them, and recycles their messages
// when the batch is reset, applied (see fsm.Decoder.Reset): a replay then
// allocates no message for most entries.
type logBatch struct {
	logs    []raft.Log
	entries []fsm.Entry
	dec     *fsm.Decoder
}

// newLogBatch returns an empty batch whose Decoder is a sibling of names'.
func newLogBatch(names *fsm.Decoder) *logBatch {
	return &logBatch{logs: make([]raft.Log, 0, rangeBatch), entries: make([]fsm.Entry, 0, rangeBatch), dec: names.Sibling()}
}

func (b *logBatch) entry(i int) *fsm.Entry {
	if b.logs[i].Type != raft.LogCommand {
		return nil
	}
	return &b.entries[i]
}

// reset empties the batch once its entries have been applied.
func (b *logBatch) reset() {
	clear(b.logs)
	clear(b.entries)
	b.logs, b.entries = b.logs[:0], b.entries[:0]
	b.dec.Reset()
}

// readRange reads the entries from..to into batches of up to rangeBatch,
// decoding each command's Envelope, starting with batch, and hands each
// batch to emit, which owns it from then on and returns an empty one to fill
// next. At a missing or undecodable entry it emits the entries before it,
// then fails.
func (b *boltLogs) readRange(tx *bbolt.Tx, from, to uint64, batch *logBatch, emit func(*logBatch) (*logBatch, error)) error {
	bk := tx.Bucket(boltLogsBucket)
	if bk == nil {
		return raft.ErrLogNotFound
	}
	var key [8]byte
	binary.BigEndian.PutUint64(key[:], from)
	cur := bk.Cursor()
	dec := codec.NewDecoderBytes(nil, msgpackHandle)
	fail := func(err error) error {
		if len(batch.logs) > 0 {
			if _, eerr := emit(batch); eerr != nil {
				return eerr
			}
		}
		return err
	}
	want := from
	for k, v := cur.Seek(key[:]); want <= to; k, v = cur.Next() {
		if len(k) != 8 || binary.BigEndian.Uint64(k) != want {
			return fail(fmt.Errorf("%w: %d", raft.ErrLogNotFound, want))
		}
		// Decoded in place: a raft.Log handed to the library escapes.
		batch.logs = append(batch.logs, raft.Log{})
		l := &batch.logs[len(batch.logs)-1]
		// The hand-written decoder handles the entries raft-boltdb
		// writes; anything else goes to the library. Either way the
		// entry's bytes are bbolt's, valid while tx is open.
		if !decodeStoredLog(v, l, nil) {
			*l = raft.Log{}
			dec.ResetBytes(v)
			if err := dec.Decode(l); err != nil {
				batch.logs = batch.logs[:len(batch.logs)-1]
				return fail(fmt.Errorf("decode log entry %d: %w", want, err))
			}
		}
		var e fsm.Entry
		if l.Type == raft.LogCommand {
			e = batch.dec.DecodeEntry(l.Data)
		}
		batch.entries = append(batch.entries, e)
		if len(batch.logs) == rangeBatch || want == to {
			var err error
			if batch, err = emit(batch); err != nil {
				return err
			}
		}
		want++
	}
	return nil
}

// openBoltLogs opens a raft.db read-only for boltLogs.
func openBoltLogs(path string, opts *bbolt.Options) (*boltLogs, error) {
	db, err := bbolt.Open(path, 0o600, opts)
	if err != nil {
		return nil, err
	}
	return &boltLogs{db: db}, nil
}

func (b *boltLogs) Close() error { return b.db.Close() }
