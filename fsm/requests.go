package fsm

import (
	"hash/maphash"
	"math/bits"
	"slices"
	"strings"
	"unsafe"

	"google.golang.org/protobuf/proto"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// appliedRequest is what a request id's first application returned: enough
// to answer a duplicate with the same result. Violations and warnings are
// rare, so they hang off a pointer that is nil in the common case. It is the
// unpacked form of a requestTable entry.
type appliedRequest struct {
	index   uint64
	at      int64 // the log time of the first application (FSM.logTime)
	code    pb.Code
	outcome pb.Outcome
	message string
	detail  *requestDetail
}

type requestDetail struct {
	violations []*pb.Violation
	warnings   []string
}

// remember returns the compact record of res.
func remember(res *pb.Result) appliedRequest {
	a := appliedRequest{index: res.Index, code: res.Code, outcome: res.Outcome, message: res.Message}
	if len(res.Violations) > 0 || len(res.Warnings) > 0 {
		d := &requestDetail{warnings: slices.Clone(res.Warnings)}
		for _, v := range res.Violations {
			d.violations = append(d.violations, proto.Clone(v).(*pb.Violation))
		}
		a.detail = d
	}
	return a
}

func (a *appliedRequest) more() *requestDetail {
	if a.detail == nil {
		a.detail = &requestDetail{}
	}
	return a.detail
}

// result rebuilds the Result a remembered request returned (a fresh copy the
// caller may change).
func (a appliedRequest) result() *pb.Result {
	res := &pb.Result{Index: a.index, Code: a.code, Outcome: a.outcome, Message: a.message}
	if d := a.detail; d != nil {
		res.Warnings = slices.Clone(d.warnings)
		for _, v := range d.violations {
			res.Violations = append(res.Violations, proto.Clone(v).(*pb.Violation))
		}
	}
	return res
}

// requestTable maps the request ids applied within the window to the record
// of their first application (appliedRequest). An id is remembered while
// the log time (now) is less than its first application's log time plus the
// window, and forgotten after: a lookup no longer finds it, Snapshot leaves
// it out, and compact, run between entries once the table has doubled
// since the last compaction, drops it, so the table holds about the ids of
// two windows at most. Only log time (the leaders' proposed_at, the same on
// every server) decides what is remembered; when compact runs changes
// nothing a lookup or a snapshot shows. A busy cluster still holds millions
// of ids, and a replay builds the table from empty, one lookup and one
// insert per command, so it is laid out for size and for the garbage
// collector rather than with a map[string]appliedRequest:
//
//   - Ids in NewRequestID's form, 32 lowercase hex digits (nearly all of
//     them), are kept as the 16 bytes they spell, in an open-addressing index
//     of 8-byte slots over entries appended in chunks that never move. Any
//     other id is a key of an ordinary map. Both spellings are exact: an id
//     has one form or the other, so the table answers precisely as a map of
//     the strings would.
//   - Entries hold no pointers: messages are copied into an append-only text
//     arena, the rare violations and warnings hang off a side slice. The
//     collector therefore never scans the table, and it takes about half the
//     memory of the map with its id and message strings: a replay's heap,
//     and the fresh pages faulted in to hold it (costly on virtual
//     machines), halve with it.
//   - An id's hex parse and hash (requestKey) are computed where the entry
//     is decoded, off the applying goroutine in a replay, and FSM.Prefetch
//     loads a run of entries' index slots together, so that their cache
//     misses overlap.
//
// Lookups only read, so concurrent readers (views, DryRun) are safe while no
// one writes.
type requestTable struct {
	// slots is the index of hex ids: linear probing over a power-of-two
	// table, each slot 0 (empty) or the top 32 bits of the id's hash and
	// 1 + its entry number.
	slots []uint64
	// hexIDs counts the hex ids in slots, which grows at three quarters full.
	hexIDs int
	sink   uint64 // what touch loads goes here, lest the load be dropped

	entries [][]requestEntry // chunks: requestChunk, then doubling (entry)
	count   int              // entries in use
	other   map[string]uint32
	text    textArena
	details []*requestDetail

	// now and window (both in nanoseconds) decide which entries are
	// expired: those with at <= now-window. The FSM sets them before each
	// entry.
	now, window int64
	// compactAt is the count at which compact next runs.
	compactAt int
	// oldest is at most the smallest at of any entry (set once seen):
	// while it is not expired, nothing is, and compact need not run.
	oldest int64
	seen   bool
}

// requestEntry is one id's record, appliedRequest packed without pointers.
type requestEntry struct {
	id      [16]byte // a hex id's bytes; zero for another id
	index   uint64
	at      int64
	message textRef
	code    pb.Code
	outcome pb.Outcome
	// detail is 1 + the index of the id's requestDetail in details (0:
	// none), with otherID set for an id kept in other.
	detail uint32
}

const (
	requestChunk = 4096
	otherID      = 1 << 31
)

// compactMin is the fewest entries a table holds before compact first runs.
const compactMin = 2 * requestChunk

func newRequestTable() *requestTable {
	return &requestTable{other: map[string]uint32{}, window: int64(DefaultRequestWindow), compactAt: compactMin}
}

// Len is the number of ids in the table, expired ones not yet compacted
// away included.
func (t *requestTable) Len() int { return t.count }

// expired reports whether entry p's id is forgotten at the current log time.
func (t *requestTable) expired(p *requestEntry) bool { return p.at <= t.now-t.window }

// live counts the ids not expired.
func (t *requestTable) live() int {
	n := 0
	for e := range uint32(t.count) {
		if !t.expired(t.entry(e)) {
			n++
		}
	}
	return n
}

// Bytes is about how much memory the table holds: its index, entries,
// messages and the map of other ids.
func (t *requestTable) Bytes() int64 {
	n := int64(8 * cap(t.slots))
	for _, c := range t.entries {
		n += int64(cap(c)) * int64(unsafe.Sizeof(requestEntry{}))
	}
	for _, c := range t.text.chunks {
		n += int64(cap(c))
	}
	for id := range t.other {
		n += int64(len(id)) + 48 // key, header and value, roughly
	}
	return n + int64(8*cap(t.details))
}

// maybeCompact compacts the table once it holds twice the entries it kept
// at the last compaction. It must run between entries, never between a
// lookup and its putAt (it renumbers entries).
func (t *requestTable) maybeCompact() {
	switch {
	case t.count < t.compactAt:
	case t.seen && t.oldest > t.now-t.window:
		// Nothing has expired yet (a replay of a log shorter than the
		// window): copying the table would free nothing.
		t.compactAt = 2 * t.count
	default:
		t.compact()
	}
}

// compact rebuilds the table with only the ids not expired, in the same
// order, their messages copied into a fresh arena: what expired is freed.
// A full rebuild every doubling costs O(1) per id applied.
func (t *requestTable) compact() {
	others := make(map[uint32]string, len(t.other))
	for id, e := range t.other {
		others[e] = id
	}
	next := newRequestTable()
	next.now, next.window = t.now, t.window
	for e := range uint32(t.count) {
		p := t.entry(e)
		if t.expired(p) {
			continue
		}
		a := t.unpack(p)
		if p.detail&otherID != 0 {
			n := next.add()
			next.other[others[e]] = n
			next.pack(next.entry(n), a, otherID)
			continue
		}
		n := next.add()
		q := next.entry(n)
		q.id = p.id
		next.pack(q, a, 0)
		next.hexIDs++
	}
	if next.hexIDs > 0 {
		next.fill(slotsFor(next.hexIDs), false)
	}
	next.compactAt = max(2*next.count, compactMin)
	*t = *next
}

// expect sizes an empty table's index for about n ids.
func (t *requestTable) expect(n int) {
	if t.count == 0 && n > 0 {
		t.slots = t.makeSlots(slotsFor(min(n, 1<<26)))
	}
}

// slotsFor is the index size that holds n hex ids below three quarters full.
func slotsFor(n int) int {
	size := 64
	for size/4*3 < n {
		size *= 2
	}
	return size
}

// hexID returns the 16 bytes a 32-digit lowercase hex id spells.
func hexID(id string) (k [16]byte, ok bool) {
	if len(id) != 32 {
		return k, false
	}
	for i := range k {
		hi, lo := unhex[id[2*i]], unhex[id[2*i+1]]
		if hi|lo > 0x0f {
			return k, false
		}
		k[i] = hi<<4 | lo
	}
	return k, true
}

var unhex = func() (t [256]byte) {
	for i := range t {
		t[i] = 0xff
	}
	for c := byte('0'); c <= '9'; c++ {
		t[c] = c - '0'
	}
	for c := byte('a'); c <= 'f'; c++ {
		t[c] = c - 'a' + 10
	}
	return t
}()

// requestSeed seeds the hash that spreads hex ids over the index. Like a Go
// map's, it is random, so that ids cannot be chosen to collide; it decides
// where an id sits in memory, never what the state machine does.
var requestSeed = maphash.MakeSeed()

func hashID(k *[16]byte) uint64 { return maphash.Bytes(requestSeed, k[:]) }

// requestKey is a request id as the table looks it up: keyOf computes it
// once per entry (DecodeEntry, on the decoding goroutine of a replay).
type requestKey struct {
	id   string
	hex  bool
	key  [16]byte // the id's bytes, when hex
	hash uint64   // hashID(&key), when hex
}

func requestKeyOf(id string) requestKey {
	k := requestKey{id: id}
	if k.key, k.hex = hexID(id); k.hex {
		k.hash = hashID(&k.key)
	}
	return k
}

// requestProbe is where a lookup found an id, or where it would go: putAt
// reuses it rather than probing again, unless the table grew in between.
type requestProbe struct {
	requestKey
	slot  int // in slots, when hex and slots had size
	size  int
	entry uint32
	found bool
	// expired is set, and found not, when the id has an entry that is
	// expired: putAt reuses it.
	expired bool
}

// lookup finds the id k among the ids not expired.
func (t *requestTable) lookup(k requestKey) requestProbe {
	p := requestProbe{requestKey: k}
	if p.hex {
		if len(t.slots) > 0 {
			p.size = len(t.slots)
			p.slot, p.entry, p.found = t.find(&p.key, p.hash)
		}
	} else {
		p.entry, p.found = t.other[p.id]
	}
	if p.found && t.expired(t.entry(p.entry)) {
		p.found, p.expired = false, true
	}
	return p
}

// touch loads the index slot where k's lookup starts, so that the lookup
// finds it in the CPU cache: see FSM.Prefetch.
func (t *requestTable) touch(k *requestKey) {
	if k.hex && len(t.slots) > 0 {
		t.sink += t.slots[int(k.hash)&(len(t.slots)-1)]
	}
}

// find returns the slot holding k's entry, with its entry number and true,
// or the empty slot where k would go and false. t.slots must not be empty.
func (t *requestTable) find(k *[16]byte, h uint64) (slot int, entry uint32, ok bool) {
	tag := h >> 32 << 32
	mask := len(t.slots) - 1
	for i := int(h) & mask; ; i = (i + 1) & mask {
		s := t.slots[i]
		if s == 0 {
			return i, 0, false
		}
		if s&^0xffffffff == tag {
			e := uint32(s) - 1
			if t.entry(e).id == *k {
				return i, e, true
			}
		}
	}
}

// entry returns entry e. The first two chunks hold requestChunk entries,
// each later one as many as all before it: a small table stays small, a
// large one is in few large chunks, which huge pages can back (adviseHuge).
func (t *requestTable) entry(e uint32) *requestEntry {
	if e < requestChunk {
		return &t.entries[0][e]
	}
	i := bits.Len32(e / requestChunk)
	return &t.entries[i][e-requestChunk<<(i-1)]
}

// record returns the record a successful lookup found.
func (t *requestTable) record(p requestProbe) appliedRequest {
	return t.unpack(t.entry(p.entry))
}

func (t *requestTable) unpack(p *requestEntry) appliedRequest {
	a := appliedRequest{index: p.index, at: p.at, code: p.code, outcome: p.outcome, message: t.text.get(p.message)}
	if d := p.detail &^ otherID; d != 0 {
		a.detail = t.details[d-1]
	}
	return a
}

// put records a as id's record, replacing any earlier one.
func (t *requestTable) put(id string, a appliedRequest) { t.putAt(t.lookup(requestKeyOf(id)), a) }

// putAt records a as the record of the id p looked up, replacing any
// earlier one. Nothing may have been put since the lookup but by putAt with
// this same p.
func (t *requestTable) putAt(p requestProbe, a appliedRequest) {
	p.found = p.found || p.expired
	if !p.hex {
		if !p.found {
			p.entry = t.add()
			t.other[strings.Clone(p.id)] = p.entry
		}
		t.pack(t.entry(p.entry), a, otherID)
		return
	}
	if !p.found {
		if (t.hexIDs+1)*4 > len(t.slots)*3 {
			t.grow()
		}
		if p.size != len(t.slots) {
			p.slot, p.entry, p.found = t.find(&p.key, p.hash)
		}
	}
	if !p.found {
		p.entry = t.add()
		t.slots[p.slot] = p.hash>>32<<32 | uint64(p.entry+1)
		t.hexIDs++
		t.entry(p.entry).id = p.key
	}
	t.pack(t.entry(p.entry), a, 0)
}

// load adds id's record to a table being loaded in bulk (a snapshot's
// restore), as put would, except that a hex id is not indexed yet: index,
// called once all are loaded, builds the index at its final size instead of
// growing it (rehashing every id loaded so far) as they come. Until then the
// table may only be loaded.
func (t *requestTable) load(id string, a appliedRequest) {
	k, ok := hexID(id)
	if !ok {
		t.put(id, a)
		return
	}
	e := t.add()
	p := t.entry(e)
	p.id = k
	t.pack(p, a, 0)
	t.hexIDs++
}

// index builds the index of the hex ids loaded by load. Snapshots hold each
// id once; should an id have been loaded twice, the table is rebuilt with
// put, in load order, so that the later record replaces the earlier as put
// makes it.
func (t *requestTable) index() {
	if t.hexIDs == 0 {
		return
	}
	if !t.fill(slotsFor(t.hexIDs), true) {
		t.reload()
	}
	t.compactAt = max(2*t.count, compactMin)
}

// reload rebuilds a loaded table with put, in load order (see index).
func (t *requestTable) reload() {
	others := make(map[uint32]string, len(t.other))
	for id, e := range t.other {
		others[e] = id
	}
	old := *t
	*t = *newRequestTable()
	const digits = "0123456789abcdef"
	for e := range uint32(old.count) {
		p := old.entry(e)
		id, ok := others[e]
		if p.detail&otherID == 0 {
			var b [32]byte
			for j, c := range p.id {
				b[2*j], b[2*j+1] = digits[c>>4], digits[c&0x0f]
			}
			id, ok = string(b[:]), true
		}
		if ok {
			t.put(id, old.unpack(p))
		}
	}
}

// makeSlots returns an empty index of n slots.
func (t *requestTable) makeSlots(n int) []uint64 {
	slots := make([]uint64, n)
	adviseHuge(unsafe.Pointer(&slots[0]), 8*n)
	return slots
}

// add appends a zero entry and returns its number.
func (t *requestTable) add() uint32 {
	if t.count >= 1<<32-2 {
		panic("fsm: more than 2^32-2 request ids")
	}
	if t.count == requestChunk<<max(len(t.entries)-1, 0) || len(t.entries) == 0 {
		n := requestChunk << max(len(t.entries)-1, 0)
		c := make([]requestEntry, n)
		adviseHuge(unsafe.Pointer(&c[0]), n*int(unsafe.Sizeof(c[0])))
		t.entries = append(t.entries, c)
	}
	t.count++
	return uint32(t.count - 1)
}

func (t *requestTable) pack(p *requestEntry, a appliedRequest, flags uint32) {
	p.index, p.at, p.code, p.outcome = a.index, a.at, a.code, a.outcome
	if !t.seen || a.at < t.oldest {
		t.oldest, t.seen = a.at, true
	}
	p.message = t.text.add(a.message)
	p.detail = flags
	if a.detail != nil {
		if len(t.details) >= otherID-1 {
			panic("fsm: more than 2^31-1 request records with details")
		}
		t.details = append(t.details, a.detail)
		p.detail |= uint32(len(t.details))
	}
}

// grow doubles the index (or creates it) and reinserts every hex id.
func (t *requestTable) grow() {
	t.fill(max(2*len(t.slots), slotsFor(t.hexIDs+1)), false)
}

// fill replaces the index with one of n slots holding every hex id. With
// dups set it stops at an id listed twice and reports false, leaving the
// index as it was.
func (t *requestTable) fill(n int, dups bool) bool {
	slots := t.makeSlots(n)
	mask := len(slots) - 1
	for e := range uint32(t.count) {
		p := t.entry(e)
		if p.detail&otherID != 0 {
			continue
		}
		h := hashID(&p.id)
		tag := h >> 32 << 32
		i := int(h) & mask
		for ; slots[i] != 0; i = (i + 1) & mask {
			if dups && slots[i]&^0xffffffff == tag && t.entry(uint32(slots[i])-1).id == p.id {
				return false
			}
		}
		slots[i] = tag | uint64(e+1)
	}
	t.slots = slots
	return true
}

// sorted calls yield with every id not expired and its record, ordered by id.
func (t *requestTable) sorted(yield func(id string, a appliedRequest)) {
	type hexEntry struct {
		hi, lo uint64 // the id's bytes, big-endian: byte order is the hex string's order
		e      uint32
	}
	hexes := make([]hexEntry, 0, t.hexIDs)
	for e := range uint32(t.count) {
		p := t.entry(e)
		if p.detail&otherID == 0 && !t.expired(p) {
			hexes = append(hexes, hexEntry{be64(p.id[:8]), be64(p.id[8:]), e})
		}
	}
	slices.SortFunc(hexes, func(a, b hexEntry) int {
		switch {
		case a.hi != b.hi:
			if a.hi < b.hi {
				return -1
			}
			return 1
		case a.lo != b.lo:
			if a.lo < b.lo {
				return -1
			}
			return 1
		}
		return 0
	})
	others := make([]string, 0, len(t.other))
	for id, e := range t.other {
		if !t.expired(t.entry(e)) {
			others = append(others, id)
		}
	}
	slices.Sort(others)

	// The hex ids' strings share one buffer, written once.
	const digits = "0123456789abcdef"
	buf := make([]byte, 32*len(hexes))
	for i, o := 0, 0; i < len(hexes) || o < len(others); {
		var id string
		if i < len(hexes) {
			s := buf[32*i : 32*i+32]
			for j, b := range t.entry(hexes[i].e).id {
				s[2*j], s[2*j+1] = digits[b>>4], digits[b&0x0f]
			}
			id = unsafe.String(&s[0], 32)
		}
		if i < len(hexes) && (o == len(others) || id < others[o]) {
			yield(id, t.unpack(t.entry(hexes[i].e)))
			i++
			continue
		}
		yield(others[o], t.unpack(t.entry(t.other[others[o]])))
		o++
	}
}

func be64(b []byte) uint64 {
	_ = b[7]
	return uint64(b[0])<<56 | uint64(b[1])<<48 | uint64(b[2])<<40 | uint64(b[3])<<32 |
		uint64(b[4])<<24 | uint64(b[5])<<16 | uint64(b[6])<<8 | uint64(b[7])
}

// textArena keeps strings in shared, append-only chunks: one allocation,
// holding no pointers, per chunk rather than one per string. Strings it
// returns point into the chunks, whose bytes never change once written.
type textArena struct {
	chunks [][]byte
	open   int // 1 + the index of the chunk being filled; 0: none
	opened int // chunks opened for filling so far
}

// textRef locates a string in a textArena; the zero textRef is "".
type textRef struct {
	chunk, off, n uint32
}

const (
	textChunk    = 64 << 10
	textChunkMax = 8 << 20
)

func (a *textArena) add(s string) textRef {
	n := len(s)
	if n == 0 {
		return textRef{}
	}
	if uint64(n) > 1<<32-1 {
		panic("fsm: message longer than 4 GiB")
	}
	if n > textChunk/8 {
		a.chunks = append(a.chunks, []byte(s))
		return textRef{uint32(len(a.chunks) - 1), 0, uint32(n)}
	}
	if a.open == 0 || cap(a.chunks[a.open-1])-len(a.chunks[a.open-1]) < n {
		// Chunks grow from textChunk to textChunkMax (sixteenfold each
		// time), so that a large arena can be backed by huge pages.
		size := min(textChunk<<(4*a.opened), textChunkMax)
		c := make([]byte, 0, size)
		adviseHuge(unsafe.Pointer(unsafe.SliceData(c)), size)
		a.chunks = append(a.chunks, c)
		a.open = len(a.chunks)
		a.opened++
	}
	c := a.chunks[a.open-1]
	a.chunks[a.open-1] = append(c, s...)
	return textRef{uint32(a.open - 1), uint32(len(c)), uint32(n)}
}

func (a *textArena) get(r textRef) string {
	if r.n == 0 {
		return ""
	}
	return unsafe.String(&a.chunks[r.chunk][r.off], int(r.n))
}
