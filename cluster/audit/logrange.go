package audit

import (
	"errors"

	"github.com/hashicorp/raft"

	"github.com/gpuplane/gpuplane/cluster/events"
	"github.com/gpuplane/gpuplane/cluster/raftstore"
	"github.com/gpuplane/gpuplane/fsm"
)

// offlineLog is a stopped node's log read through raftstore's read-only
// Reader (OpenOffline), with ranges read and decoded ahead of the applier.
type offlineLog struct {
	*raftstore.Reader
}

var _ events.LogRanger = (*offlineLog)(nil)

// RangeLogs reads and decodes entries on a goroutine of its own, a batch at
// a time, while fn runs on the caller's: a replay's reading (the segments,
// each raft.Log and the protobuf of each Envelope) and applying (the state
// machine) then take a core each. A few batches are in flight at most, so
// memory stays flat whatever the range. Data and Extensions are the mapped
// segment files, not copies, valid until the Reader closes.
func (b *offlineLog) RangeLogs(from, to uint64, ahead func([]fsm.Entry), fn func(*raft.Log, *fsm.Entry) error) (err error) {
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
		return b.readRange(from, to, &logBatch{dec: &fsm.Decoder{}}, func(batch *logBatch) (*logBatch, error) {
			err := apply(batch)
			batch.reset()
			return batch, err
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
	stop := make(chan struct{}) // closed by the applier: read no more
	done := make(chan error, 1)
	go func() {
		err := b.readRange(from, to, newLogBatch(names), func(batch *logBatch) (*logBatch, error) {
			full <- batch // never blocks: at most rangeBatches exist
			select {
			case next := <-free:
				return next, nil
			case <-stop:
				return nil, errRangeStopped
			}
		})
		close(full)
		done <- err
	}()
	defer func() {
		// However the applier leaves (done, failed, panicked), stop the
		// reader and wait for it.
		close(stop)
		for range full {
		}
		if rerr := <-done; err == nil && !errors.Is(rerr, errRangeStopped) {
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
func (b *offlineLog) readRange(from, to uint64, batch *logBatch, emit func(*logBatch) (*logBatch, error)) error {
	var emitErr error
	err := b.Range(from, to, func(l *raft.Log) error {
		batch.logs = append(batch.logs, *l)
		var e fsm.Entry
		if l.Type == raft.LogCommand {
			e = batch.dec.DecodeEntry(l.Data)
		}
		batch.entries = append(batch.entries, e)
		if len(batch.logs) == rangeBatch || l.Index == to {
			batch, emitErr = emit(batch)
			return emitErr
		}
		return nil
	})
	if err != nil && emitErr == nil && len(batch.logs) > 0 {
		if _, eerr := emit(batch); eerr != nil {
			return eerr
		}
	}
	return err
}
