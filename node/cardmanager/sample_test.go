package cardmanager

import (
	"net/http"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuplane/gpuplane/node/residency"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// contextless is NVML as the driver answers it: a process that holds no
// memory on the card (no CUDA context) is not among its compute processes.
type contextless struct{ nvml.Interface }

func (c contextless) DeviceGetHandleByUUID(uuid string) (nvml.Device, nvml.Return) {
	d, ret := c.Interface.DeviceGetHandleByUUID(uuid)
	return contextlessDevice{d}, ret
}

type contextlessDevice struct{ nvml.Device }

func (d contextlessDevice) GetComputeRunningProcesses() ([]nvml.ProcessInfo, nvml.Return) {
	procs, ret := d.Device.GetComputeRunningProcesses()
	var held []nvml.ProcessInfo
	for _, p := range procs {
		if p.UsedGpuMemory > 0 {
			held = append(held, p)
		}
	}
	return held, ret
}

// TestASleepNVMLDoesNotListIsSampledEmpty: the agent counts a sleep whose
// residual it never measured at the engine's whole footprint until the
// card's next memory sample. An engine that keeps nothing on the card
// asleep has no process in NVML's list; the card manager samples it at 0,
// so the ledger frees its memory within a tick instead of counting it in
// full until it wakes.
func TestASleepNVMLDoesNotListIsSampledEmpty(t *testing.T) {
	n := newAdapterNodeWith(t, func(c *residency.Config) {
		c.IdleSleep = 300 * time.Millisecond
		c.SleepUnmeasuredFull = true
	})
	done := make(chan struct{})
	n.mgr.post(func() { n.mgr.opts.NVML = contextless{n.mgr.opts.NVML}; close(done) })
	<-done
	chat := n.deployment(pb.Residency_RESIDENCY_WARM, 0, nil)
	chat.Spec.Engine.Args = append(chat.Spec.Engine.Args, "--sleep-residual-mib", "0")
	n.publish(chat)
	if code, _, msg := ask(t, n.front(), "chat", ""); code != http.StatusOK {
		t.Fatalf("first request: %d %s", code, msg)
	}
	cost := func() (residency.State, int64) {
		out := make(chan residency.LedgerEntry, 1)
		n.mgr.post(func() {
			for _, e := range n.mgr.ctrls[0].ctrl.Ledger().Entries {
				if e.Model == (rkey{"chat", 0}).id() {
					out <- e
					return
				}
			}
			out <- residency.LedgerEntry{}
		})
		e := <-out
		return e.State, e.Cost
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, c := cost()
		if st == residency.Sleeping && c == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("chat is %v and costs %d MiB on the card's ledger; want it asleep at 0 (its engine holds nothing asleep)", st, c>>20)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
