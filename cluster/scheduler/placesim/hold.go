package placesim

import (
	"fmt"
	"strings"

	"github.com/gpuplane/gpuplane/cluster/scheduler"
)

// holdability answers whether any node of the scenario's cluster, as
// given (empty for openb), could hold a request: a task asking for more
// cards, CPU or memory than any node has, or for GPU types the cluster
// lacks, can never be placed, whatever the policy.
type holdability struct {
	probe *scheduler.State
	memo  map[string]bool
}

func newHoldability(sc *Scenario) *holdability {
	h := &holdability{memo: map[string]bool{}}
	// The scenario passed NewState already in the callers; a failure here
	// leaves probe nil and every request holdable.
	h.probe, _ = scheduler.NewState(sc.Nodes, sc.Accelerators)
	return h
}

// demandKey names what a request asks for, whatever its id.
func demandKey(r scheduler.Request) string {
	return fmt.Sprintf("%s/%d/%d/%d/%d/%s/%v", r.Accelerator, r.Milli, r.Residency, r.CPUMilli, r.MemoryMiB,
		strings.Join(r.Devices, "|"), r.Selector)
}

func (h *holdability) ok(r scheduler.Request) bool {
	if h.probe == nil {
		return true
	}
	k := demandKey(r)
	if v, seen := h.memo[k]; seen {
		return v
	}
	r.Replica = "holdability-probe"
	d := h.probe.Place(r, scheduler.PolicyBestFit)
	if d.Placed() {
		h.probe.Remove(r.Replica)
	}
	h.memo[k] = d.Placed()
	return d.Placed()
}
