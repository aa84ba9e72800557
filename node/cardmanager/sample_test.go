package cardmanager

import (
	"net/http"
	"testing"

	"github.com/gpuplane/gpuplane/node/executor"
	"github.com/gpuplane/gpuplane/node/residency"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// TestASleepReportsWhatItKept: on a card packed to the last GiB — a pinned
// model on 20 % and a big onDemand one on 74 % fill its usable 95 % — a
// small onDemand model that keeps 300 MiB asleep is on the card when the
// big one is asked for. The small one is put to sleep; when its engine says
// it slept, the card manager reads from NVML what it kept and the sleep
// reports it, so the controller sees the 300 MiB in the same step and
// unloads the sleeper before the big load starts. Counted as holding
// nothing until the next memory sample, the big load started at once and
// the sample then left the card's claims over its usable memory: a ledger
// violation, and the card went pinned-only.
func TestASleepReportsWhatItKept(t *testing.T) {
	n := newAdapterNodeWith(t, nil)
	desired := func(model string, index uint64, percent uint32, res pb.Residency, args ...string) executor.Desired {
		return executor.Desired{
			Replica: &pb.Replica{Model: model, Generation: 1, Node: node, Accelerator: "shared",
				Cards: []uint32{0}, MemoryMib: n.card.GetMemoryMib() * uint64(percent) / 100, PlacedIndex: index, State: pb.ReplicaState_REPLICA_STATE_PLACED},
			Spec: &pb.ModelSpec{Model: "sim://" + model, ServedModelName: model, Replicas: 1, Residency: res,
				Engine: &pb.EngineSpec{Kind: "sim", MemoryPercent: percent,
					Args: append([]string{"--load-seconds", "0.2", "--tokens-per-second", "400"}, args...)}},
		}
	}
	n.publish(desired("pin", 1, 20, pb.Residency_RESIDENCY_PINNED),
		desired("small", 2, 40, pb.Residency_RESIDENCY_ON_DEMAND, "--sleep-residual-mib", "300"),
		desired("big", 3, 74, pb.Residency_RESIDENCY_ON_DEMAND))
	frontOf := func(model string) string { return waitFront(t, n.mgr, model) }
	if code, _, msg := ask(t, frontOf("small"), "small", ""); code != http.StatusOK {
		t.Fatalf("small: %d %s", code, msg)
	}
	if code, _, msg := ask(t, frontOf("big"), "big", ""); code != http.StatusOK {
		t.Errorf("big: %d %s, want it answered", code, msg)
	}
	done := make(chan [2]int, 1)
	n.mgr.post(func() {
		c := n.mgr.ctrls[0].ctrl
		po := 0
		if c.PinnedOnly() {
			po = 1
		}
		done <- [2]int{c.ViolationCount(), po}
	})
	if got := <-done; got[0] != 0 || got[1] != 0 {
		t.Errorf("%d ledger violations, pinned-only %v; want none (the sleep's 300 MiB counted before the big load)", got[0], got[1] == 1)
	}
	st, _ := residencyState(n, "small")
	if st == residency.Resident {
		t.Errorf("small is %v, want it off the card for the big one", st)
	}
}

// residencyState is the controller's state of model's replica 0.
func residencyState(n *adapterNode, model string) (residency.State, bool) {
	type res struct {
		st residency.State
		ok bool
	}
	done := make(chan res, 1)
	n.mgr.post(func() {
		st, ok := n.mgr.ctrls[0].ctrl.Replica(rkey{model, 0}.id())
		done <- res{st.State, ok}
	})
	r := <-done
	return r.st, r.ok
}
