package raftstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"path/filepath"

	"github.com/hashicorp/raft-wal/segment"
	"github.com/hashicorp/raft-wal/types"
)

// ErrDamaged is what every *DamageError wraps.
var ErrDamaged = errors.New("raft log damaged")

// DamageError says where a log is damaged: the file, the byte offset in it
// and the first entry index the damage makes unreadable (0 when it is not
// an entry's: the metadata, a file header).
type DamageError struct {
	File   string
	Offset int64
	Index  uint64
	Reason string
}

func (e *DamageError) Error() string {
	at := fmt.Sprintf("%s at offset %d", e.File, e.Offset)
	if e.Index > 0 {
		at += fmt.Sprintf(", entry index %d", e.Index)
	}
	return fmt.Sprintf("%v: %s: %s", ErrDamaged, at, e.Reason)
}

func (e *DamageError) Unwrap() error { return ErrDamaged }

// raft-wal's segment format (its README, "Segment Files"): a 32-byte file
// header, then 8-byte aligned frames, each an 8-byte header (type, three zero
// bytes, then a length or, for a commit frame, a CRC-32C of every byte since
// the previous commit frame, or since the start of the file for the first)
// and its payload padded to 8 bytes. These constants are that documented
// format; the package reads it to check it and never writes it.
const (
	fileHeaderLen  = 32
	frameHeaderLen = 8
	segmentMagic   = 0x58eb6b0d
	segmentVersion = 0
	frameEntry     = 1
	frameIndex     = 2
	frameCommit    = 3
	// sectorSize is the unit a disk writes atomically at best; a write cut
	// short by a power loss leaves whole sectors unwritten.
	sectorSize = 512
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// segScan is what reading one segment through found.
type segScan struct {
	info types.SegmentInfo
	path string
	// offsets are the file offsets of the committed entry frames, in index
	// order: entry info.BaseIndex+i is at offsets[i].
	offsets []uint32
	// indexStart is where a committed index frame's payload starts: the
	// segment is sealed on disk. 0 otherwise.
	indexStart uint64
	// good is the end of the last valid commit frame.
	good int64
	// tornEnd, when past good, ends an unfinished final write after good:
	// bytes [good, tornEnd) were being written when the node stopped and
	// were never acknowledged.
	tornEnd int64
	// missing: the unsealed tail's file is not there (wal-meta.db lists a
	// segment before its file is created).
	missing bool
	// unallocated: the unsealed tail's file is shorter than its size limit
	// and holds nothing but zeros: its creation (the preallocation) never
	// completed, and nothing was ever written to it.
	unallocated bool
}

// lastIndex is the index of the segment's last committed entry (BaseIndex-1
// when it has none).
func (s *segScan) lastIndex() uint64 { return s.info.BaseIndex + uint64(len(s.offsets)) - 1 }

// scanSegment reads a segment file's bytes through and checks them. sealed
// says whether wal-meta.db records the segment as sealed: then every byte up
// to its index must be intact. The unsealed tail may end in an unfinished
// write; anything else unreadable is a *DamageError.
func scanSegment(path string, data []byte, info types.SegmentInfo, sealed bool) (*segScan, error) {
	s := &segScan{info: info, path: path}
	size := int64(len(data))
	damage := func(off int64, reason string, args ...any) error {
		return &DamageError{File: path, Offset: off, Index: info.BaseIndex + uint64(len(s.offsets)), Reason: fmt.Sprintf(reason, args...)}
	}

	var (
		off        = int64(fileHeaderLen)
		batchStart int64
		pending    []uint32
		pendingIdx int64 // offset of an index frame in the current batch
		stopAt     int64 = -1
		stop       string
		atZeros    bool       // the walk stopped at an all-zero frame header
		atEOF      bool       // the walk stopped at a frame running past the end of the file
		lastFrame  int64 = -1 // the last frame header read after the last commit
	)
walk:
	for {
		if off+frameHeaderLen > size {
			stopAt, stop = min(off, size), "the file ends inside a frame header"
			break
		}
		h := data[off : off+frameHeaderLen]
		typ, word := h[0], binary.LittleEndian.Uint32(h[4:8])
		if typ == 0 && word == 0 && h[1]|h[2]|h[3] == 0 {
			stopAt, stop, atZeros = off, "zeros (nothing written)", true
			break
		}
		if h[1]|h[2]|h[3] != 0 || typ == 0 || typ > frameCommit {
			stopAt, stop = off, fmt.Sprintf("unreadable frame header % x", h)
			break
		}
		lastFrame = off
		switch typ {
		case frameEntry, frameIndex:
			n := int64(word)
			end := off + frameHeaderLen + n + int64(padLen(n))
			if n > segment.MaxEntrySize {
				stopAt, stop = off, fmt.Sprintf("frame length %d is larger than any entry", n)
				break walk
			}
			if end > size {
				stopAt, stop, atEOF = off, fmt.Sprintf("frame length %d runs past the end of the file (%d bytes)", n, size), true
				break walk
			}
			if typ == frameEntry {
				pending = append(pending, uint32(off))
			} else {
				pendingIdx = off
			}
			off = end
		case frameCommit:
			if got := crc32.Checksum(data[batchStart:off], castagnoli); got != word {
				stopAt, stop = off, fmt.Sprintf("checksum mismatch (CRC-32C %08x, commit frame says %08x) over bytes %d..%d", got, word, batchStart, off)
				break walk
			}
			s.offsets = append(s.offsets, pending...)
			pending = pending[:0]
			off += frameHeaderLen
			batchStart, s.good, lastFrame = off, off, -1
			if pendingIdx > 0 {
				s.indexStart = uint64(pendingIdx + frameHeaderLen)
				if err := checkIndexFrame(data, pendingIdx, s.offsets); err != nil {
					return nil, damage(pendingIdx, "%v", err)
				}
				// Nothing is appended to a sealed segment.
				break walk
			}
		}
	}

	if s.good > 0 {
		if err := checkHeader(data, info); err != nil {
			return nil, &DamageError{File: path, Offset: 0, Index: info.BaseIndex, Reason: err.Error()}
		}
	}

	if sealed {
		switch {
		case s.indexStart == 0:
			at := stopAt
			if at < 0 {
				at = s.good
			}
			return nil, damage(at, "sealed segment unreadable before its index: %s", stop)
		case s.indexStart != info.IndexStart:
			return nil, damage(int64(s.indexStart), "index frame at %d, wal-meta.db records %d", s.indexStart, info.IndexStart)
		case info.MaxIndex > s.lastIndex():
			return nil, damage(s.good, "segment holds entries %d..%d, wal-meta.db records up to %d", info.BaseIndex, s.lastIndex(), info.MaxIndex)
		}
		return s, nil
	}

	if s.indexStart > 0 {
		// Sealed on disk, but the rotation that records it did not finish
		// (a crash, or no space for the next segment): Open finishes it.
		return s, nil
	}
	if info.SizeLimit > 0 && size < int64(info.SizeLimit) {
		// raft-wal preallocates every segment to its size limit before
		// it writes to it, and the first fsync makes the size durable: a
		// shorter file with anything written in it lost its end. One of
		// zeros only is a creation that never completed (a crash, or a
		// full disk, during the preallocation): nothing was written to
		// it, so nothing acknowledged is lost. (An emptied file looks the
		// same; the cluster checks the log's length against what it
		// applied.)
		if lastNonZero(data, 0) < 0 {
			s.unallocated = true
			return s, nil
		}
		return nil, damage(size, "the file is %d bytes, shorter than the %d it was created with: truncated", size, info.SizeLimit)
	}
	last := lastNonZero(data, s.good)
	if last < 0 {
		return s, nil // nothing after the last commit
	}
	if unfinishedWrite(data, s.good, last, stopAt, atZeros, atEOF, lastFrame) {
		s.tornEnd = last + 1
		return s, nil
	}
	if stopAt < 0 {
		stopAt = s.good
	}
	return nil, damage(stopAt, "%s, after which the newest batch was written in full (no unwritten sector): damage, not an unfinished write; entries from this index on were acknowledged and are unreadable", stop)
}

// unfinishedWrite tells whether the bytes [from, last] after a segment's last
// valid commit (last is the last non-zero byte) are a write the node never
// finished, so never acknowledged, rather than damage to one it did.
// raft-wal writes each batch with one write, then one fsync, into space
// preallocated with zeros (a batch may run past it, growing the file); a
// power loss during that write loses whole sectors of it, which read as
// zeros, and a full disk cuts a write that grows the file at its end. So,
// much as etcd's WAL decides for its torn entries:
//
//   - When the walk from `from` stopped at an all-zero frame header beyond
//     last (the write's frames, then nothing), the write was cut short: the
//     bytes of that header's sector before it must be unwritten too.
//   - When it stopped at a frame running past the end of the file, the
//     write was cut at the file's end.
//   - In both, the last byte written must not be a commit frame's (a batch
//     whose commit frame is on disk was written to its end; a frame length
//     reaching past it is damage), unless it is the header of the frame
//     that was cut.
//   - Otherwise (an unreadable frame, a checksum mismatch, zeros with
//     written bytes after them) some sector inside [from, last] must be
//     unwritten: a batch written in full that does not check out was
//     damaged after it was synced.
func unfinishedWrite(data []byte, from, last, stop int64, atZeros, atEOF bool, lastFrame int64) bool {
	size := int64(len(data))
	if atZeros && stop > last || atEOF {
		if atZeros && !allZero(data[max(from, stop&^(sectorSize-1)):stop]) {
			return false
		}
		slot := last &^ (frameHeaderLen - 1)
		if slot == lastFrame {
			return atZeros || last >= size-frameHeaderLen
		}
		h := data[slot:]
		commitLike := len(h) >= frameHeaderLen && h[0] == frameCommit && h[1]|h[2]|h[3] == 0
		return !commitLike
	}
	for sec := from &^ (sectorSize - 1); sec <= last; sec += sectorSize {
		lo, hi := max(sec, from), min(sec+sectorSize, last+1)
		if allZero(data[lo:hi]) {
			return true
		}
	}
	return false
}

func checkHeader(data []byte, info types.SegmentInfo) error {
	if len(data) < fileHeaderLen {
		return fmt.Errorf("file header cut short")
	}
	h := data[:fileHeaderLen]
	if binary.LittleEndian.Uint32(h[0:4]) != segmentMagic || h[4]|h[5]|h[6] != 0 || h[7] != segmentVersion {
		return fmt.Errorf("not a raft-wal segment header (magic/version % x)", h[:8])
	}
	base, id, codec := binary.LittleEndian.Uint64(h[8:16]), binary.LittleEndian.Uint64(h[16:24]), binary.LittleEndian.Uint64(h[24:32])
	if base != info.BaseIndex || id != info.ID || codec != info.Codec {
		return fmt.Errorf("file header says base index %d, id %x, codec %d; wal-meta.db says %d, %x, %d", base, id, codec, info.BaseIndex, info.ID, info.Codec)
	}
	return nil
}

// checkIndexFrame checks a sealed segment's index frame against the entry
// frames found reading through it.
func checkIndexFrame(data []byte, at int64, offsets []uint32) error {
	n := int64(binary.LittleEndian.Uint32(data[at+4 : at+8]))
	if n != int64(len(offsets))*4 {
		return fmt.Errorf("index frame lists %d entries, the segment holds %d", n/4, len(offsets))
	}
	p := data[at+frameHeaderLen:]
	for i, o := range offsets {
		if got := binary.LittleEndian.Uint32(p[i*4:]); got != o {
			return fmt.Errorf("index frame puts entry %d at offset %d, it is at %d", i, got, o)
		}
	}
	return nil
}

func padLen(n int64) int64 { return (frameHeaderLen - n%frameHeaderLen) % frameHeaderLen }

func allZero(b []byte) bool {
	for len(b) >= 8 {
		if binary.LittleEndian.Uint64(b) != 0 {
			return false
		}
		b = b[8:]
	}
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// lastNonZero returns the offset of the last non-zero byte at or after from,
// or -1.
func lastNonZero(data []byte, from int64) int64 {
	const chunk = 64 << 10
	for end := int64(len(data)); end > from; {
		lo := max(from, end-chunk)
		if !allZero(data[lo:end]) {
			for j := end - 1; ; j-- {
				if data[j] != 0 {
					return j
				}
			}
		}
		end = lo
	}
	return -1
}

// segmentPath is where raft-wal keeps a segment's file.
func segmentPath(dir string, info types.SegmentInfo) string {
	return filepath.Join(dir, segment.FileName(info))
}

// checkChain checks that the segments wal-meta.db lists follow each other.
func checkChain(metaPath string, segs []types.SegmentInfo) error {
	for i := 1; i < len(segs); i++ {
		prev, cur := segs[i-1], segs[i]
		if prev.SealTime.IsZero() {
			return &DamageError{File: metaPath, Reason: fmt.Sprintf("segment %x is not the last but is not sealed", prev.ID)}
		}
		if cur.BaseIndex != prev.MaxIndex+1 {
			return &DamageError{File: metaPath, Index: prev.MaxIndex + 1, Reason: fmt.Sprintf("segment %x ends at index %d but the next, %x, starts at %d", prev.ID, prev.MaxIndex, cur.ID, cur.BaseIndex)}
		}
	}
	return nil
}
