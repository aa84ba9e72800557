package cardmanager

import (
	"github.com/gpuplane/gpuplane/node/residency"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// In advise mode every engine runs as if pinned, but the controllers are
// to show what auto would have done from the same placement: auto loads a
// warm or onDemand model only when its controller decides to (a request, a
// reserved share, a forecast). So an advising controller is told a warm or
// onDemand engine is loaded (LoadDone, memory samples) only once it has
// advised loading it; until then it holds the model Cold, and the first
// request for it shows the load — and the sleeps or evictions that make
// room — that auto would have done. From then on it follows the engine.

// follows reports whether r's controller is told r's engine's state.
func (m *Manager) follows(r *rep) bool {
	return r != nil && (!m.opts.Advise || r.dep.Residency == residency.Pinned || r.advisedLoad)
}

// advised takes note of an advised decision: a load makes the controller
// follow the (already running) engine from now on.
func (m *Manager) advised(c *cardCtrl, d residency.Decision) {
	if d.Action != residency.ActLoad && d.Action != residency.ActPrewarm {
		return
	}
	for k, r := range m.reps {
		if k.id() != d.Model || r.advisedLoad {
			continue
		}
		r.advisedLoad = true
		if m.engines[k].state == pb.ReplicaState_REPLICA_STATE_RUNNING {
			m.post(func() { m.handle(m.ctrls[c.index], residency.LoadDone{Model: d.Model}, whyRunning) })
		}
	}
}
