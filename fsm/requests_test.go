package fsm

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// TestRequestTableAsMap checks the request table against the map of id
// strings it replaces: ids in NewRequestID's form and every near miss of it
// (upper case, a digit short or long, a non-hex letter, all zeros), puts
// that replace, records with and without details, growth from empty and
// from a sized index, and the sorted listing snapshots use.
func TestRequestTableAsMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	randomHex := func() string {
		var b [16]byte
		for i := range b {
			b[i] = byte(rng.UintN(256))
		}
		return hex.EncodeToString(b[:])
	}
	var ids []string
	for range 20000 {
		ids = append(ids, randomHex())
	}
	h := randomHex()
	ids = append(ids, "", "a", "00000000000000000000000000000000", "ffffffffffffffffffffffffffffffff",
		h[:31], h+"0", "g"+h[1:], "A"+h[1:], h[:16]+"-"+h[17:], "request-1", "ÿ"+h[2:])
	for _, sized := range []bool{false, true} {
		t.Run(fmt.Sprintf("sized=%v", sized), func(t *testing.T) {
			tab := newRequestTable()
			if sized {
				tab.expect(len(ids))
			}
			want := map[string]appliedRequest{}
			for i := range 3 * len(ids) {
				id := ids[rng.IntN(len(ids))]
				if id == "" {
					continue
				}
				a := appliedRequest{index: uint64(i), code: pb.Code(rng.IntN(8)), outcome: pb.Outcome(rng.Int32()),
					message: fmt.Sprintf("message %d %s", i, id)}
				switch i % 50 {
				case 0:
					a.message = ""
				case 1:
					a.message = string(bytes.Repeat([]byte{'m'}, textChunk/4))
				case 2:
					a.detail = &requestDetail{warnings: []string{"w"}, violations: []*pb.Violation{{Field: "f", Description: "d"}}}
				}
				if _, ok := want[id]; !ok || i%3 == 0 {
					want[id] = a
					tab.put(id, a)
				}
				if got, ok := lookupID(tab, id); !ok || !reflect.DeepEqual(got, want[id]) {
					t.Fatalf("get(%q) = %+v, %v; want %+v", id, got, ok, want[id])
				}
			}
			for _, id := range ids {
				got, ok := lookupID(tab, id)
				if w, wok := want[id]; ok != wok || !reflect.DeepEqual(got, w) {
					t.Fatalf("get(%q) = %+v, %v; want %+v, %v", id, got, ok, w, wok)
				}
			}
			if tab.Len() != len(want) {
				t.Fatalf("%d ids, want %d", tab.Len(), len(want))
			}
			var gotIDs []string
			tab.sorted(func(id string, a appliedRequest) {
				if !reflect.DeepEqual(a, want[id]) {
					t.Fatalf("sorted record of %q = %+v, want %+v", id, a, want[id])
				}
				gotIDs = append(gotIDs, id)
			})
			if !slices.Equal(gotIDs, sortedKeys(want)) {
				t.Fatalf("sorted ids differ")
			}
		})
	}
}

// TestRequestDedupAndSnapshot applies duplicates of every id form through
// ApplyBytes and round-trips the state through both restores, including a
// snapshot that lists an id twice (the later wins, as with proto.Unmarshal
// into a map).
func TestRequestDedupAndSnapshot(t *testing.T) {
	f := New()
	ids := []string{"0123456789abcdef0123456789abcdef", "0123456789ABCDEF0123456789ABCDEF", "x", "00000000000000000000000000000000"}
	index := uint64(0)
	apply := func(id, name string) *pb.Result {
		index++
		env := &pb.Envelope{RequestId: id, Command: &pb.Envelope_CreateAccelerator{CreateAccelerator: &pb.CreateAccelerator{
			Name: name, Spec: &pb.AcceleratorSpec{Device: "l4", Tenancy: pb.Tenancy_TENANCY_DEDICATED, DevicesPerReplica: 1}}}}
		return f.Apply(index, env)
	}
	for i, id := range ids {
		first := apply(id, fmt.Sprintf("acc-%d", i))
		again := apply(id, fmt.Sprintf("other-%d", i))
		if !again.Duplicate || again.Message != first.Message || again.Code != first.Code || !slices.Equal(again.Warnings, first.Warnings) {
			t.Fatalf("id %q: first %v, again %v", id, first, again)
		}
	}
	bad := apply("bad-request", "BAD NAME")
	if bad.Code == pb.Code_CODE_OK || len(bad.Violations) == 0 {
		t.Fatalf("want a rejection with violations, got %v", bad)
	}
	if again := apply("bad-request", "ok"); !again.Duplicate || !proto.Equal(again.Violations[0], bad.Violations[0]) {
		t.Fatalf("duplicate of a rejection: %v", again)
	}

	snap, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	st := f.State()
	if len(st.AppliedRequests) != len(ids)+1 || !slices.IsSortedFunc(st.AppliedRequests, func(a, b *pb.AppliedRequest) int {
		return cmpString(a.RequestId, b.RequestId)
	}) {
		t.Fatalf("applied requests: %v", st.AppliedRequests)
	}
	for _, restore := range []func(*FSM, []byte) error{(*FSM).Restore, func(g *FSM, b []byte) error { return g.RestoreFrom(bytes.NewReader(b)) }} {
		g := New()
		if err := restore(g, snap); err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(g.State(), st) {
			t.Fatal("restored state differs")
		}
		// The restored table answers lookups (its index is built at the end
		// of a restore).
		for _, id := range append(ids, "bad-request") {
			if _, ok := lookupID(g.requests, id); !ok {
				t.Fatalf("restored table lacks %q", id)
			}
		}
		if _, ok := lookupID(g.requests, "0123456789abcdef0123456789abcdee"); ok {
			t.Fatal("restored table has an id never applied")
		}
		// A snapshot listing an id twice: the later record wins.
		dup := proto.Clone(st).(*pb.State)
		later := proto.Clone(dup.AppliedRequests[0]).(*pb.AppliedRequest)
		later.Result.Message = "later"
		dup.AppliedRequests = append(dup.AppliedRequests, later)
		b, err := proto.Marshal(dup)
		if err != nil {
			t.Fatal(err)
		}
		if err := restore(g, b); err != nil {
			t.Fatal(err)
		}
		want := &pb.State{}
		if err := proto.Unmarshal(b, want); err != nil {
			t.Fatal(err)
		}
		want.AppliedRequests = append(want.AppliedRequests[1:len(want.AppliedRequests)-1:len(want.AppliedRequests)-1], later)
		slices.SortFunc(want.AppliedRequests, func(a, b *pb.AppliedRequest) int { return cmpString(a.RequestId, b.RequestId) })
		if !proto.Equal(g.State(), want) {
			t.Fatalf("restored %v\nwant %v", g.State().AppliedRequests, want.AppliedRequests)
		}
		if r, ok := lookupID(g.requests, later.RequestId); !ok || r.message != "later" || g.requests.Len() != len(ids)+1 {
			t.Fatalf("after a duplicate: %q %v, %d ids", r.message, ok, g.requests.Len())
		}
	}
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// TestRequestWindowBounded applies a long stream of commands, one second of
// log time apart, under a 1000-second window: the table never holds much
// more than two windows of ids, a snapshot lists exactly the ids of the
// last window, a retry is a duplicate inside the window and applied again
// after it, and when the table compacts changes nothing a snapshot shows
// (a state machine compacting far more often ends byte-identical).
func TestRequestWindowBounded(t *testing.T) {
	const (
		n      = 60000
		window = 1000
	)
	live, eager := New(), New()
	idOf := func(i int) string {
		if i%7 == 0 {
			return fmt.Sprintf("req-%d", i) // not NewRequestID's form: kept in the map
		}
		return fmt.Sprintf("%032x", i)
	}
	envAt := func(i int, id string) *pb.Envelope {
		env := &pb.Envelope{RequestId: id, ProposedAt: &timestamppb.Timestamp{Seconds: 1767225600 + int64(i)},
			Command: &pb.Envelope_DeleteAccelerator{DeleteAccelerator: &pb.DeleteAccelerator{Name: "none"}}}
		if i == 0 {
			env.RequestWindow = &durationpb.Duration{Seconds: window}
		}
		return env
	}
	most := 0
	for i := range n {
		env := envAt(i, idOf(i))
		r1 := live.Apply(uint64(i+1), env)
		r2 := eager.Apply(uint64(i+1), env)
		if i%97 == 0 {
			eager.requests.compact()
		}
		if r1.Duplicate || r2.Duplicate {
			t.Fatalf("entry %d: a new id answered as a duplicate", i+1)
		}
		most = max(most, live.requests.Len())
	}
	if most > 2*window+compactMin {
		t.Errorf("the table held %d ids at most, want at most %d (two windows and the first compaction's threshold)", most, 2*window+compactMin)
	}
	st := live.State()
	if len(st.AppliedRequests) != window {
		t.Errorf("snapshot lists %d ids, want the %d of the last window", len(st.AppliedRequests), window)
	}
	a, _ := live.Snapshot()
	b, _ := eager.Snapshot()
	if !bytes.Equal(a, b) {
		t.Errorf("compacting at other moments changed the snapshot")
	}
	// The id applied window-1 seconds ago is still remembered; the one
	// applied window seconds ago is not.
	inside, outside := idOf(n-window+1), idOf(n-window)
	if res := live.Apply(n+1, envAt(n, inside)); !res.Duplicate {
		t.Errorf("retry inside the window: %v %q, want the first result as a duplicate", res.Code, res.Message)
	}
	if res := live.Apply(n+2, envAt(n, outside)); res.Duplicate || res.Code != pb.Code_CODE_NOT_FOUND {
		t.Errorf("retry after the window: duplicate %v, %v %q; want it applied to the current state (not found)", res.Duplicate, res.Code, res.Message)
	}
	// A restored state forgets and remembers exactly as the live one.
	restored := New()
	if err := restored.Restore(a); err != nil {
		t.Fatal(err)
	}
	for _, f := range []*FSM{restored} {
		f.Apply(n+1, envAt(n, inside))
		f.Apply(n+2, envAt(n, outside))
	}
	if !proto.Equal(restored.State(), live.State()) {
		t.Errorf("a restored state machine remembers other ids than the live one")
	}
}

// lookupID is how apply finds an id's record: a lookup, then the record.
func lookupID(t *requestTable, id string) (appliedRequest, bool) {
	p := t.lookup(requestKeyOf(id))
	if !p.found {
		return appliedRequest{}, false
	}
	return t.record(p), true
}
