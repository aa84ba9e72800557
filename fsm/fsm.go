package fsm

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math"
	"strings"
	"time"
	"unsafe"

	"google.golang.org/protobuf/proto"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// FSM is the replicated state and the code that changes it.
type FSM struct {
	applied uint64
	// head is the hash chain head after applied (all zeros before any
	// entry), kept binary: only Hash encodes it.
	head [sha256.Size]byte

	nodes        map[string]*pb.Node
	accelerators map[string]*pb.StoredAccelerator
	models       map[string]*pb.ModelDeployment
	replicas     map[replicaKey]*pb.Replica
	// cards indexes what placed replicas take from each card.
	cards map[cardKey]*cardUse
	// discard is set while ReplayEntry applies an entry whose result no
	// one reads: the common results are then spare, reused, rather than
	// allocated (accepted).
	discard bool
	spare   *pb.Result
	msgBuf  []byte // spare's message
	// chainBuf is chain's scratch buffer.
	chainBuf []byte
	// spareCards are cardUse records of cards since unbound, for occupy
	// to reuse (with their lists' room): never read as state.
	spareCards []*cardUse
	// spareReplicas are replicas since removed, for scale to reuse.
	spareReplicas []*pb.Replica
	// onNode indexes the placed replicas by node (occupy, release): derived,
	// rebuilt on Restore.
	onNode map[string]map[replicaKey]*pb.Replica
	// tracking and touched are TrackNodes' record (nodeview.go).
	tracking        bool
	touched         map[string][]*pb.Replica
	tokens          map[string]*pb.ACLToken
	aclBootstrapped bool
	// requests maps request ids to the result of their first application,
	// kept compact (requests.go): a million of them must stay cheap to hold,
	// scan and snapshot.
	requests *requestTable
	// logTime is the latest proposed_at of any applied entry, in Unix
	// nanoseconds: the clock request ids expire by. It never goes back,
	// though leaders' clocks may.
	logTime int64
	// window is the request-id window an entry last set (0: never, the
	// default).
	window time.Duration
	// devices indexes the inventory per device kind (models.go); rebuilt by
	// indexDevices whenever an inventory changes: derived, never part of the
	// state.
	devices map[string]deviceIndex
}

// New returns an empty state machine.
func New() *FSM {
	return &FSM{
		nodes:        map[string]*pb.Node{},
		accelerators: map[string]*pb.StoredAccelerator{},
		models:       map[string]*pb.ModelDeployment{},
		replicas:     map[replicaKey]*pb.Replica{},
		cards:        map[cardKey]*cardUse{},
		onNode:       map[string]map[replicaKey]*pb.Replica{},
		tokens:       map[string]*pb.ACLToken{},
		requests:     newRequestTable(),
	}
}

// DefaultRequestWindow is how long, in log time, a request id is remembered
// when no entry has set another window: a day, as docs/audit.md says.
const DefaultRequestWindow = 24 * time.Hour

// RequestWindow is the request-id window in force: a retry within it of an
// id applied before is answered with the first result; after it, the id is
// forgotten and the retry is applied to the state as it is then.
func (f *FSM) RequestWindow() time.Duration {
	if f.window == 0 {
		return DefaultRequestWindow
	}
	return f.window
}

// LogTime is the latest proposed_at of the entries applied (zero before
// any): the time request ids expire by.
func (f *FSM) LogTime() time.Time {
	if f.logTime == 0 {
		return time.Time{}
	}
	return time.Unix(0, f.logTime).UTC()
}

// RequestStats describes the request-id table: ids held (expired ones not
// yet compacted away included) and about how many bytes it takes.
type RequestStats struct {
	Entries int
	Live    int // of Entries, the ids still within the window
	Bytes   int64
}

// RequestStats returns the request table's figures. It reads every entry.
func (f *FSM) RequestStats() RequestStats {
	return RequestStats{Entries: f.requests.Len(), Live: f.requests.live(), Bytes: f.requests.Bytes()}
}

// ExpectEntries tells a fresh state machine that about n entries are coming
// (a replay from index 1), so that the request table's index is sized once
// rather than grown entry by entry. It changes nothing observable, and
// nothing once any request has been applied.
func (f *FSM) ExpectEntries(n int) { f.requests.expect(n) }

// AppliedIndex is the log index of the last applied entry.
func (f *FSM) AppliedIndex() uint64 { return f.applied }

// Hash is the hex head of the hash chain after the last applied entry.
func (f *FSM) Hash() string { return hex.EncodeToString(f.head[:]) }

// Head is Hash's bytes.
func (f *FSM) Head() [32]byte { return f.head }

// ApplyBytes applies one committed log entry holding a marshalled Envelope.
// It never panics: an entry that cannot be decoded, or holds a command this
// version does not know, is rejected with a Result and changes nothing but the
// hash chain, which covers every entry.
func (f *FSM) ApplyBytes(index uint64, data []byte) *pb.Result {
	return f.ApplyEntry(index, DecodeEntry(data))
}

// Entry is a log entry's bytes with the Envelope decoded from them, made by
// DecodeEntry ahead of applying it: decoding is a large part of applying an
// entry, and needs no state, so a replay decodes on one goroutine while it
// applies earlier entries on another. ApplyEntry(i, DecodeEntry(data)) is
// ApplyBytes(i, data) exactly.
//
// An Entry is applied once: the state may keep parts of its Envelope. env
// is the entry's Envelope as decoded, but for an ApplyModel's spec, which is
// normalized in place (model holds it).
type Entry struct {
	data    []byte
	env     *pb.Envelope
	err     error
	request requestKey // env's request id, ready for the request table
	model   *modelPrep // an ApplyModel's checks that need no state
}

// DecodeEntry decodes a log entry's Envelope for ApplyEntry. It reads
// nothing but data, so it may run concurrently with anything.
// A replay decodes with one Decoder for all its entries instead, which is
// cheaper and decodes the same.
func DecodeEntry(data []byte) Entry {
	var d Decoder
	return d.DecodeEntry(data)
}

// Prefetch prepares for applying entries (the next ones, in order): it
// loads the parts of the state their lookups start from, all together, so
// that the loads overlap rather than each stalling its entry's apply in
// turn. The request-id index is large and read at random, one cache miss
// per command otherwise. It changes nothing observable; like ApplyEntry it
// must not run concurrently with anything else on f.
func (f *FSM) Prefetch(entries []Entry) {
	for i := range entries {
		f.requests.touch(&entries[i].request)
	}
}

// ReplayEntry is ApplyEntry for a caller that does not read the result (a
// replay before its first wanted event): it changes the state and hash
// exactly as ApplyEntry does, but the most common results are not
// allocated, one less allocation for most entries.
func (f *FSM) ReplayEntry(index uint64, e Entry) {
	f.discard = true
	defer func() { f.discard = false }()
	f.ApplyEntry(index, e)
}

// ApplyEntry applies one committed log entry decoded by DecodeEntry; see
// ApplyBytes.
func (f *FSM) ApplyEntry(index uint64, e Entry) *pb.Result {
	var res *pb.Result
	if e.err != nil {
		res = reject(pb.Code_CODE_INVALID_ARGUMENT, "cannot decode log entry: %v", e.err)
	} else {
		f.advanceLogTime(e.env)
		res = f.apply(&e, index, false)
	}
	res.Index = index
	f.chain(index, e.data, res)
	return res
}

// advanceLogTime moves the log time to env's proposed_at when that is later,
// takes the request window env sets, and lets the request table forget what
// expired: before the entry's own lookup, so that its id is judged at its
// own log time.
func (f *FSM) advanceLogTime(env *pb.Envelope) {
	if ts := env.GetProposedAt(); ts != nil {
		f.logTime = max(f.logTime, unixNanos(ts.GetSeconds(), ts.GetNanos()))
	}
	if w := env.GetRequestWindow(); w != nil {
		if d := time.Duration(unixNanos(w.GetSeconds(), w.GetNanos())); d > 0 {
			f.window = d
		}
	}
	f.syncRequests()
	f.requests.maybeCompact()
}

// syncRequests gives the request table the log time and window.
func (f *FSM) syncRequests() {
	f.requests.now, f.requests.window = f.logTime, int64(f.RequestWindow())
}

// unixNanos is seconds and nanos as nanoseconds, saturated to int64's range
// (a corrupt or absurd timestamp must not wrap around).
func unixNanos(sec int64, nanos int32) int64 {
	const limit = math.MaxInt64/1_000_000_000 - 1
	switch {
	case sec > limit:
		return math.MaxInt64
	case sec < -limit:
		return math.MinInt64
	}
	return sec*1_000_000_000 + int64(nanos)
}

// Apply applies one envelope as log entry index. It marshals deterministically
// so that Apply and ApplyBytes of the same envelope reach the same hash.
func (f *FSM) Apply(index uint64, env *pb.Envelope) *pb.Result {
	data, err := Marshal(env)
	if err != nil {
		res := reject(pb.Code_CODE_INVALID_ARGUMENT, "cannot encode envelope: %v", err)
		res.Index = index
		return res
	}
	return f.ApplyBytes(index, data)
}

// DryRun reports what applying env now would do, and changes nothing.
func (f *FSM) DryRun(env *pb.Envelope) *pb.Result {
	e := Entry{env: env, request: requestKeyOf(env.GetRequestId())}
	return f.apply(&e, 0, true)
}

// Marshal encodes an envelope deterministically, as it is stored in the log.
func Marshal(env *pb.Envelope) ([]byte, error) {
	return proto.MarshalOptions{Deterministic: true}.Marshal(env)
}

// chain extends the hash chain with one entry: its index, its bytes as stored
// in the log and the result code, so that a changed entry or a different
// decision changes every later head.
func (f *FSM) chain(index uint64, data []byte, res *pb.Result) {
	// sha256(previous head ‖ uvarint(index) ‖ uvarint(code) ‖ data), in one
	// call from a buffer of f's (not zeroed per entry, as a stack array
	// would be) when the entry fits (most do), else streamed.
	if f.chainBuf == nil {
		f.chainBuf = make([]byte, 0, 1024)
	}
	b := append(f.chainBuf[:0], f.head[:]...)
	b = binary.AppendUvarint(b, index)
	b = binary.AppendUvarint(b, uint64(res.GetCode()))
	if len(b)+len(data) <= cap(b) {
		f.head = sha256.Sum256(append(b, data...))
	} else {
		h := sha256.New()
		h.Write(b)
		h.Write(data)
		h.Sum(f.head[:0])
	}
	f.applied = index
}

// apply dispatches one command. With dry set, handlers check everything and
// mutate nothing.
func (f *FSM) apply(e *Entry, index uint64, dry bool) *pb.Result {
	env := e.env
	var request requestProbe
	if e.request.id != "" {
		if request = f.requests.lookup(e.request); request.found {
			res := f.requests.record(request).result()
			res.Duplicate = true
			return res
		}
	}
	var res *pb.Result
	switch c := env.GetCommand().(type) {
	case *pb.Envelope_RegisterNode:
		res = f.registerNode(c.RegisterNode, dry)
	case *pb.Envelope_UpdateInventory:
		res = f.updateInventory(c.UpdateInventory, dry)
	case *pb.Envelope_SetNodeStatus:
		res = f.setNodeStatus(c.SetNodeStatus, dry)
	case *pb.Envelope_DeregisterNode:
		res = f.deregisterNode(c.DeregisterNode, dry)
	case *pb.Envelope_CreateAccelerator:
		res = f.createAccelerator(c.CreateAccelerator, index, dry)
	case *pb.Envelope_DeleteAccelerator:
		res = f.deleteAccelerator(c.DeleteAccelerator, dry)
	case *pb.Envelope_ApplyModel:
		res = f.applyModel(c.ApplyModel, e.model, index, dry)
	case *pb.Envelope_DeleteModel:
		res = f.deleteModel(c.DeleteModel, dry)
	case *pb.Envelope_PlaceReplicas:
		res = f.placeReplicas(c.PlaceReplicas, index, dry)
	case *pb.Envelope_UnplaceReplica:
		res = f.unplaceReplica(c.UnplaceReplica, dry)
	case *pb.Envelope_ReplicaStatus:
		res = f.replicaStatus(c.ReplicaStatus, dry)
	case *pb.Envelope_BootstrapAcl:
		res = f.bootstrapACL(c.BootstrapAcl, index, dry)
	case *pb.Envelope_CreateToken:
		res = f.createToken(c.CreateToken, index, dry)
	case *pb.Envelope_DeleteToken:
		res = f.deleteToken(c.DeleteToken, dry)
	case nil:
		res = reject(pb.Code_CODE_INVALID_ARGUMENT,
			"unknown or missing command: the entry was written by a newer gpuplane or is corrupt")
	default:
		res = reject(pb.Code_CODE_INVALID_ARGUMENT, "unsupported command %T", c)
	}
	res.Index = index
	if !dry && env.GetRequestId() != "" {
		a := remember(res)
		a.at = f.logTime
		f.requests.putAt(request, a)
	}
	return res
}

func accept(outcome pb.Outcome, format string, args ...any) *pb.Result {
	return &pb.Result{Code: pb.Code_CODE_OK, Outcome: outcome, Message: fmt.Sprintf(format, args...)}
}

// accepted is accept with the message the concatenation of parts, for the
// commands a busy log is full of: fmt is a large part of applying them.
// Under ReplayEntry it returns f's spare Result, its message in f's scratch
// buffer: nothing keeps a result or its message (apply and chain copy what
// they need from it) once ApplyEntry returns.
func (f *FSM) accepted(outcome pb.Outcome, parts ...string) *pb.Result {
	if f.discard {
		if f.spare == nil {
			f.spare = &pb.Result{}
		}
		f.spare.Reset()
		f.msgBuf = f.msgBuf[:0]
		for _, p := range parts {
			f.msgBuf = append(f.msgBuf, p...)
		}
		f.spare.Code, f.spare.Outcome, f.spare.Message = pb.Code_CODE_OK, outcome, unsafe.String(unsafe.SliceData(f.msgBuf), len(f.msgBuf))
		return f.spare
	}
	return &pb.Result{Code: pb.Code_CODE_OK, Outcome: outcome, Message: strings.Join(parts, "")}
}

func reject(code pb.Code, format string, args ...any) *pb.Result {
	return &pb.Result{Code: code, Message: fmt.Sprintf(format, args...)}
}

// invalid rejects a command with every violation found.
func invalid(what string, vs []*pb.Violation) *pb.Result {
	return &pb.Result{Code: pb.Code_CODE_INVALID_ARGUMENT, Message: "invalid " + what, Violations: vs}
}
