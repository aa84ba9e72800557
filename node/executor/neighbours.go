package executor

import pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"

// neighbourMiB is the memory the other replicas of this node reserve on
// r's cards, the most on any one of them: an engine that sizes itself by
// the free memory it sees (Ollama) finds theirs gone (engine.Params).
func (e *Executor) neighbourMiB(k key, r *pb.Replica) uint64 {
	e.mu.Lock()
	sups := make([]*supervisor, 0, len(e.sups))
	for other, s := range e.sups {
		if other != k {
			sups = append(sups, s)
		}
	}
	e.mu.Unlock()
	perCard := map[uint32]uint64{}
	for _, s := range sups {
		o := s.current().Replica
		for _, c := range o.GetCards() {
			perCard[c] += o.GetMemoryMib()
		}
	}
	var most uint64
	for _, c := range r.GetCards() {
		most = max(most, perCard[c])
	}
	return most
}
