package cardmanager

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/internal/testutil"
	"github.com/gpuplane/gpuplane/node/executor"
	"github.com/gpuplane/gpuplane/node/inventory"
	"github.com/gpuplane/gpuplane/node/residency"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// TestMovedReplicaLeavesItsCardsLedger: chat (onDemand, 60%) is loaded on
// card 0, then its spec changes (new engine args) and it is placed on card
// 1. Card 0's ledger must let go of it at once (no ghost left Draining
// that counts its share for ever), so coder (onDemand, 60%: it does not
// fit beside chat) loads on card 0 and answers, and chat answers on card 1.
func TestMovedReplicaLeavesItsCardsLedger(t *testing.T) {
	dataDir := t.TempDir()
	cards, err := inventory.Simulated(node, "l4=2")
	if err != nil {
		t.Fatal(err)
	}
	usageDir := dataDir + "/sim-nvml"
	lib := inventory.NewSimNVML(cards, inventory.NewSimUsage(usageDir))
	logger := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo}))
	src := &source{ch: make(chan executor.Snapshot, 4)}
	rep := &reporter{transitions: map[string][]string{}}
	ag := &agent{journal: residency.NewJournal(node, 0)}
	ag.mgr = New(Options{Node: node, Cards: cards, NVML: lib, Journal: ag.journal, BindHost: "127.0.0.1",
		DataDir: dataDir, Wait: 30 * time.Second, Tick: 200 * time.Millisecond, Logger: logger,
		Config: residency.Config{MinResidency: time.Second, IdleSleep: time.Hour, IdleUnload: time.Hour,
			DrainDeadline: drainDeadline, RetryBackoff: 200 * time.Millisecond, MaxBackoff: 2 * time.Second}})
	ag.ex, err = executor.New(src, rep, executor.Options{Node: node, DataDir: dataDir, Cards: cards, Self: bin,
		SimUsageDir: usageDir, BindHost: "127.0.0.1", AdvertiseHost: "127.0.0.1", GracePeriod: 2 * time.Second,
		HealthInterval: 200 * time.Millisecond, Gate: ag.mgr, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ag.loops.Go(func() { _ = ag.ex.Run(ctx) })
	ag.loops.Go(func() { ag.mgr.Run(ctx, ag.ex) })
	t.Cleanup(func() {
		src.ch <- executor.Snapshot{Index: 100}
		for end := time.Now().Add(30 * time.Second); len(ag.ex.Engines()) > 0 && time.Now().Before(end); {
			time.Sleep(50 * time.Millisecond)
		}
		cancel()
		ag.loops.Wait()
	})

	chat, coder := model{"chat", pb.Residency_RESIDENCY_ON_DEMAND, 60}, model{"coder", pb.Residency_RESIDENCY_ON_DEMAND, 60}
	on := func(m model, card uint32, generation uint64, extra ...string) executor.Desired {
		d := desired(m, cards[card], generation)
		d.Replica.Cards = []uint32{card}
		d.Spec.Engine.Args = append(d.Spec.Engine.Args, extra...)
		return d
	}
	frontOf := func(name string) string {
		var url string
		testutil.Until(t, 30*time.Second, "a front for "+name, func() bool {
			ag.mgr.mu.Lock()
			defer ag.mgr.mu.Unlock()
			if f := ag.mgr.fronts[rkey{name, 0}]; f != nil {
				url = f.url
			}
			return url != ""
		})
		return url
	}
	client := &http.Client{Timeout: 2 * time.Minute}
	ask := func(name string) {
		t.Helper()
		body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hi"}],"max_tokens":4}`, name)
		resp, err := client.Post(frontOf(name)+"/v1/chat/completions", "application/json", bytes.NewBufferString(body))
		if err != nil {
			t.Fatalf("request for %s: %v", name, err)
		}
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request for %s: %s %s", name, resp.Status, data)
		}
	}
	ledgerOf := func(card uint32) (l residency.Ledger, ok bool) {
		done := make(chan struct{})
		ag.mgr.post(func() {
			if c := ag.mgr.ctrls[card]; c != nil {
				l, ok = c.ctrl.Ledger(), true
			}
			close(done)
		})
		<-done
		return l, ok
	}
	models := func(l residency.Ledger) []string {
		var out []string
		for _, e := range l.Entries {
			out = append(out, string(e.Model)+" "+e.State.String())
		}
		return out
	}

	src.ch <- executor.Snapshot{Index: 1, Replicas: []executor.Desired{on(chat, 0, 1), on(coder, 0, 1)}}
	ask("chat")
	// chat's spec changes and it moves to card 1.
	src.ch <- executor.Snapshot{Index: 2, Replicas: []executor.Desired{on(chat, 1, 2, "--prefill-tokens-per-second", "100000"), on(coder, 0, 1)}}
	testutil.Until(t, 30*time.Second, "chat off card 0's ledger", func() bool {
		l, ok := ledgerOf(0)
		return ok && !slices.ContainsFunc(l.Entries, func(e residency.LedgerEntry) bool { return e.Model == "chat/0" })
	})
	if l, _ := ledgerOf(0); l.Resident != 0 {
		t.Errorf("card 0's ledger counts %d bytes resident with chat gone and coder cold: %v", l.Resident, models(l))
	}
	ask("coder")
	ask("chat")
	if l, _ := ledgerOf(1); !slices.Contains(models(l), "chat/0 Resident") {
		t.Errorf("card 1's ledger after chat answered there: %v; want chat/0 Resident", models(l))
	}
}
