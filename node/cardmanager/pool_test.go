package cardmanager

import (
	"net/http"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/node/watchdog"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// vLLM allocates its adapters' memory once, at start (max_loras ×
// max_lora_rank slots inside its budget); a load fills a slot and changes
// nothing on the card. The ledger's cost of a vLLM deployment with four
// rank-256 adapters loaded equals what its engine, the strict vllm dialect,
// holds on the card: its share, not its share plus 512 MiB per adapter.
func TestVLLMAdapterPoolInLedgerEqualsCard(t *testing.T) {
	n := newAdapterNode(t)
	d := n.deployment(pb.Residency_RESIDENCY_PINNED, 4, adapterList(4, 256))
	d.Spec.Engine.Args = append(d.Spec.Engine.Args, "--dialect", "vllm")
	n.publish(d)
	url := n.front()
	for _, a := range []string{"a000", "a001", "a002", "a003"} {
		if code, model, msg := ask(t, url, a, ""); code != http.StatusOK || model != a {
			t.Fatalf("request for %s: %d %q %s", a, code, model, msg)
		}
	}
	pid := engineFor(t, n)
	ledger := func() int64 {
		done := make(chan int64, 1)
		n.mgr.post(func() {
			var cost int64
			for _, e := range n.mgr.ctrls[0].ctrl.Ledger().Entries {
				if e.Model == (rkey{"chat", 0}).id() {
					cost = e.Cost
				}
			}
			done <- cost
		})
		return <-done
	}
	var onCard, counted int64
	deadline := time.Now().Add(15 * time.Second)
	for {
		used, err := watchdog.ProcessMemory(n.lib, n.card.GetUuid())
		if err != nil {
			t.Fatal(err)
		}
		onCard, counted = int64(used[pid])<<20, ledger()
		if onCard > 0 && onCard == counted {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("with 4 adapters loaded the ledger counts chat at %d MiB, its engine holds %d MiB on the card", counted>>20, onCard>>20)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if share := int64(d.Replica.GetMemoryMib()) << 20; onCard != share {
		t.Errorf("chat's engine holds %d MiB with its adapters, want its share, %d MiB", onCard>>20, share>>20)
	}
}
