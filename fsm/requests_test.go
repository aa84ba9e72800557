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
				if got, ok := tab.get(id); !ok || !reflect.DeepEqual(got, want[id]) {
					t.Fatalf("get(%q) = %+v, %v; want %+v", id, got, ok, want[id])
				}
			}
			for _, id := range ids {
				got, ok := tab.get(id)
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
			if _, ok := g.requests.get(id); !ok {
				t.Fatalf("restored table lacks %q", id)
			}
		}
		if _, ok := g.requests.get("0123456789abcdef0123456789abcdee"); ok {
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
		if r, ok := g.requests.get(later.RequestId); !ok || r.message != "later" || g.requests.Len() != len(ids)+1 {
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
