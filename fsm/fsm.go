package fsm

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"slices"

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
	// onNode indexes the placed replicas by node (occupy, release): derived,
	// rebuilt on Restore.
	onNode          map[string]map[replicaKey]*pb.Replica
	tokens          map[string]*pb.ACLToken
	aclBootstrapped bool
	// requests maps request ids to the result of their first application,
	// kept compact: a million of them must stay cheap to hold, scan and
	// snapshot.
	requests map[string]appliedRequest
	// cardMiB is the smallest card memory per device over all nodes, for
	// cardMemory; rebuilt by indexCardMemory whenever an inventory changes:
	// derived, never part of the state.
	cardMiB map[string]uint64
}

// appliedRequest is what a request id's first application returned: enough
// to answer a duplicate with the same result. Violations and warnings are
// rare, so they hang off a pointer that is nil in the common case.
type appliedRequest struct {
	index   uint64
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
		requests:     map[string]appliedRequest{},
	}
}

// ExpectEntries tells a fresh state machine that about n entries are coming
// (a replay from index 1), so that the request map is sized once rather than
// grown entry by entry. It changes nothing observable, and nothing once any
// request has been applied.
func (f *FSM) ExpectEntries(n int) {
	if len(f.requests) == 0 && n > 0 {
		f.requests = make(map[string]appliedRequest, min(n, 1<<24))
	}
}

// AppliedIndex is the log index of the last applied entry.
func (f *FSM) AppliedIndex() uint64 { return f.applied }

// Hash is the hex head of the hash chain after the last applied entry.
func (f *FSM) Hash() string { return hex.EncodeToString(f.head[:]) }

// ApplyBytes applies one committed log entry holding a marshalled Envelope.
// It never panics: an entry that cannot be decoded, or holds a command this
// version does not know, is rejected with a Result and changes nothing but the
// hash chain, which covers every entry.
func (f *FSM) ApplyBytes(index uint64, data []byte) *pb.Result {
	env := &pb.Envelope{}
	var res *pb.Result
	if err := proto.Unmarshal(data, env); err != nil {
		res = reject(pb.Code_CODE_INVALID_ARGUMENT, "cannot decode log entry: %v", err)
	} else {
		res = f.apply(env, index, false)
	}
	res.Index = index
	f.chain(index, data, res)
	return res
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
	return f.apply(env, 0, true)
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
	// call from a stack buffer when the entry fits (most do), else streamed.
	var buf [1024]byte
	b := append(buf[:0], f.head[:]...)
	b = binary.AppendUvarint(b, index)
	b = binary.AppendUvarint(b, uint64(res.GetCode()))
	if len(b)+len(data) <= len(buf) {
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
func (f *FSM) apply(env *pb.Envelope, index uint64, dry bool) *pb.Result {
	if id := env.GetRequestId(); id != "" {
		if prev, ok := f.requests[id]; ok {
			res := prev.result()
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
		res = f.applyModel(c.ApplyModel, index, dry)
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
		f.requests[env.GetRequestId()] = remember(res)
	}
	return res
}

func accept(outcome pb.Outcome, format string, args ...any) *pb.Result {
	return &pb.Result{Code: pb.Code_CODE_OK, Outcome: outcome, Message: fmt.Sprintf(format, args...)}
}

func reject(code pb.Code, format string, args ...any) *pb.Result {
	return &pb.Result{Code: code, Message: fmt.Sprintf(format, args...)}
}

// invalid rejects a command with every violation found.
func invalid(what string, vs []*pb.Violation) *pb.Result {
	return &pb.Result{Code: pb.Code_CODE_INVALID_ARGUMENT, Message: "invalid " + what, Violations: vs}
}
