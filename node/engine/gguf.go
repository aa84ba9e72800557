package engine

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
)

// ggufShape is what sizing a llama.cpp context needs of a GGUF model: its
// trained context and the bytes one token of KV cache takes.
type ggufShape struct {
	Arch          string
	ContextLength uint64 // {arch}.context_length (0: absent)
	Layers        uint64 // {arch}.block_count
	// HeadsKV is {arch}.attention.head_count_kv (else head_count); KeyLen
	// and ValueLen attention.key_length and value_length (else the
	// embedding length over the heads).
	HeadsKV, KeyLen, ValueLen uint64
	FileBytes                 uint64
}

// KVBytesPerToken is one token's K and V in every layer at f16,
// llama-server's default cache type (a quantized cache takes less).
func (g ggufShape) KVBytesPerToken() uint64 {
	return 2 * g.Layers * g.HeadsKV * (g.KeyLen + g.ValueLen)
}

// readGGUFShape reads the metadata of the GGUF file at path (version 2 or
// 3), not its tensors.
func readGGUFShape(path string) (ggufShape, error) {
	f, err := os.Open(path)
	if err != nil {
		return ggufShape{}, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return ggufShape{}, err
	}
	r := &ggufReader{r: bufio.NewReaderSize(f, 1<<16)}
	if magic := r.u32(); magic != 0x46554747 {
		return ggufShape{}, fmt.Errorf("%s is not a GGUF file", path)
	}
	if v := r.u32(); v < 2 || v > 3 {
		return ggufShape{}, fmt.Errorf("%s: GGUF version %d (want 2 or 3)", path, v)
	}
	r.u64() // tensors
	n := r.u64()
	g := ggufShape{FileBytes: uint64(fi.Size())}
	ints := map[string]uint64{}
	for i := uint64(0); i < n && r.err == nil; i++ {
		key := r.str()
		typ := r.u32()
		if typ == ggufString && key == "general.architecture" {
			g.Arch = r.str()
			continue
		}
		if v, ok := r.scalar(typ); ok {
			ints[key] = v
		}
	}
	if r.err != nil {
		return ggufShape{}, fmt.Errorf("%s: %w", path, r.err)
	}
	if g.Arch == "" {
		return ggufShape{}, fmt.Errorf("%s: no general.architecture", path)
	}
	a := g.Arch + "."
	g.ContextLength = ints[a+"context_length"]
	g.Layers = ints[a+"block_count"]
	embedding, heads := ints[a+"embedding_length"], ints[a+"attention.head_count"]
	g.HeadsKV = heads
	if v, ok := ints[a+"attention.head_count_kv"]; ok && v > 0 {
		g.HeadsKV = v
	}
	if heads > 0 {
		g.KeyLen = embedding / heads
	}
	if v, ok := ints[a+"attention.key_length"]; ok && v > 0 {
		g.KeyLen = v
	}
	g.ValueLen = g.KeyLen
	if v, ok := ints[a+"attention.value_length"]; ok && v > 0 {
		g.ValueLen = v
	}
	if g.Layers == 0 || g.HeadsKV == 0 || g.KeyLen == 0 {
		return ggufShape{}, fmt.Errorf("%s: no %sblock_count or attention heads to size the KV cache by", path, a)
	}
	return g, nil
}

// GGUF value types.
const (
	ggufUint8 = iota
	ggufInt8
	ggufUint16
	ggufInt16
	ggufUint32
	ggufInt32
	ggufFloat32
	ggufBool
	ggufString
	ggufArray
	ggufUint64
	ggufInt64
	ggufFloat64
)

type ggufReader struct {
	r   *bufio.Reader
	err error
}

func (r *ggufReader) read(n int) []byte {
	if r.err != nil {
		return make([]byte, n)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r.r, b); err != nil {
		r.err = err
	}
	return b
}

func (r *ggufReader) u32() uint32 { return binary.LittleEndian.Uint32(r.read(4)) }
func (r *ggufReader) u64() uint64 { return binary.LittleEndian.Uint64(r.read(8)) }

func (r *ggufReader) str() string {
	n := r.u64()
	if n > 1<<24 {
		r.err = errors.New("a metadata string longer than 16 MiB")
		return ""
	}
	return strings.Clone(string(r.read(int(n))))
}

func (r *ggufReader) skip(n uint64) {
	if r.err == nil {
		if _, err := r.r.Discard(int(n)); err != nil {
			r.err = err
		}
	}
}

// scalar reads a value of typ: an unsigned integer's value (ok), or
// skips anything else.
func (r *ggufReader) scalar(typ uint32) (uint64, bool) {
	switch typ {
	case ggufUint8, ggufInt8, ggufBool:
		return uint64(r.read(1)[0]), typ == ggufUint8
	case ggufUint16, ggufInt16:
		return uint64(binary.LittleEndian.Uint16(r.read(2))), typ == ggufUint16
	case ggufUint32:
		return uint64(r.u32()), true
	case ggufInt32:
		v := int32(r.u32())
		return uint64(max(v, 0)), v >= 0
	case ggufFloat32:
		r.skip(4)
	case ggufUint64:
		return r.u64(), true
	case ggufInt64:
		v := int64(r.u64())
		return uint64(max(v, 0)), v >= 0
	case ggufFloat64:
		r.skip(8)
	case ggufString:
		r.skip(r.u64())
	case ggufArray:
		et, n := r.u32(), r.u64()
		if et == ggufArray {
			r.err = errors.New("nested metadata arrays")
			return 0, false
		}
		for i := uint64(0); i < n && r.err == nil; i++ {
			r.scalar(et)
		}
	default:
		r.err = fmt.Errorf("metadata value type %d", typ)
	}
	return 0, false
}
