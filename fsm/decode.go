package fsm

import (
	"hash/maphash"
	"unicode/utf8"
	"unsafe"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// Decoder decodes log entries' Envelopes (DecodeEntry) and is cheaper than
// proto.Unmarshal when it decodes many: a replay decodes a million of them,
// and protobuf's allocation of every message and string was the largest part
// of its cost. A Decoder is not safe for concurrent use; its zero value is
// ready (and allocates as proto.Unmarshal does: DecodeEntry uses one).
//
// What it decodes is exactly what proto.Unmarshal decodes (proto.Equal, the
// same error text; TestDecoderMatchesProto and FuzzDecoder check it); an
// ApplyModel's spec is then normalized in place for applying
// (prepareDecodedModel). The envelope and the commands most entries hold
// (replica reports, plans, model deletions and applications, node status,
// unplacements) are read with the field tables of decode_fields.go (one
// reader per field number); any other command's message,
// or an ApplyModel with a map, is left to proto.Unmarshal. Anything this code
// does not expect (an unknown field, a repeated field of the envelope or a
// message field given twice, a field of another wire type, a malformed or non-UTF-8 value, a second command) sends the whole
// entry to proto.Unmarshal, so a newer schema or a damaged entry decodes, or
// fails, exactly as before. Strings are never aliased to data.
//
// What differs is where things live, never what they hold:
//   - Messages are cut from slabs allocated a few hundred at a time, not one
//     by one. Nothing mutable is shared: each Envelope gets messages of its
//     own. A message the state keeps keeps its slab from being collected,
//     which costs memory only; the commands decoded here are not kept (the
//     state copies their strings and numbers).
//   - Short strings are interned in a small cache (names of models, nodes,
//     endpoints and actors recur entry after entry); request ids, unique,
//     share byte chunks. Strings are immutable, so sharing is invisible.
type Decoder struct {
	// Slab is how many messages of a kind are allocated at once; 0 is 1.
	Slab int

	envs       slab[pb.Envelope]
	stamps     slab[timestamppb.Timestamp]
	statuses   slab[pb.ReplicaStatus]
	wStatus    slab[pb.Envelope_ReplicaStatus]
	places     slab[pb.PlaceReplicas]
	wPlace     slab[pb.Envelope_PlaceReplicas]
	placements slab[pb.Placement]
	pendings   slab[pb.PendingReason]
	ptrs       slab[*pb.Placement]
	pendPtrs   slab[*pb.PendingReason]
	cards      slab[uint32]
	deletes    slab[pb.DeleteModel]
	wDelete    slab[pb.Envelope_DeleteModel]
	nodeStats  slab[pb.SetNodeStatus]
	wNodeStat  slab[pb.Envelope_SetNodeStatus]
	unplaces   slab[pb.UnplaceReplica]
	wUnplace   slab[pb.Envelope_UnplaceReplica]
	accs       slab[pb.CreateAccelerator]
	accSpecs   slab[pb.AcceleratorSpec]
	wAcc       slab[pb.Envelope_CreateAccelerator]
	text       slab[byte]
	names      *names
}

// Sibling returns a new Decoder with d's Slab that shares d's interned
// names: for decoders used in turn on one goroutine (neither is safe for
// concurrent use, nor are siblings with each other).
func (d *Decoder) Sibling() *Decoder {
	if d.names == nil {
		d.names = new(names)
	}
	return &Decoder{Slab: d.Slab, names: d.names}
}

// Reset recycles the messages of every Envelope d has decoded since the
// last Reset: they are zeroed and handed out again, so none may be in use
// any more. Only what d decodes by hand is recycled, with the request ids'
// bytes, never other strings (the state keeps some) nor messages left to
// protobuf. It is for a replay's
// reader, which resets a batch's Decoder once ApplyEntry has applied the
// batch: ApplyEntry keeps no message of the commands decoded by hand, only
// copies of their strings and numbers (TestDecoderResetKeepsState checks
// it; a handler that starts keeping one must copy it). Until Reset, a
// Decoder keeps everything it decoded.
func (d *Decoder) Reset() {
	d.envs.reset()
	d.stamps.reset()
	d.statuses.reset()
	d.wStatus.reset()
	d.places.reset()
	d.wPlace.reset()
	d.placements.reset()
	d.pendings.reset()
	d.ptrs.reset()
	d.pendPtrs.reset()
	d.cards.reset()
	d.deletes.reset()
	d.wDelete.reset()
	d.nodeStats.reset()
	d.wNodeStat.reset()
	d.unplaces.reset()
	d.wUnplace.reset()
	d.accs.reset()
	d.accSpecs.reset()
	d.wAcc.reset()
	d.text.reset()
}

// DecodeEntry decodes a log entry's Envelope for ApplyEntry, as the
// package-level DecodeEntry does.
func (d *Decoder) DecodeEntry(data []byte) Entry {
	env, err := d.decode(data)
	if err != nil {
		return Entry{data: data, err: err}
	}
	e := Entry{data: data, env: env, request: requestKeyOf(env.GetRequestId())}
	if c := env.GetApplyModel(); c != nil {
		// The entry's ApplyModel is its own: its spec is normalized in place.
		e.model = prepareDecodedModel(c)
	}
	return e
}

// decode decodes data's Envelope exactly as proto.Unmarshal does.
func (d *Decoder) decode(data []byte) (*pb.Envelope, error) {
	if env := d.envelope(data); env != nil {
		return env, nil
	}
	env := &pb.Envelope{}
	if err := proto.Unmarshal(data, env); err != nil {
		return nil, err
	}
	return env, nil
}

// slab hands out zero Ts from chunks, and recycles them on reset.
type slab[T any] struct {
	chunks [][]T
	next   int // chunks[:next] are in use
	free   []T // what is left of chunks[next-1]
}

// take returns n contiguous zero Ts (capacity n: appending reallocates),
// from a chunk of at least size.
func (s *slab[T]) take(n, size int) []T {
	if len(s.free) < n {
		if s.next < len(s.chunks) && len(s.chunks[s.next]) >= n {
			s.free = s.chunks[s.next]
		} else {
			s.free = make([]T, max(n, size, 1))
			if s.next < len(s.chunks) {
				s.chunks[s.next] = s.free
			} else {
				s.chunks = append(s.chunks, s.free)
			}
		}
		s.next++
	}
	out := s.free[:n:n]
	s.free = s.free[n:]
	return out
}

func (s *slab[T]) one(size int) *T { return &s.take(1, size)[0] }

func (s *slab[T]) reset() {
	for i, c := range s.chunks[:s.next] {
		if i == s.next-1 {
			c = c[:len(c)-len(s.free)] // the rest was never handed out
		}
		clear(c)
	}
	s.next, s.free = 0, nil
}

// names is an intern cache of short strings, one per slot, the slot chosen
// by hash.
type names [internSlots]string

const (
	internSlots = 4096
	internMax   = 64 // longer strings are not interned
	textChunk8  = 8 << 10
)

var internSeed = maphash.MakeSeed()

// str returns b as a string, or false if b is not UTF-8 (proto.Unmarshal
// rejects such a string field).
func (d *Decoder) str(b []byte) (string, bool) {
	if len(b) == 0 {
		return "", true
	}
	if len(b) > internMax || d.Slab <= 1 {
		if !utf8.Valid(b) {
			return "", false
		}
		return string(b), true
	}
	if d.names == nil {
		d.names = new(names)
	}
	slot := &d.names[maphash.Bytes(internSeed, b)&(internSlots-1)]
	if *slot == string(b) {
		return *slot, true
	}
	if !utf8.Valid(b) {
		return "", false
	}
	*slot = string(b)
	return *slot, true
}

// unique returns b as a string kept in a shared chunk: for request ids,
// which never recur. Reset recycles the chunk too: applying keeps no request
// id (the request table keeps a hex id's bytes and a copy of any other).
func (d *Decoder) unique(b []byte) (string, bool) {
	if len(b) == 0 {
		return "", true
	}
	if !utf8.Valid(b) {
		return "", false
	}
	if len(b) > 256 || d.Slab <= 1 {
		return string(b), true
	}
	c := d.text.take(len(b), max(textChunk8, 32*d.Slab))
	copy(c, b)
	return unsafe.String(&c[0], len(c)), true
}

// field reads one field's tag and value: v for a varint, b for bytes. ok is
// false at anything else (groups, fixed-width values, malformed input).
func field(data []byte) (num protowire.Number, typ protowire.Type, v uint64, b []byte, rest []byte, ok bool) {
	// Most tags, varints and lengths are one byte: read those here, as
	// protowire would (a field number of 0 is left to it, to fail).
	if len(data) >= 2 && data[0] < 0x80 && data[0] >= 8 && data[1] < 0x80 {
		num, typ = protowire.Number(data[0]>>3), protowire.Type(data[0]&7)
		switch typ {
		case protowire.VarintType:
			return num, typ, uint64(data[1]), nil, data[2:], true
		case protowire.BytesType:
			if n := int(data[1]); n <= len(data)-2 {
				return num, typ, 0, data[2 : 2+n : 2+n], data[2+n:], true
			}
		}
	}
	num, typ, n := protowire.ConsumeTag(data)
	if n < 0 {
		return 0, 0, 0, nil, nil, false
	}
	data = data[n:]
	switch typ {
	case protowire.VarintType:
		v, n = protowire.ConsumeVarint(data)
	case protowire.BytesType:
		b, n = protowire.ConsumeBytes(data)
	default:
		return 0, 0, 0, nil, nil, false
	}
	if n < 0 {
		return 0, 0, 0, nil, nil, false
	}
	return num, typ, v, b, data[n:], true
}

// envelope decodes data, or returns nil for proto.Unmarshal to decode it.
func (d *Decoder) envelope(data []byte) *pb.Envelope {
	env := d.envs.one(d.Slab)
	var seen uint32 // bits of the fields read (1 << number)
	for len(data) > 0 {
		num, typ, _, b, rest, ok := field(data)
		if !ok || num > 31 || seen&(1<<num) != 0 || (num >= 10 && seen&^0x3ff != 0) {
			return nil // a repeated field, or a second command
		}
		data = rest
		seen |= 1 << num
		if typ != protowire.BytesType {
			return nil // every field of Envelope is bytes
		}
		switch num {
		case 1:
			if env.RequestId, ok = d.unique(b); !ok {
				return nil
			}
		case 2:
			if env.Actor, ok = d.str(b); !ok {
				return nil
			}
		case 3:
			env.ProposedAt = d.stamps.one(d.Slab)
			if !timestampFields.decode(d, env.ProposedAt, b) {
				return nil
			}
		default:
			if !d.command(env, num, b) {
				return nil
			}
		}
	}
	return env
}

// command decodes the command in field num of an Envelope into env.
func (d *Decoder) command(env *pb.Envelope, num protowire.Number, b []byte) bool {
	switch num {
	case 20:
		return slabCommand(d, &d.statuses, replicaStatusFields, b, func(c *pb.ReplicaStatus) { w := d.wStatus.one(d.Slab); w.ReplicaStatus = c; env.Command = w })
	case 18:
		c := d.placeReplicas(b)
		if c == nil {
			return false
		}
		w := d.wPlace.one(d.Slab)
		w.PlaceReplicas = c
		env.Command = w
	case 17:
		return slabCommand(d, &d.deletes, deleteModelFields, b, func(c *pb.DeleteModel) { w := d.wDelete.one(d.Slab); w.DeleteModel = c; env.Command = w })
	case 12:
		return slabCommand(d, &d.nodeStats, setNodeStatusFields, b, func(c *pb.SetNodeStatus) { w := d.wNodeStat.one(d.Slab); w.SetNodeStatus = c; env.Command = w })
	case 19:
		return slabCommand(d, &d.unplaces, unplaceReplicaFields, b, func(c *pb.UnplaceReplica) { w := d.wUnplace.one(d.Slab); w.UnplaceReplica = c; env.Command = w })
	case 14:
		return slabCommand(d, &d.accs, createAcceleratorFields, b, func(c *pb.CreateAccelerator) { w := d.wAcc.one(d.Slab); w.CreateAccelerator = c; env.Command = w })
	case 16:
		c := &pb.ApplyModel{}
		if !applyModelFields.decode(d, c, b) {
			// A map or anything else unusual: protobuf decodes this
			// command's message, as it would in the whole envelope.
			return otherCommand(env, num, b)
		}
		env.Command = &pb.Envelope_ApplyModel{ApplyModel: c}
	default:
		return otherCommand(env, num, b)
	}
	return true
}

// slabCommand decodes the message of a command, b, with fs into one of
// msgs, and has set make it env's command.
func slabCommand[M any](d *Decoder, msgs *slab[M], fs fields[M], b []byte, set func(*M)) bool {
	m := msgs.one(d.Slab)
	if !fs.decode(d, m, b) {
		return false
	}
	set(m)
	return true
}

// otherCommand decodes a command this file does not read by hand with
// proto.Unmarshal, as decoding the whole Envelope would: field num must be
// one of the Envelope's command oneof.
func otherCommand(env *pb.Envelope, num protowire.Number, b []byte) bool {
	r := env.ProtoReflect()
	fd := r.Descriptor().Fields().ByNumber(num)
	if fd == nil || fd.Message() == nil || fd.ContainingOneof() == nil || fd.ContainingOneof().Name() != "command" {
		return false
	}
	v := r.NewField(fd)
	if proto.Unmarshal(b, v.Message().Interface()) != nil {
		return false
	}
	r.Set(fd, v)
	return true
}

func (d *Decoder) placeReplicas(b []byte) *pb.PlaceReplicas {
	c := d.places.one(d.Slab)
	// Count the repeated fields first so their slices are cut to size.
	var nPlace, nPend int
	for r := b; len(r) > 0; {
		num, _, _, _, rest, ok := field(r)
		if !ok {
			return nil
		}
		r = rest
		switch num {
		case 1:
			nPlace++
		case 2:
			nPend++
		}
	}
	if nPlace > 0 {
		c.Placements = d.placementSlice(nPlace)
	}
	if nPend > 0 {
		c.Pending = d.pendingSlice(nPend)
	}
	for len(b) > 0 {
		num, typ, _, s, rest, ok := field(b)
		if !ok || typ != protowire.BytesType {
			return nil
		}
		b = rest
		switch num {
		case 1:
			p := d.placements.one(d.Slab)
			if !placementFields.decode(d, p, s) {
				return nil
			}
			c.Placements = append(c.Placements, p)
		case 2:
			p := d.pendings.one(d.Slab)
			if !pendingReasonFields.decode(d, p, s) {
				return nil
			}
			c.Pending = append(c.Pending, p)
		case 3:
			if c.Policy, ok = d.str(s); !ok {
				return nil
			}
		default:
			return nil
		}
	}
	return c
}

// placementSlice returns an empty slice with room for n, cut from a shared
// chunk (its capacity capped, so appending never reaches a neighbour's).
func (d *Decoder) placementSlice(n int) []*pb.Placement {
	return d.ptrs.take(n, d.Slab)[:0]
}

func (d *Decoder) pendingSlice(n int) []*pb.PendingReason {
	return d.pendPtrs.take(n, d.Slab)[:0]
}

// packedUint32s decodes a packed repeated uint32 field, in a slice cut from
// a shared chunk with its capacity capped.
func (d *Decoder) packedUint32s(b []byte) ([]uint32, bool) {
	n := 0
	for _, c := range b {
		if c < 0x80 {
			n++
		}
	}
	if n == 0 {
		return nil, len(b) == 0
	}
	out := d.cards.take(n, 4*d.Slab)[:0]
	for len(b) > 0 {
		v, k := protowire.ConsumeVarint(b)
		if k < 0 || len(out) == n {
			return nil, false
		}
		out = append(out, uint32(v))
		b = b[k:]
	}
	if len(out) != n {
		return nil, false
	}
	return out, true
}
