package fsm

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"time"
	"unicode/utf8"
	"unsafe"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// State returns the whole state as one message, with every list sorted, so
// that equal states have equal encodings.
func (f *FSM) State() *pb.State { return f.state(true) }

// state is State, with the applied requests or without them.
func (f *FSM) state(requests bool) *pb.State {
	st := &pb.State{AppliedIndex: f.applied, Hash: f.Hash()}
	for _, name := range sortedKeys(f.nodes) {
		st.Nodes = append(st.Nodes, proto.Clone(f.nodes[name]).(*pb.Node))
	}
	for _, name := range sortedKeys(f.accelerators) {
		st.Accelerators = append(st.Accelerators, proto.Clone(f.accelerators[name]).(*pb.StoredAccelerator))
	}
	for _, name := range sortedKeys(f.models) {
		st.Models = append(st.Models, proto.Clone(f.models[name]).(*pb.ModelDeployment))
	}
	for _, k := range f.sortedReplicaKeys() {
		st.Replicas = append(st.Replicas, proto.Clone(f.replicas[k]).(*pb.Replica))
	}
	for _, name := range sortedKeys(f.tokens) {
		st.Tokens = append(st.Tokens, proto.Clone(f.tokens[name]).(*pb.ACLToken))
	}
	st.AclBootstrapped = f.aclBootstrapped
	if f.logTime != 0 {
		st.LogTime = timestamppb.New(time.Unix(0, f.logTime))
	}
	if f.window != 0 {
		st.RequestWindow = durationpb.New(f.window)
	}
	if !requests {
		return st
	}
	st.AppliedRequests = make([]*pb.AppliedRequest, 0, f.requests.Len())
	f.requests.sorted(func(id string, a appliedRequest) {
		r := &pb.AppliedRequest{RequestId: id, Result: a.result()}
		if a.at != 0 {
			r.AppliedAt = timestamppb.New(time.Unix(0, a.at))
		}
		st.AppliedRequests = append(st.AppliedRequests, r)
	})
	return st
}

// Snapshot encodes the whole state deterministically.
func (f *FSM) Snapshot() ([]byte, error) {
	return proto.MarshalOptions{Deterministic: true}.Marshal(f.State())
}

// ViewSnapshot is Snapshot without the applied requests: what a server sends
// a client node to read (every listing, view and check a client node makes
// reads nodes, accelerators, models, replicas and tokens, never the request
// ids, which only applying entries consults). The requests are most of a
// long-lived cluster's snapshot: one per request id ever applied (78.9 MiB
// of 79 for a million-entry log). Restore takes it; the restored state
// answers reads but must not apply entries.
func (f *FSM) ViewSnapshot() ([]byte, error) {
	return proto.MarshalOptions{Deterministic: true}.Marshal(f.state(false))
}

// Restore replaces the state with a snapshot taken by Snapshot.
//
// The applied requests, which are most of a long-lived cluster's snapshot
// (one per request id ever applied), are decoded straight from the wire into
// the request table; the rest of the State goes through proto.Unmarshal.
func (f *FSM) Restore(data []byte) error {
	rest, requests, err := splitRequests(data)
	if err != nil {
		return fmt.Errorf("restore snapshot: %w", err)
	}
	return f.restore(rest, requests)
}

// restore replaces the state with rest, a marshalled State without its
// applied requests, and the requests decoded from it.
func (f *FSM) restore(rest []byte, requests *requestTable) error {
	st := &pb.State{}
	if err := proto.Unmarshal(rest, st); err != nil {
		return fmt.Errorf("restore snapshot: %w", err)
	}
	next := New()
	next.applied = st.AppliedIndex
	if st.Hash != "" {
		if n, err := hex.Decode(next.head[:], []byte(st.Hash)); err != nil || n != len(next.head) || len(st.Hash) != 2*len(next.head) {
			return fmt.Errorf("restore snapshot: hash %q is not a hex sha256", st.Hash)
		}
	}
	for _, n := range st.Nodes {
		next.nodes[n.Name] = n
	}
	next.indexDevices()
	for _, a := range st.Accelerators {
		next.accelerators[a.Name] = a
	}
	for _, m := range st.Models {
		next.models[m.Name] = m
	}
	for _, r := range st.Replicas {
		next.replicas[keyOf(r)] = r
		if r.Node != "" {
			next.occupy(r)
		}
	}
	for _, t := range st.Tokens {
		next.tokens[t.Name] = t
	}
	next.aclBootstrapped = st.AclBootstrapped
	if t := st.GetLogTime(); t != nil {
		next.logTime = unixNanos(t.GetSeconds(), t.GetNanos())
	}
	if w := st.GetRequestWindow(); w != nil {
		next.window = max(time.Duration(unixNanos(w.GetSeconds(), w.GetNanos())), 0)
	}
	next.requests = requests
	next.syncRequests()
	*f = *next
	return nil
}

// stateAppliedRequests is the field number of State.applied_requests.
const stateAppliedRequests = 5

var errTruncated = errors.New("truncated or malformed protobuf")

// splitRequests separates a marshalled State's applied_requests from its
// other fields: it returns those other fields, still marshalled, and the
// requests decoded into a request table, as proto.Unmarshal would have read
// them (later duplicates of an id win, strings must be UTF-8, unknown fields
// are skipped).
func splitRequests(data []byte) ([]byte, *requestTable, error) {
	// A first pass checks the framing, which the second trusts.
	for b := data; len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, nil, errTruncated
		}
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if m < 0 {
			return nil, nil, errTruncated
		}
		b = b[n+m:]
	}
	requests := newRequestTable()
	rest := make([]byte, 0, min(len(data), 1<<16))
	for b := data; len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if num != stateAppliedRequests || typ != protowire.BytesType {
			rest = append(rest, b[:n+m]...)
			b = b[n+m:]
			continue
		}
		v, _ := protowire.ConsumeBytes(b[n:])
		id, a, err := decodeAppliedRequest(v)
		if err != nil {
			return nil, nil, fmt.Errorf("applied request: %w", err)
		}
		requests.load(id, a)
		b = b[n+m:]
	}
	requests.index()
	return rest, requests, nil
}

// RestoreFrom is Restore reading the snapshot from r, field by field: a
// snapshot of a long-lived cluster is tens of megabytes, almost all of it
// applied requests, which are decoded as they are read rather than after
// reading the whole snapshot into memory.
func (f *FSM) RestoreFrom(r io.Reader) error {
	br, ok := r.(io.ByteReader)
	if !ok {
		b := bufio.NewReaderSize(r, 1<<16)
		r, br = b, b
	}
	// The requests go straight into the table, whose entries are never
	// moved as it grows (only its 8-byte index slots are rehashed).
	requests := newRequestTable()
	var rest, buf []byte
	for {
		tag, err := binary.ReadUvarint(br)
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("restore snapshot: %w", noEOF(err))
		}
		num, typ := protowire.DecodeTag(tag)
		if num <= 0 {
			return fmt.Errorf("restore snapshot: %w", errTruncated)
		}
		switch typ {
		case protowire.VarintType:
			v, err := binary.ReadUvarint(br)
			if err != nil {
				return fmt.Errorf("restore snapshot: %w", noEOF(err))
			}
			rest = protowire.AppendVarint(protowire.AppendTag(rest, num, typ), v)
		case protowire.Fixed32Type, protowire.Fixed64Type, protowire.BytesType:
			n := uint64(4)
			if typ == protowire.Fixed64Type {
				n = 8
			} else if typ == protowire.BytesType {
				if n, err = binary.ReadUvarint(br); err != nil {
					return fmt.Errorf("restore snapshot: %w", noEOF(err))
				}
				if n > math.MaxInt32 {
					return fmt.Errorf("restore snapshot: %w", errTruncated)
				}
			}
			if n > 1<<20 {
				// Big fields (there are none in practice) are read as
				// they come, so a corrupt length allocates nothing.
				if buf, err = io.ReadAll(io.LimitReader(r, int64(n))); err != nil {
					return fmt.Errorf("restore snapshot: %w", err)
				}
				if uint64(len(buf)) != n {
					return fmt.Errorf("restore snapshot: %w", io.ErrUnexpectedEOF)
				}
			} else {
				if uint64(cap(buf)) < n {
					buf = make([]byte, n, max(n, 4096))
				}
				buf = buf[:n]
				if _, err := io.ReadFull(r, buf); err != nil {
					return fmt.Errorf("restore snapshot: %w", noEOF(err))
				}
			}
			if num == stateAppliedRequests && typ == protowire.BytesType {
				id, a, err := decodeAppliedRequest(buf)
				if err != nil {
					return fmt.Errorf("restore snapshot: applied request: %w", err)
				}
				requests.load(id, a) // copies what aliases buf
				continue
			}
			rest = protowire.AppendTag(rest, num, typ)
			if typ == protowire.BytesType {
				rest = protowire.AppendVarint(rest, n)
			}
			rest = append(rest, buf...)
		default:
			// Groups: never written by Snapshot.
			return fmt.Errorf("restore snapshot: unexpected wire type %d", typ)
		}
	}
	requests.index()
	return f.restore(rest, requests)
}

func noEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// decodeAppliedRequest decodes one marshalled AppliedRequest. The id and the
// message it returns alias b: they are only valid until b changes, which is
// long enough to put them in a requestTable (which copies them).
func decodeAppliedRequest(b []byte) (string, appliedRequest, error) {
	var (
		id string
		a  appliedRequest
	)
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return "", a, errTruncated
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.BytesType:
			v, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return "", a, errTruncated
			}
			if !utf8.Valid(v) {
				return "", a, errors.New("request id is not valid UTF-8")
			}
			id, n = alias(v), m
		case num == 2 && typ == protowire.BytesType:
			v, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return "", a, errTruncated
			}
			if err := decodeResult(v, &a); err != nil {
				return "", a, err
			}
			n = m
		case num == 3 && typ == protowire.BytesType:
			v, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return "", a, errTruncated
			}
			ts := &timestamppb.Timestamp{}
			if err := proto.Unmarshal(v, ts); err != nil {
				return "", a, err
			}
			a.at = unixNanos(ts.GetSeconds(), ts.GetNanos())
			n = m
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return "", a, errTruncated
		}
		b = b[n:]
	}
	return id, a, nil
}

// decodeResult merges one marshalled Result into a, as proto.Unmarshal
// merges a message field.
func decodeResult(b []byte, a *appliedRequest) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return errTruncated
		}
		b = b[n:]
		switch {
		case (num == 1 || num == 5 || num == 7) && typ == protowire.VarintType:
			v, m := protowire.ConsumeVarint(b)
			if m < 0 {
				return errTruncated
			}
			switch num {
			case 1:
				a.code = pb.Code(int32(v))
			case 5:
				a.outcome = pb.Outcome(int32(v))
			case 7:
				a.index = v
			}
			n = m
		case (num == 2 || num == 3 || num == 4) && typ == protowire.BytesType:
			v, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return errTruncated
			}
			if num != 3 && !utf8.Valid(v) {
				return errors.New("result string is not valid UTF-8")
			}
			switch num {
			case 2:
				a.message = alias(v)
			case 3:
				viol := &pb.Violation{}
				if err := proto.Unmarshal(v, viol); err != nil {
					return err
				}
				a.more().violations = append(a.more().violations, viol)
			case 4:
				a.more().warnings = append(a.more().warnings, string(v))
			}
			n = m
		default:
			// duplicate (6) is never set on a remembered result; unknown
			// fields are dropped.
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return errTruncated
		}
		b = b[n:]
	}
	return nil
}

// alias returns b's bytes as a string without copying them: b must not
// change while the string is in use.
func alias(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}
