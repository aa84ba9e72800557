package cluster

import (
	"encoding/binary"
	"time"

	"github.com/hashicorp/raft"
)

// decodeStoredLog decodes one raft.Log as raft-boltdb/v2 stores it with its
// default options: a msgpack map (go-msgpack's default MsgpackHandle, so
// strings and byte slices as "raw" str types, no bin or ext) keyed by the
// field names Index, Term, Type, Data, Extensions and AppendedAt, AppendedAt
// being time.Time's MarshalBinary form in a fixstr (TimeNotBuiltin, the
// store's default) or nil for the zero time.
//
// It is the offline replay's fast path: the library decoder spends most of
// its time in reflection. It reports false for anything it does not
// recognise exactly (another key, a type or width it does not handle, a
// truncated value, the new time format, an empty byte string), and the
// caller then decodes the entry with the library, so the result is always
// what go-msgpack would decode. l must be zeroed by the caller. Data and
// Extensions are copied out of v (bbolt's memory) with alloc, or with a nil
// alloc alias v, for a caller done with them before v goes.
func decodeStoredLog(v []byte, l *raft.Log, alloc *byteSlab) bool {
	if len(v) == 0 {
		return false
	}
	n := 0
	switch b := v[0]; {
	case b >= 0x80 && b <= 0x8f: // fixmap
		n = int(b & 0x0f)
		v = v[1:]
	default:
		return false
	}
	var seen uint8
	for range n {
		key, rest, ok := mpRaw(v)
		if !ok {
			return false
		}
		v = rest
		var bit uint8
		switch string(key) {
		case "Index":
			bit = 1
			l.Index, v, ok = mpUint(v)
		case "Term":
			bit = 2
			l.Term, v, ok = mpUint(v)
		case "Type":
			bit = 4
			var t uint64
			t, v, ok = mpUint(v)
			ok = ok && t <= 0xff
			l.Type = raft.LogType(t)
		case "Data":
			bit = 8
			l.Data, v, ok = mpBytes(v, alloc)
		case "Extensions":
			bit = 16
			l.Extensions, v, ok = mpBytes(v, alloc)
		case "AppendedAt":
			bit = 32
			l.AppendedAt, v, ok = mpTime(v)
		default:
			return false
		}
		if !ok || seen&bit != 0 {
			return false
		}
		seen |= bit
	}
	return len(v) == 0
}

// mpRaw reads a msgpack raw string (fixstr, str8, str16, str32) and returns
// it aliasing v.
func mpRaw(v []byte) (s, rest []byte, ok bool) {
	if len(v) == 0 {
		return nil, nil, false
	}
	var n, h int
	switch b := v[0]; {
	case b >= 0xa0 && b <= 0xbf:
		n, h = int(b&0x1f), 1
	case b == 0xd9 && len(v) >= 2:
		n, h = int(v[1]), 2
	case b == 0xda && len(v) >= 3:
		n, h = int(binary.BigEndian.Uint16(v[1:])), 3
	case b == 0xdb && len(v) >= 5:
		n, h = int(binary.BigEndian.Uint32(v[1:])), 5
	default:
		return nil, nil, false
	}
	if len(v)-h < n {
		return nil, nil, false
	}
	return v[h : h+n], v[h+n:], true
}

// mpUint reads a non-negative msgpack integer in the forms go-msgpack writes
// unsigned values (positive fixint, uint8..uint64).
func mpUint(v []byte) (u uint64, rest []byte, ok bool) {
	if len(v) == 0 {
		return 0, nil, false
	}
	switch b := v[0]; {
	case b <= 0x7f:
		return uint64(b), v[1:], true
	case b == 0xcc && len(v) >= 2:
		return uint64(v[1]), v[2:], true
	case b == 0xcd && len(v) >= 3:
		return uint64(binary.BigEndian.Uint16(v[1:])), v[3:], true
	case b == 0xce && len(v) >= 5:
		return uint64(binary.BigEndian.Uint32(v[1:])), v[5:], true
	case b == 0xcf && len(v) >= 9:
		return binary.BigEndian.Uint64(v[1:]), v[9:], true
	}
	return 0, nil, false
}

// mpBytes reads a []byte field: nil, or a non-empty raw string copied with
// alloc (nil: aliasing v). (An empty one is left to the library, whose
// nil-or-empty choice it does not repeat.)
func mpBytes(v []byte, alloc *byteSlab) (b, rest []byte, ok bool) {
	if len(v) > 0 && v[0] == 0xc0 {
		return nil, v[1:], true
	}
	s, rest, ok := mpRaw(v)
	if !ok || len(s) == 0 {
		return nil, nil, false
	}
	if alloc == nil {
		return s[:len(s):len(s)], rest, true
	}
	return alloc.copy(s), rest, true
}

// mpTime reads AppendedAt as go-msgpack decodes a time.Time written with
// TimeNotBuiltin: nil is the zero time, a fixstr is time.Time's binary form.
func mpTime(v []byte) (t time.Time, rest []byte, ok bool) {
	if len(v) == 0 {
		return t, nil, false
	}
	if v[0] == 0xc0 {
		return t, v[1:], true
	}
	if v[0] < 0xa0 || v[0] > 0xbf {
		return t, nil, false
	}
	s, rest, ok := mpRaw(v)
	if !ok || t.UnmarshalBinary(s) != nil {
		return time.Time{}, nil, false
	}
	return t, rest, true
}

// byteSlab hands out copies of small byte slices carved from shared chunks,
// one allocation per chunk rather than per slice. Each copy is capped at its
// length (appending to it reallocates), so callers may keep and use copies
// independently; a chunk lives as long as any copy in it does.
type byteSlab struct {
	buf []byte
}

const byteSlabChunk = 256 << 10

func (a *byteSlab) copy(s []byte) []byte {
	n := len(s)
	if n > byteSlabChunk/8 {
		return append([]byte(nil), s...)
	}
	if len(a.buf) < n {
		a.buf = make([]byte, byteSlabChunk)
	}
	b := a.buf[:n:n]
	copy(b, s)
	a.buf = a.buf[n:]
	return b
}
