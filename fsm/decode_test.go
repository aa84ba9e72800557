package fsm

import (
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// decoderEnvelopes is envelopes of every command, with the values the hand
// decoder treats specially (empty, zero, long, non-hex ids, odd enums).
func decoderEnvelopes() []*pb.Envelope {
	at := timestamppb.New(timestamppb.Now().AsTime())
	envs := []*pb.Envelope{
		{},
		{RequestId: "0123456789abcdef0123456789abcdef", Actor: "system", ProposedAt: at,
			Command: &pb.Envelope_ReplicaStatus{ReplicaStatus: &pb.ReplicaStatus{Model: "chat", Replica: 3, Generation: 2, Node: "n1",
				State: pb.ReplicaState_REPLICA_STATE_RUNNING, Reason: "ok", Restarts: 7, Endpoint: "http://10.0.0.1:8000"}}},
		{RequestId: "not-hex", Actor: "n1", ProposedAt: &timestamppb.Timestamp{},
			Command: &pb.Envelope_ReplicaStatus{ReplicaStatus: &pb.ReplicaStatus{}}},
		{Command: &pb.Envelope_ReplicaStatus{ReplicaStatus: &pb.ReplicaStatus{Model: strings.Repeat("m", 300), State: pb.ReplicaState(-3)}}},
		{RequestId: "ffffffffffffffffffffffffffffffff", ProposedAt: &timestamppb.Timestamp{Seconds: -5, Nanos: -1},
			Command: &pb.Envelope_PlaceReplicas{PlaceReplicas: &pb.PlaceReplicas{Policy: "binpack",
				Placements: []*pb.Placement{
					{Model: "chat", Replica: 0, Generation: 1, Node: "n1", Cards: []uint32{0, 1, 300, 1 << 31}, LegacyShareMilli: 450},
					{Model: "chat", Replica: 1, Generation: 1, Node: "n2"},
				},
				Pending: []*pb.PendingReason{{Model: "chat", Replica: 2, Reason: "no room"}, {}}}}},
		{Command: &pb.Envelope_PlaceReplicas{PlaceReplicas: &pb.PlaceReplicas{}}},
		{Command: &pb.Envelope_DeleteModel{DeleteModel: &pb.DeleteModel{Name: "chat"}}},
		{Command: &pb.Envelope_DeleteModel{DeleteModel: &pb.DeleteModel{}}},
		{Command: &pb.Envelope_SetNodeStatus{SetNodeStatus: &pb.SetNodeStatus{Node: "n1", Status: pb.NodeStatus_NODE_STATUS_DOWN}}},
		{Command: &pb.Envelope_UnplaceReplica{UnplaceReplica: &pb.UnplaceReplica{Model: "chat", Replica: 1, Reason: "drain"}}},
		{Command: &pb.Envelope_RegisterNode{RegisterNode: &pb.RegisterNode{Node: &pb.Node{Name: "n1", Labels: map[string]string{"a": "b"},
			Cards: []*pb.Card{{Index: 0, Uuid: "u", Device: "l4", MemoryMib: 23034, Healthy: true}}}}}},
		{Command: &pb.Envelope_UpdateInventory{UpdateInventory: &pb.UpdateInventory{Node: "n1", Cards: []*pb.Card{{Index: 1}}}}},
		{Command: &pb.Envelope_DeregisterNode{DeregisterNode: &pb.DeregisterNode{Node: "n1"}}},
		{Command: &pb.Envelope_CreateAccelerator{CreateAccelerator: &pb.CreateAccelerator{Name: "x", Spec: &pb.AcceleratorSpec{Device: "l4", Tenancy: pb.Tenancy_TENANCY_SHARED}}}},
		{RequestId: "0123456789abcdef0123456789abcdef", Actor: "ops", ProposedAt: at, Command: &pb.Envelope_CreateAccelerator{CreateAccelerator: &pb.CreateAccelerator{
			Name: "y", Upsert: true, Spec: &pb.AcceleratorSpec{Device: "h100", Tenancy: pb.Tenancy(-7), MaxModels: 1 << 31, DevicesPerReplica: 8}}}},
		{Command: &pb.Envelope_CreateAccelerator{CreateAccelerator: &pb.CreateAccelerator{Spec: &pb.AcceleratorSpec{}}}},
		{Command: &pb.Envelope_CreateAccelerator{CreateAccelerator: &pb.CreateAccelerator{}}},
		{Command: &pb.Envelope_DeleteAccelerator{DeleteAccelerator: &pb.DeleteAccelerator{Name: "x", Force: true}}},
		{RequestId: "0123456789abcdef0123456789abcdee", Actor: "system", ProposedAt: at,
			Command: &pb.Envelope_ApplyModel{ApplyModel: &pb.ApplyModel{Name: "m", Spec: &pb.ModelSpec{Model: "w", Replicas: 2,
				Placement: &pb.PlacementSpec{Accelerator: "small", NodeSelector: map[string]string{"zone": "a"}}, Engine: &pb.EngineSpec{MemoryPercent: 40}}}}},
		{Command: &pb.Envelope_ApplyModel{ApplyModel: &pb.ApplyModel{Name: "m2", Spec: &pb.ModelSpec{Model: "/w", ServedModelName: "s", Replicas: 4,
			Placement: &pb.PlacementSpec{Accelerator: "a"}, Resources: &pb.HostResources{CpuMilli: 4000, MemoryMib: 1 << 40},
			Engine: &pb.EngineSpec{Kind: "vllm", MemoryPercent: 3, MemoryMib: 5, ComputePercent: 7, MaxModelLen: 8192, TensorParallel: 2, PipelineParallel: 3,
				Args: []string{"--a", "", "b"}, StartTimeoutSeconds: 600}}}}},
		{Command: &pb.Envelope_ApplyModel{ApplyModel: &pb.ApplyModel{Name: "od", Spec: &pb.ModelSpec{Model: "/w", Placement: &pb.PlacementSpec{Accelerator: "a"},
			Residency: pb.Residency_RESIDENCY_ON_DEMAND, Priority: pb.Priority_PRIORITY_BACKGROUND, Slo: &pb.SLO{TtftMs: 800},
			Engine: &pb.EngineSpec{Kind: "sim", MemoryPercent: 60, Quantization: "q4_k_m"}}}}},
		{Command: &pb.Envelope_ApplyModel{ApplyModel: &pb.ApplyModel{Name: "odd", Spec: &pb.ModelSpec{Residency: pb.Residency(-2), Priority: pb.Priority(99), Slo: &pb.SLO{}}}}},
		{Command: &pb.Envelope_ReplicaStatus{ReplicaStatus: &pb.ReplicaStatus{Model: "chat", Replica: 1, Generation: 1, Node: "n1",
			State: pb.ReplicaState_REPLICA_STATE_RUNNING, Residency: pb.ReplicaResidency_REPLICA_RESIDENCY_SLEEPING, ResidencyReason: "idle 300s"}}},
		{Command: &pb.Envelope_ApplyModel{ApplyModel: &pb.ApplyModel{Name: "m3", Spec: &pb.ModelSpec{Engine: &pb.EngineSpec{Env: map[string]string{"A": "1"}}}}}},
		{Command: &pb.Envelope_ApplyModel{ApplyModel: &pb.ApplyModel{Spec: &pb.ModelSpec{Placement: &pb.PlacementSpec{}, Engine: &pb.EngineSpec{}, Resources: &pb.HostResources{}}}}},
		{Command: &pb.Envelope_ApplyModel{ApplyModel: &pb.ApplyModel{}}},
		{Command: &pb.Envelope_BootstrapAcl{BootstrapAcl: &pb.BootstrapACL{Name: "root", SecretHash: "h"}}},
		{Command: &pb.Envelope_CreateToken{CreateToken: &pb.CreateToken{Name: "t"}}},
		{Command: &pb.Envelope_DeleteToken{DeleteToken: &pb.DeleteToken{Name: "t"}}},
	}
	return envs
}

// decoderCorpus is decoderEnvelopes marshalled, and encodings Marshal never
// writes.
func decoderCorpus() [][]byte {
	var out [][]byte
	for _, env := range decoderEnvelopes() {
		data, err := Marshal(env)
		if err != nil {
			panic(err)
		}
		out = append(out, data)
	}
	// Encodings Marshal never writes but proto.Unmarshal reads: repeated
	// fields (the last scalar wins, messages merge, a second command
	// replaces the first), unpacked cards, unknown fields, explicit zeros,
	// a string that is not UTF-8, fixed-width values.
	tag := func(b []byte, num protowire.Number, typ protowire.Type) []byte {
		return protowire.AppendTag(b, num, typ)
	}
	str := func(b []byte, num protowire.Number, s string) []byte {
		return protowire.AppendBytes(tag(b, num, protowire.BytesType), []byte(s))
	}
	msg := func(b []byte, num protowire.Number, m []byte) []byte {
		return protowire.AppendBytes(tag(b, num, protowire.BytesType), m)
	}
	varint := func(b []byte, num protowire.Number, v uint64) []byte {
		return protowire.AppendVarint(tag(b, num, protowire.VarintType), v)
	}
	rs := varint(str(nil, 1, "chat"), 2, 0)
	out = append(out,
		str(str(nil, 1, "a"), 1, "b"),
		str(str(nil, 2, "a"), 2, "b"),
		msg(msg(nil, 20, rs), 20, str(nil, 4, "n1")),
		msg(msg(nil, 20, rs), 17, str(nil, 1, "x")),
		msg(nil, 20, str(rs, 1, "again")),
		msg(nil, 20, varint(rs, 5, 1<<40)),
		msg(nil, 20, varint(rs, 99, 1)),
		msg(nil, 20, str(nil, 1, "\xff\xfe")),
		str(nil, 1, "\xff"),
		str(nil, 2, "ok\xc3"),
		msg(nil, 3, varint(varint(nil, 1, 5), 1, 6)),
		msg(msg(nil, 3, varint(nil, 1, 5)), 3, varint(nil, 2, 6)),
		msg(nil, 3, protowire.AppendFixed32(tag(nil, 1, protowire.Fixed32Type), 1)),
		msg(nil, 3, varint(nil, 2, 1<<33)),
		varint(nil, 1, 1),
		varint(nil, 24, 1),
		msg(nil, 24, nil),
		msg(nil, 18, msg(nil, 1, varint(varint(str(nil, 1, "chat"), 5, 3), 5, 4))),
		msg(nil, 18, msg(nil, 1, msg(msg(nil, 5, []byte{1, 2}), 5, []byte{3}))),
		msg(nil, 18, msg(nil, 1, msg(nil, 5, nil))),
		msg(nil, 18, msg(nil, 1, msg(nil, 5, []byte{0x80}))),
		msg(nil, 18, msg(nil, 1, msg(nil, 5, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}))),
		msg(nil, 18, str(msg(nil, 1, nil), 3, "p")),
		msg(nil, 18, msg(nil, 4, nil)),
		msg(nil, 12, varint(str(nil, 1, ""), 2, 1<<35)),
		msg(nil, 19, str(varint(nil, 2, 0), 3, "")),
		msg(nil, 16, str(nil, 1, "\xff")),
		msg(nil, 16, msg(msg(nil, 2, str(nil, 1, "w")), 2, varint(nil, 3, 2))),
		msg(nil, 16, msg(nil, 2, msg(msg(nil, 5, str(nil, 8, "x")), 5, varint(nil, 2, 9)))),
		msg(nil, 16, msg(nil, 2, msg(nil, 6, varint(varint(nil, 1, 1<<33), 3, 1)))),
		msg(nil, 16, msg(nil, 2, msg(nil, 4, str(str(nil, 1, "a"), 1, "b")))),
		msg(nil, 16, str(nil, 99, "x")),
		// SLO twice (merged), a field of it twice, a quantization twice.
		msg(nil, 16, msg(nil, 2, msg(msg(nil, 9, varint(nil, 1, 5)), 9, varint(nil, 1, 6)))),
		msg(nil, 16, msg(nil, 2, msg(nil, 9, varint(varint(nil, 1, 5), 1, 1<<40)))),
		msg(nil, 16, msg(nil, 2, msg(nil, 9, str(nil, 1, "x")))),
		msg(nil, 16, msg(nil, 2, msg(nil, 5, str(str(nil, 11, "fp8"), 11, "awq")))),
		msg(nil, 16, msg(nil, 2, varint(varint(nil, 7, 3), 8, 1<<63))),
		msg(nil, 20, str(varint(rs, 9, 5), 10, "\xff")),
		// CreateAccelerator: a spec twice (merged), a name twice, fields
		// of the spec twice, an unknown field, a wide varint.
		msg(nil, 14, msg(msg(nil, 2, str(nil, 1, "l4")), 2, varint(nil, 3, 2))),
		msg(nil, 14, str(str(varint(nil, 3, 1), 1, "a"), 1, "b")),
		msg(nil, 14, msg(nil, 2, varint(varint(str(str(nil, 1, "a"), 1, "b"), 4, 1<<33), 4, 3))),
		msg(nil, 14, msg(nil, 2, varint(nil, 2, 1<<63))),
		msg(nil, 14, msg(nil, 2, varint(nil, 9, 1))),
		msg(nil, 14, varint(nil, 3, 300)),
		msg(nil, 14, str(nil, 1, "\xff")),
		[]byte{0xff, 0x01},
		[]byte{0x0a},
		[]byte{0x0a, 0x05, 'a'},
	)
	return out
}

// checkDecoder checks that d decodes data exactly as proto.Unmarshal does,
// and that the result does not alias data.
func checkDecoder(t *testing.T, d *Decoder, data []byte) {
	t.Helper()
	ref := &pb.Envelope{}
	refErr := proto.Unmarshal(data, ref)
	buf := append([]byte(nil), data...)
	env, err := d.decode(buf)
	e := d.DecodeEntry(append([]byte(nil), data...))
	if (err == nil) != (e.err == nil) || err != nil && err.Error() != e.err.Error() {
		t.Fatalf("%x: decode error %v, DecodeEntry's %v", data, err, e.err)
	}
	e.env = env
	switch {
	case (e.err == nil) != (refErr == nil):
		t.Fatalf("%x: error %v, proto.Unmarshal's %v", data, e.err, refErr)
	case refErr != nil:
		if e.err.Error() != refErr.Error() {
			t.Fatalf("%x: error %q, proto.Unmarshal's %q", data, e.err, refErr)
		}
		return
	}
	for i := range buf {
		buf[i] = 0xee
	}
	if !proto.Equal(e.env, ref) {
		t.Fatalf("%x: decoded %v, proto.Unmarshal %v", data, e.env, ref)
	}
	if e.request != requestKeyOf(ref.GetRequestId()) {
		t.Fatalf("%x: request key %+v, want %+v", data, e.request, requestKeyOf(ref.GetRequestId()))
	}
}

func TestDecoderMatchesProto(t *testing.T) {
	shared := &Decoder{Slab: 64}
	rng := rand.New(rand.NewPCG(1, 2))
	// recycling is reset every few entries: a recycled message must decode
	// as a fresh one (nothing left of its previous use).
	recycling := &Decoder{Slab: 3}
	for i, data := range decoderCorpus() {
		checkDecoder(t, &Decoder{}, data)
		checkDecoder(t, shared, data)
		checkDecoder(t, recycling, data)
		if i%2 == 1 {
			recycling.Reset()
		}
		// Every truncation, and damaged copies.
		for n := range len(data) {
			checkDecoder(t, shared, data[:n])
		}
		for range 200 {
			b := append([]byte(nil), data...)
			if len(b) == 0 {
				break
			}
			for range 1 + rng.IntN(3) {
				b[rng.IntN(len(b))] = byte(rng.Uint32())
			}
			checkDecoder(t, shared, b)
			checkDecoder(t, recycling, b)
			recycling.Reset()
		}
	}
}

// TestDecoderEnvelopesIndependent checks that envelopes decoded by one
// Decoder share nothing that changing one could change in another.
func TestDecoderEnvelopesIndependent(t *testing.T) {
	d := &Decoder{Slab: 8}
	corpus := decoderCorpus()
	first := make([]Entry, len(corpus))
	second := make([]Entry, len(corpus))
	decode := func(data []byte) Entry {
		env, err := d.decode(data)
		return Entry{env: env, err: err}
	}
	for i, data := range corpus {
		first[i] = decode(data)
		second[i] = decode(data)
	}
	for _, e := range first {
		if e.err != nil {
			continue
		}
		if p := e.env.GetPlaceReplicas(); p != nil {
			for _, pl := range p.Placements {
				pl.Cards = append(pl.Cards, 99)
				for j := range pl.Cards {
					pl.Cards[j]++
				}
				pl.Node = "changed"
			}
			p.Placements = append(p.Placements, &pb.Placement{Model: "x"})
			p.Pending = append(p.Pending, &pb.PendingReason{Model: "x"})
		}
		if s := e.env.GetReplicaStatus(); s != nil {
			s.Model = "changed"
		}
		if ts := e.env.GetProposedAt(); ts != nil {
			ts.Seconds++
		}
		e.env.Actor = "changed"
	}
	for i, e := range second {
		ref := &pb.Envelope{}
		if err := proto.Unmarshal(corpus[i], ref); (err == nil) != (e.err == nil) || err == nil && !proto.Equal(ref, e.env) {
			t.Fatalf("entry %x changed by another's change: %v", corpus[i], e.env)
		}
	}
}

func FuzzDecoder(f *testing.F) {
	for _, data := range decoderCorpus() {
		f.Add(data)
	}
	d := &Decoder{Slab: 16}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkDecoder(t, d, data)
		checkDecoder(t, &Decoder{}, data)
	})
}

// TestDecoderReadsCommonCommands checks that the envelopes Marshal writes of
// the commands read by hand are read by hand, not left to protobuf.
func TestDecoderReadsCommonCommands(t *testing.T) {
	d := &Decoder{Slab: 4}
	handled := 0
	for _, env := range decoderEnvelopes() {
		data, err := Marshal(env)
		if err != nil {
			t.Fatal(err)
		}
		switch env.GetCommand().(type) {
		case *pb.Envelope_ReplicaStatus, *pb.Envelope_PlaceReplicas, *pb.Envelope_DeleteModel,
			*pb.Envelope_SetNodeStatus, *pb.Envelope_UnplaceReplica, *pb.Envelope_ApplyModel, *pb.Envelope_CreateAccelerator, nil:
			if d.envelope(data) == nil {
				t.Errorf("%v: left to protobuf", env)
			}
			handled++
		}
	}
	if handled < 10 {
		t.Fatalf("only %d envelopes checked", handled)
	}
}

// resetWorkload is a log that exercises every command the Decoder reads by
// hand, each accepted: deployments placed on varying cards, reports with
// reasons and endpoints, unplacements, node flaps and deletions.
func resetWorkload(t *testing.T) [][]byte {
	var envs []*pb.Envelope
	id := 0
	add := func(env *pb.Envelope) {
		id++
		env.RequestId = strings.Repeat("0", 24) + strings.Repeat("f", 8-len(strconvItoa(id))) + strconvItoa(id)
		if id%5 == 0 {
			env.RequestId = "req-" + strconvItoa(id) // not hex: kept as a string
		}
		env.Actor = "system"
		env.ProposedAt = &timestamppb.Timestamp{Seconds: int64(id)}
		envs = append(envs, env)
	}
	for n := range 2 {
		node := &pb.Node{Name: "n" + strconvItoa(n), Role: pb.NodeRole_NODE_ROLE_CLIENT, Status: pb.NodeStatus_NODE_STATUS_ALIVE}
		for c := range 8 {
			node.Cards = append(node.Cards, &pb.Card{Index: uint32(c), Uuid: "u" + strconvItoa(10*n+c), Device: "l4", MemoryMib: 23034, Healthy: true})
		}
		add(&pb.Envelope{Command: &pb.Envelope_RegisterNode{RegisterNode: &pb.RegisterNode{Node: node}}})
	}
	add(&pb.Envelope{Command: &pb.Envelope_CreateAccelerator{CreateAccelerator: &pb.CreateAccelerator{Name: "d", Spec: &pb.AcceleratorSpec{Device: "l4", DevicesPerReplica: 1}}}})
	for k := range 12 {
		name := "m" + strconvItoa(k)
		node := "n" + strconvItoa(k%2)
		slot := uint32(k % 4 * 2) // two cards per model, a slot of the node
		if k >= 4 {
			add(&pb.Envelope{Command: &pb.Envelope_DeleteModel{DeleteModel: &pb.DeleteModel{Name: "m" + strconvItoa(k-4)}}})
		}
		add(&pb.Envelope{Command: &pb.Envelope_ApplyModel{ApplyModel: &pb.ApplyModel{Name: name, Spec: &pb.ModelSpec{Model: "w", Replicas: 3,
			Placement: &pb.PlacementSpec{Accelerator: "d"}}}}})
		add(&pb.Envelope{Command: &pb.Envelope_PlaceReplicas{PlaceReplicas: &pb.PlaceReplicas{Policy: "binpack",
			Placements: []*pb.Placement{
				{Model: name, Replica: 0, Generation: 1, Node: node, Cards: []uint32{slot}},
				{Model: name, Replica: 1, Generation: 1, Node: node, Cards: []uint32{slot + 1}},
			},
			Pending: []*pb.PendingReason{{Model: name, Replica: 2, Reason: "no room for " + name}}}}})
		for r := range uint32(2) {
			add(&pb.Envelope{Command: &pb.Envelope_ReplicaStatus{ReplicaStatus: &pb.ReplicaStatus{Model: name, Replica: r, Generation: 1, Node: node,
				State: pb.ReplicaState_REPLICA_STATE_RUNNING, Reason: "up " + name, Restarts: r + 1, Endpoint: "http://" + node + ":" + strconvItoa(k)}}})
		}
		add(&pb.Envelope{Command: &pb.Envelope_UnplaceReplica{UnplaceReplica: &pb.UnplaceReplica{Model: name, Replica: 1, Reason: "moved " + name}}})
		add(&pb.Envelope{Command: &pb.Envelope_PlaceReplicas{PlaceReplicas: &pb.PlaceReplicas{
			Placements: []*pb.Placement{{Model: name, Replica: 1, Generation: 1, Node: node, Cards: []uint32{slot + 1}}}}}})
		if k%3 == 2 {
			other := "n" + strconvItoa((k+1)%2)
			add(&pb.Envelope{Command: &pb.Envelope_SetNodeStatus{SetNodeStatus: &pb.SetNodeStatus{Node: other, Status: pb.NodeStatus_NODE_STATUS_DOWN}}})
			add(&pb.Envelope{Command: &pb.Envelope_SetNodeStatus{SetNodeStatus: &pb.SetNodeStatus{Node: other, Status: pb.NodeStatus_NODE_STATUS_ALIVE}}})
		}
	}
	var out [][]byte
	for _, env := range envs {
		data, err := Marshal(env)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, data)
	}
	return out
}

func strconvItoa(i int) string { return strconv.Itoa(i) }

// TestDecoderResetKeepsState checks that a replay whose Decoder recycles
// each batch's messages (Reset) reaches the state, snapshot and hash that
// decoding every entry afresh does: that is, that applying keeps none of the
// messages the Decoder reads by hand. ReplayEntry, which reuses results,
// must reach them too.
func TestDecoderResetKeepsState(t *testing.T) {
	log := resetWorkload(t)
	want := New()
	for i, data := range log {
		if res := want.ApplyBytes(uint64(i+1), data); res.Code != pb.Code_CODE_OK {
			t.Fatalf("entry %d: %v", i+1, res)
		}
	}
	for _, batch := range []int{1, 3, 7} {
		got := New()
		d := (&Decoder{Slab: 4}).Sibling()
		for i := 0; i < len(log); i += batch {
			entries := make([]Entry, 0, batch)
			for _, data := range log[i:min(i+batch, len(log))] {
				entries = append(entries, d.DecodeEntry(data))
			}
			for j, e := range entries {
				if batch == 1 {
					got.ApplyEntry(uint64(i+j+1), e)
				} else {
					got.ReplayEntry(uint64(i+j+1), e) // the same, results aside
				}
			}
			d.Reset()
		}
		// Decoding more overwrites whatever the state might still point at.
		for _, data := range log {
			d.DecodeEntry(data)
		}
		if got.Hash() != want.Hash() || !proto.Equal(got.State(), want.State()) {
			t.Fatalf("batches of %d: state differs from decoding afresh", batch)
		}
		a, err := got.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		b, _ := want.Snapshot()
		if string(a) != string(b) {
			t.Fatalf("batches of %d: snapshot differs", batch)
		}
	}
}

// BenchmarkDecodeEntry decodes a replica report, the most common entry,
// with a recycling Decoder (as a replay's reader does) and with
// proto.Unmarshal.
func BenchmarkDecodeEntry(b *testing.B) {
	data, err := Marshal(&pb.Envelope{RequestId: "0123456789abcdef0123456789abcdef", Actor: "system", ProposedAt: timestamppb.Now(),
		Command: &pb.Envelope_ReplicaStatus{ReplicaStatus: &pb.ReplicaStatus{Model: "model-1234", Replica: 3, Generation: 1, Node: "gpu-07",
			State: pb.ReplicaState_REPLICA_STATE_RUNNING, Endpoint: "http://10.1.0.7:8003"}}})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("Decoder", func(b *testing.B) {
		d := &Decoder{Slab: 256}
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if e := d.DecodeEntry(data); e.err != nil {
				b.Fatal(e.err)
			}
			if i++; i%256 == 0 {
				d.Reset()
			}
		}
	})
	model, err := Marshal(&pb.Envelope{RequestId: "0123456789abcdef0123456789abcdef", Actor: "system", ProposedAt: timestamppb.Now(),
		Command: &pb.Envelope_ApplyModel{ApplyModel: &pb.ApplyModel{Name: "model-1234", Spec: &pb.ModelSpec{
			Model: "/models/llama-3.1-8b-instruct", ServedModelName: "model-1234", Replicas: 4,
			Placement: &pb.PlacementSpec{Accelerator: "l4-dedicated"},
			Engine:    &pb.EngineSpec{Kind: "vllm", MaxModelLen: 8192, Args: []string{"--enable-prefix-caching"}},
			Resources: &pb.HostResources{CpuMilli: 4000, MemoryMib: 16384}}}}})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("Decoder/ApplyModel", func(b *testing.B) {
		d := &Decoder{Slab: 256}
		b.ReportAllocs()
		for b.Loop() {
			if _, err := d.decode(model); err != nil {
				b.Fatal(err)
			}
			d.Reset()
		}
	})
	b.Run("proto.Unmarshal/ApplyModel", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := proto.Unmarshal(model, &pb.Envelope{}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("proto.Unmarshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			env := &pb.Envelope{}
			if err := proto.Unmarshal(data, env); err != nil {
				b.Fatal(err)
			}
			_ = requestKeyOf(env.GetRequestId())
		}
	})
}

// fillAll sets every field of m that the hand decoder reads to a value
// other than its zero (maps, which are left to protobuf, excepted), through
// protobuf reflection, so that a field added to a command it reads by hand
// is filled too.
func fillAll(t *testing.T, m protoreflect.Message) {
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if fd.IsMap() {
			continue
		}
		var v protoreflect.Value
		switch fd.Kind() {
		case protoreflect.StringKind:
			v = protoreflect.ValueOfString("x" + string(fd.Name()))
		case protoreflect.EnumKind:
			v = protoreflect.ValueOfEnum(2)
		case protoreflect.Uint32Kind:
			v = protoreflect.ValueOfUint32(uint32(7 + i))
		case protoreflect.Uint64Kind:
			v = protoreflect.ValueOfUint64(uint64(1<<40 + i))
		case protoreflect.BoolKind:
			v = protoreflect.ValueOfBool(true)
		case protoreflect.Int64Kind:
			v = protoreflect.ValueOfInt64(int64(-3 - i))
		case protoreflect.Int32Kind:
			v = protoreflect.ValueOfInt32(int32(5 + i))
		case protoreflect.DoubleKind:
			v = protoreflect.ValueOfFloat64(1.5 + float64(i))
		case protoreflect.MessageKind:
			if fd.IsList() {
				l := m.Mutable(fd).List()
				e := l.NewElement()
				fillAll(t, e.Message())
				l.Append(e)
				continue
			}
			fillAll(t, m.Mutable(fd).Message())
			continue
		default:
			t.Fatalf("field %s of kind %s: teach fillAll about it", fd.FullName(), fd.Kind())
		}
		if fd.IsList() {
			l := m.Mutable(fd).List()
			l.Append(v)
			l.Append(v)
			continue
		}
		m.Set(fd, v)
	}
}

// TestDecoderReadsEveryField: the Decoder reads a command field by
// field and leaves anything it does not know to protobuf, which is correct
// but slow; a field added to a command it reads (a deployment's residency,
// a status report's residency) would silently send every such entry of a
// replay down the slow path. Every field set, each command must still be
// read by hand and match protobuf.
func TestDecoderReadsEveryField(t *testing.T) {
	envs := []*pb.Envelope{
		{Command: &pb.Envelope_ApplyModel{ApplyModel: &pb.ApplyModel{}}},
		{Command: &pb.Envelope_ReplicaStatus{ReplicaStatus: &pb.ReplicaStatus{}}},
		{Command: &pb.Envelope_PlaceReplicas{PlaceReplicas: &pb.PlaceReplicas{}}},
		{Command: &pb.Envelope_UnplaceReplica{UnplaceReplica: &pb.UnplaceReplica{}}},
		{Command: &pb.Envelope_DeleteModel{DeleteModel: &pb.DeleteModel{}}},
		{Command: &pb.Envelope_SetNodeStatus{SetNodeStatus: &pb.SetNodeStatus{}}},
		{Command: &pb.Envelope_CreateAccelerator{CreateAccelerator: &pb.CreateAccelerator{}}},
		// Left to protobuf by design (rare), but decoded the same, tenant
		// and weight included.
		{Command: &pb.Envelope_CreateToken{CreateToken: &pb.CreateToken{}}},
	}
	d := &Decoder{Slab: 4}
	// What reads each command by hand: nil means it was left to protobuf.
	byHand := map[protoreflect.Name]func([]byte) bool{
		"apply_model":        func(b []byte) bool { return applyModelFields.decode(d, &pb.ApplyModel{}, b) },
		"replica_status":     func(b []byte) bool { return replicaStatusFields.decode(d, &pb.ReplicaStatus{}, b) },
		"place_replicas":     func(b []byte) bool { return d.placeReplicas(b) != nil },
		"create_accelerator": func(b []byte) bool { return createAcceleratorFields.decode(d, &pb.CreateAccelerator{}, b) },
	}
	for _, env := range envs {
		env.RequestId, env.Actor, env.ProposedAt = "0123456789abcdef0123456789abcdef", "ops", &timestamppb.Timestamp{Seconds: 5, Nanos: 6}
		m := env.ProtoReflect()
		cmd := m.WhichOneof(m.Descriptor().Oneofs().ByName("command"))
		fillAll(t, m.Mutable(cmd).Message())
		data, err := Marshal(env)
		if err != nil {
			t.Fatal(err)
		}
		if d.envelope(data) == nil {
			t.Errorf("%s with every field set is left to protobuf: read the new field in decode_fields.go", cmd.Name())
		}
		if read := byHand[cmd.Name()]; read != nil {
			b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m.Get(cmd).Message().Interface())
			if err != nil {
				t.Fatal(err)
			}
			if !read(b) {
				t.Errorf("%s with every field set is left to protobuf: read the new field in decode_fields.go", cmd.Name())
			}
		}
		checkDecoder(t, d, data)
	}
}
