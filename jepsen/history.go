//go:build linux

package jepsen

import (
	"encoding/json"
	"math"
	"os"
	"sort"
	"sync"
	"time"
)

// Kinds of operation. Accelerators are a create/delete/read register per
// name; deployments a put/delete/read register whose value is the replica
// count.
const (
	OpCreate      = "create"       // CreateAccelerator
	OpDelete      = "delete"       // DeleteAccelerator
	OpRead        = "read"         // GetAccelerator
	OpPut         = "put"          // ApplyModel
	OpModelDelete = "model-delete" // DeleteModel
	OpModelRead   = "model-read"   // GetModel
)

// Outcomes of an operation as the client saw it.
const (
	Ok      = "ok"      // acknowledged
	Fail    = "fail"    // definitely not applied (a state-machine rejection)
	Unknown = "unknown" // timeout or transport error: may or may not have applied
)

// Op is one operation of the history.
type Op struct {
	ID     int `json:"id"`
	Worker int `json:"worker"`
	// Process is the porcupine client id: a worker whose operation ended
	// unknown continues as a new process, as in Jepsen.
	Process int    `json:"process"`
	Node    string `json:"node"`
	Kind    string `json:"kind"`
	Key     string `json:"key"`
	// Value is the replica count written by a put or read by a model-read.
	Value     uint32 `json:"value,omitempty"`
	Found     bool   `json:"found,omitempty"`
	RequestID string `json:"request_id,omitempty"`
	// Call and Return are nanoseconds since the start of the run; Return is
	// math.MaxInt64 for an operation whose effect time is unknown.
	Call    int64  `json:"call"`
	Return  int64  `json:"return"`
	Outcome string `json:"outcome"`
	Code    string `json:"code,omitempty"`
	Err     string `json:"err,omitempty"`
	// Index is the log index the server reported (0 when none).
	Index uint64 `json:"index,omitempty"`
	// Resolved says how an unknown outcome was settled from the log.
	Resolved string `json:"resolved,omitempty"`
}

// IsWrite reports whether the operation changes state.
func (o *Op) IsWrite() bool {
	return o.Kind == OpCreate || o.Kind == OpDelete || o.Kind == OpPut || o.Kind == OpModelDelete
}

// History collects operations from concurrent workers.
type History struct {
	start time.Time
	mu    sync.Mutex
	ops   []*Op
}

// NewHistory starts the clock of a history.
func NewHistory() *History { return &History{start: time.Now()} }

// Now is the history's clock.
func (h *History) Now() int64 { return int64(time.Since(h.start)) }

// Add records a completed operation.
func (h *History) Add(o *Op) {
	h.mu.Lock()
	defer h.mu.Unlock()
	o.ID = len(h.ops)
	h.ops = append(h.ops, o)
}

// Ops returns the operations by call time.
func (h *History) Ops() []*Op {
	h.mu.Lock()
	defer h.mu.Unlock()
	ops := append([]*Op(nil), h.ops...)
	sort.SliceStable(ops, func(i, j int) bool { return ops[i].Call < ops[j].Call })
	return ops
}

// Counts returns how many operations were attempted, acknowledged, failed
// and left indeterminate (before resolution from the log).
type Counts struct {
	Attempted     int `json:"attempted"`
	Acknowledged  int `json:"acknowledged"`
	Failed        int `json:"failed"`
	Indeterminate int `json:"indeterminate"`
	// Of the indeterminate ones: settled from the log as applied, as
	// rejected, or not in the log (never applied).
	ResolvedApplied  int `json:"resolved_applied"`
	ResolvedRejected int `json:"resolved_rejected"`
	ResolvedAbsent   int `json:"resolved_absent"`
}

// WriteJSON writes the history as JSON lines.
func (h *History) WriteJSON(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(f)
	for _, o := range h.Ops() {
		if err := enc.Encode(o); err != nil {
			f.Close()
			return err
		}
	}
	return f.Close()
}

const never = math.MaxInt64
