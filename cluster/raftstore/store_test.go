package raftstore

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	wal "github.com/hashicorp/raft-wal"
)

// smallSegments makes a few hundred entries span several segments, so that
// sealed segments, their indexes and rotations are all exercised.
const smallSegments = 8 << 10

// entry is a log entry whose data says its index, of a size that varies.
func entry(i uint64, rng *rand.Rand) *raft.Log {
	data := []byte(fmt.Sprintf("entry %d:", i))
	for n := rng.IntN(200); n > 0; n-- {
		data = append(data, byte('a'+rng.IntN(26)))
	}
	l := &raft.Log{Index: i, Term: 1 + i/50, Type: raft.LogCommand, Data: data, AppendedAt: time.Unix(1700000000, int64(i)).UTC()}
	if i%17 == 0 {
		l.Type, l.Data = raft.LogNoop, nil
	}
	return l
}

// writeLog stores n entries in batches of 1..max and closes the store. It
// returns every entry: all were acknowledged (StoreLogs returned nil).
func writeLog(t testing.TB, dir string, n uint64, maxBatch int, seed uint64) []*raft.Log {
	t.Helper()
	s, err := Open(dir, Options{SegmentSize: smallSegments})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(seed, 1))
	var all []*raft.Log
	for i := uint64(1); i <= n; {
		var batch []*raft.Log
		for k := 1 + rng.IntN(maxBatch); k > 0 && i <= n; k-- {
			batch = append(batch, entry(i, rng))
			i++
		}
		if err := s.StoreLogs(batch); err != nil {
			t.Fatal(err)
		}
		all = append(all, batch...)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return all
}

func sameLog(a, b *raft.Log) bool {
	return a.Index == b.Index && a.Term == b.Term && a.Type == b.Type && bytes.Equal(a.Data, b.Data) &&
		bytes.Equal(a.Extensions, b.Extensions) && a.AppendedAt.Equal(b.AppendedAt)
}

// checkAll reads every acknowledged entry back through the writer (Open)
// and the offline reader, and fails unless each is there unchanged.
func checkAll(t testing.TB, dir string, acked []*raft.Log) {
	t.Helper()
	r, err := OpenReadOnly(dir)
	if err != nil {
		t.Fatalf("offline: %v", err)
	}
	for _, want := range acked {
		var got raft.Log
		if err := r.GetLog(want.Index, &got); err != nil || !sameLog(&got, want) {
			r.Close()
			t.Fatalf("offline: entry %d: %v, %+v; want %+v", want.Index, err, got, want)
		}
	}
	r.Close()
	s, err := Open(dir, Options{SegmentSize: smallSegments})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	defer s.Close()
	for _, want := range acked {
		var got raft.Log
		if err := s.GetLog(want.Index, &got); err != nil || !sameLog(&got, want) {
			t.Fatalf("open: entry %d: %v, %+v; want %+v", want.Index, err, got, want)
		}
	}
}

func TestStoreRoundTrip(t *testing.T) {
	dir := t.TempDir()
	acked := writeLog(t, dir, 400, 12, 1)
	segs, _ := filepath.Glob(filepath.Join(dir, "*.wal"))
	if len(segs) < 3 {
		t.Fatalf("%d segments, want several (sealed ones too)", len(segs))
	}
	checkAll(t, dir, acked)

	// Range reads the same entries, aliasing the mapped files.
	r, err := OpenReadOnly(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	first, _ := r.FirstIndex()
	last, _ := r.LastIndex()
	if first != 1 || last != 400 {
		t.Fatalf("offline first %d last %d, want 1 and 400", first, last)
	}
	next := uint64(20)
	if err := r.Range(20, 380, func(l *raft.Log) error {
		if !sameLog(l, acked[next-1]) {
			return fmt.Errorf("entry %d differs", next)
		}
		next++
		return nil
	}); err != nil || next != 381 {
		t.Fatalf("Range: %v, stopped before %d", err, next)
	}
	if err := r.Range(399, 401, func(*raft.Log) error { return nil }); !errors.Is(err, raft.ErrLogNotFound) {
		t.Fatalf("Range past the end: %v, want ErrLogNotFound", err)
	}
}

// TestDecodeEntry checks the reader's copy-free decoding against raft-wal's
// own codec, for every kind of entry it writes.
func TestDecodeEntry(t *testing.T) {
	codec := &wal.BinaryCodec{}
	for i, l := range []*raft.Log{
		{Index: 1, Term: 1, Type: raft.LogConfiguration, Data: []byte{1, 2, 3}},
		{Index: 2, Term: 1, Type: raft.LogNoop},
		{Index: 300, Term: 7, Type: raft.LogCommand, Data: bytes.Repeat([]byte("x"), 1000), Extensions: []byte("ext"), AppendedAt: time.Now()},
		{Index: 1 << 40, Term: 1 << 33, Type: raft.LogBarrier, AppendedAt: time.Unix(1, 2).In(time.FixedZone("x", 3600))},
	} {
		var buf bytes.Buffer
		if err := codec.Encode(l, &buf); err != nil {
			t.Fatal(err)
		}
		var want, got raft.Log
		if err := codec.Decode(buf.Bytes(), &want); err != nil {
			t.Fatal(err)
		}
		if err := decodeEntry(buf.Bytes(), &got); err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		if !sameLog(&got, &want) || got.AppendedAt.String() != want.AppendedAt.String() {
			t.Fatalf("case %d: decoded %+v, raft-wal decodes %+v", i, got, want)
		}
		for cut := range buf.Len() {
			var l raft.Log
			if decodeEntry(buf.Bytes()[:cut], &l) == nil && codec.Decode(buf.Bytes()[:cut], &raft.Log{}) != nil {
				t.Fatalf("case %d cut at %d: decodes, raft-wal's codec does not", i, cut)
			}
		}
	}
}

// copyDir copies a log dir (the fault tests damage copies of one log).
func copyDir(t testing.TB, from, to string) {
	t.Helper()
	ents, err := os.ReadDir(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(to, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		data, err := os.ReadFile(filepath.Join(from, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(to, e.Name()), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// outcome opens a damaged log both ways and checks the rule the fault tests
// hold it to: it opens with every acknowledged entry intact, or it refuses
// to with a DamageError that names a file of the log and an offset in it.
// It never panics (a panic fails the test binary). It reports whether the
// damage was detected.
func outcome(t *testing.T, dir string, acked []*raft.Log, what string) bool {
	t.Helper()
	r, rerr := OpenReadOnly(dir)
	if rerr == nil {
		r.Close()
	}
	s, err := Open(dir, Options{SegmentSize: smallSegments})
	if err == nil {
		s.Close()
	}
	if (err == nil) != (rerr == nil) {
		t.Fatalf("%s: Open says %v, OpenReadOnly says %v", what, err, rerr)
	}
	if err == nil {
		t.Run(what, func(t *testing.T) { checkAll(t, dir, acked) })
		return false
	}
	var d *DamageError
	if !errors.As(err, &d) {
		t.Fatalf("%s: %v, want a DamageError", what, err)
	}
	fi, serr := os.Stat(d.File)
	if serr != nil && !strings.HasPrefix(d.Reason, "missing") || filepath.Dir(d.File) != dir || serr == nil && d.Offset > fi.Size() {
		t.Fatalf("%s: damage reported at %s offset %d: not a place in the log", what, d.File, d.Offset)
	}
	return true
}

// frameEdges lists, for each segment file of a log, the offsets where its
// frames start and end (the record boundaries), found by reading it
// through.
func frameEdges(t testing.TB, dir string) map[string][]int64 {
	t.Helper()
	st, _, err := loadMeta(dir, false)
	if err != nil {
		t.Fatal(err)
	}
	segs, err := scanLog(dir, st, true, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer unmapAll(segs)
	out := map[string][]int64{}
	for _, s := range segs {
		edges := []int64{0, fileHeaderLen}
		for off := int64(fileHeaderLen); off < s.good; {
			h := s.data[off : off+frameHeaderLen]
			n := int64(0)
			if h[0] != frameCommit {
				n = int64(h[4]) | int64(h[5])<<8 | int64(h[6])<<16 | int64(h[7])<<24
			}
			off += frameHeaderLen + n + padLen(n)
			edges = append(edges, off)
		}
		out[s.path] = edges
	}
	return out
}

// TestBitFlips flips one bit at offsets all over every segment file (every
// frame header and the payloads between them) and checks each copy: damage
// is detected, or every acknowledged entry is still there.
func TestBitFlips(t *testing.T) {
	base := t.TempDir()
	good := filepath.Join(base, "log")
	acked := writeLog(t, good, 150, 8, 2)
	cases, detected := 0, 0
	for path, edges := range frameEdges(t, good) {
		end := edges[len(edges)-1]
		var offs []int64
		for _, e := range edges {
			offs = append(offs, e, e+4) // frame type, length or CRC
		}
		for o := int64(3); o < end+64; o += 29 {
			offs = append(offs, o) // payloads, padding, the zeros after
		}
		for _, off := range offs {
			dir := filepath.Join(base, fmt.Sprint("flip", cases))
			copyDir(t, good, dir)
			f := filepath.Join(dir, filepath.Base(path))
			data, _ := os.ReadFile(f)
			if off >= int64(len(data)) {
				continue
			}
			data[off] ^= 1 << (cases % 8)
			os.WriteFile(f, data, 0o600)
			if outcome(t, dir, acked, fmt.Sprintf("bit flipped at %s:%d", filepath.Base(path), off)) {
				detected++
			}
			os.RemoveAll(dir)
			cases++
		}
	}
	// Every flip inside the written data is detected; only flips in the
	// zeros after the last write may open (as an unfinished write).
	t.Logf("%d flips, %d detected", cases, detected)
	if detected < cases*3/4 {
		t.Fatalf("only %d of %d bit flips detected", detected, cases)
	}
}

// TestTruncation cuts each segment file at every record boundary and inside
// records: damage is detected, or every acknowledged entry is still there.
func TestTruncation(t *testing.T) {
	base := t.TempDir()
	good := filepath.Join(base, "log")
	acked := writeLog(t, good, 120, 6, 3)
	cases := 0
	for path, edges := range frameEdges(t, good) {
		var cuts []int64
		for i, e := range edges {
			cuts = append(cuts, e)
			if i+1 < len(edges) {
				cuts = append(cuts, e+3, (e+edges[i+1])/2)
			}
		}
		fi, _ := os.Stat(path)
		cuts = append(cuts, fi.Size()-1)
		for _, cut := range cuts {
			if cut == 0 && !isSealed(t, good, path) {
				// An emptied newest segment looks like one created just
				// before a crash; the cluster catches it by the log's
				// length (TestEmptiedTailRefused).
				continue
			}
			dir := filepath.Join(base, fmt.Sprint("cut", cases))
			copyDir(t, good, dir)
			if err := os.Truncate(filepath.Join(dir, filepath.Base(path)), cut); err != nil {
				t.Fatal(err)
			}
			// outcome checks that a cut it does not detect lost nothing;
			// one inside the written frames always loses something.
			if !outcome(t, dir, acked, fmt.Sprintf("%s truncated to %d", filepath.Base(path), cut)) && cut < edges[len(edges)-1] {
				t.Fatalf("%s truncated to %d bytes: not detected", filepath.Base(path), cut)
			}
			os.RemoveAll(dir)
			cases++
		}
	}
	t.Logf("%d truncations, all detected", cases)
}

func isSealed(t testing.TB, dir, path string) bool {
	st, _, err := loadMeta(dir, false)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range st.Segments {
		if segmentPath(dir, s) == path {
			return !s.SealTime.IsZero()
		}
	}
	t.Fatalf("%s is not a segment of %s", path, dir)
	return false
}

// TestDamagedMeta truncates and garbles wal-meta.db (bbolt): an error that
// names the file, never a crash (bbolt faults on a mapped page past a
// truncated end), and the offline reader the same.
func TestDamagedMeta(t *testing.T) {
	base := t.TempDir()
	good := filepath.Join(base, "log")
	acked := writeLog(t, good, 60, 5, 4)
	data, err := os.ReadFile(metaPath(good))
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(4, 4))
	type damage struct {
		name string
		do   func([]byte) []byte
	}
	var cases []damage
	for _, n := range []int{0, 100, 4096, 8192, 12288, 16384, len(data) - 4096} {
		cases = append(cases, damage{fmt.Sprintf("truncated to %d", n), func(b []byte) []byte { return b[:n] }})
	}
	for _, at := range []int{0, 16, 4096 + 16, 8192, 12288 + 40, len(data) - 100} {
		cases = append(cases, damage{fmt.Sprintf("garbage at %d", at), func(b []byte) []byte {
			for i := at; i < at+64 && i < len(b); i++ {
				b[i] = byte(rng.IntN(256))
			}
			return b
		}})
	}
	for i, c := range cases {
		dir := filepath.Join(base, fmt.Sprint("meta", i))
		copyDir(t, good, dir)
		if err := os.WriteFile(metaPath(dir), c.do(slices.Clone(data)), 0o600); err != nil {
			t.Fatal(err)
		}
		outcome(t, dir, acked, "wal-meta.db "+c.name)
	}
	// No wal-meta.db beside segments: raft-wal would start an empty log and
	// delete them.
	dir := filepath.Join(base, "nometa")
	copyDir(t, good, dir)
	os.Remove(metaPath(dir))
	if !outcome(t, dir, acked, "wal-meta.db removed") {
		t.Fatal("a log without wal-meta.db opened")
	}
}

// TestSecondOpenerFails: one process per log, and no offline reader while
// an agent writes it; both fail at once instead of waiting.
func TestSecondOpenerFails(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, Options{SegmentSize: smallSegments})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := Open(dir, Options{}); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("second Open: %v, want in use", err)
	}
	if _, err := OpenReadOnly(dir); err == nil || !strings.Contains(err.Error(), "an agent is running") {
		t.Fatalf("OpenReadOnly while open: %v, want an agent is running", err)
	}
}
