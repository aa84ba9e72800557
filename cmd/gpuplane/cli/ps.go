package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	"github.com/gpuplane/gpuplane/fsm"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// `gpuplane ps`: what runs where, one row per replica, as `ollama ps` and
// `kubectl get pods` show it.

// psRow is one replica in `gpuplane ps`, also its -o json form.
type psRow struct {
	Model   string `json:"model"`
	Replica uint32 `json:"replica"`
	Node    string `json:"node"`
	Cards   string `json:"cards"`
	// State is the residency state where a controller manages the card
	// (Cold, Loading, Resident, Sleeping, ...), else the replica's.
	State     string `json:"state"`
	GPUBytes  int64  `json:"gpuBytes"`
	HostBytes int64  `json:"hostBytes"`
	// Queue is the requests queued or running for it; OldestWait how long
	// the oldest of those waiting for the card has waited (seconds).
	Queue      int64   `json:"queue"`
	OldestWait float64 `json:"oldestWaitSeconds,omitempty"`
	// Wait is why they wait, with the bound (the plan's text).
	Wait string `json:"wait,omitempty"`
	// Next is what happens to it next and NextAt when: the card by a
	// bound for a wait, an idle sleep or unload, a keep_alive expiry, a
	// turn's end.
	Next   string     `json:"next,omitempty"`
	NextAt *time.Time `json:"nextAt,omitempty"`
	// BestEffort says why its card serves it best-effort, in numbers
	// (the plan's text); the table marks its state "(best-effort)".
	BestEffort string `json:"bestEffort,omitempty"`
}

func newPsCommand(g *globals) *cobra.Command {
	var (
		model, node string
		watch       bool
		interval    time.Duration
	)
	c := &cobra.Command{
		Use:   "ps [--model M] [--node N] [-w]",
		Short: "Show what runs where: one row per replica with its state, memory, queue and what it does next",
		Long: `Show one row per replica, as 'ollama ps' and 'kubectl get pods' do: the
model and replica, its node and cards, its state (the residency state where a
controller manages the card: Resident, Sleeping, Cold, Loading, ..., marked
"(best-effort)" where its card cannot hold every model with demand and
serves it outside the protected set: 'residency plan' says why), the GPU
memory it holds and what it keeps in host RAM while asleep, its requests
queued or running and how long the oldest waiting for the card has waited,
and what happens next and when (the card by its bound for a waiting model,
an idle sleep or unload, a keep_alive expiry, the end of a turn). The wait's
cause is the one 'residency plan' and 'models get' give. -o json gives the
same rows as objects; -w keeps printing rows as they change.`,
		Example: `  gpuplane ps
  gpuplane ps --node gpu-1 -w
  gpuplane ps -o json`,
		Args: argsNamed(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if interval <= 0 {
				return usageErrorf(cmd, "--interval must be positive, got %s", interval)
			}
			api, err := g.api(cmd)
			if err != nil {
				return err
			}
			rows, err := psRows(ctx(cmd), api, model, node)
			if err != nil {
				return err
			}
			if !watch {
				if g.output == outputTable {
					return psTable(rows, time.Now()).write(g.stdout)
				}
				b, err := json.Marshal(rows)
				if err != nil {
					return err
				}
				return g.writeJSON(b)
			}
			return g.watchPs(ctx(cmd), api, model, node, rows, interval)
		},
	}
	c.Flags().StringVar(&model, "model", "", "only this deployment's replicas")
	c.Flags().StringVar(&node, "node", "", "only replicas on this node")
	c.Flags().BoolVarP(&watch, "watch", "w", false, "keep printing rows as they change")
	c.Flags().DurationVar(&interval, "interval", 2*time.Second, "with -w: how often to look")
	_ = c.RegisterFlagCompletionFunc("model", g.completeFrom(modelNames))
	_ = c.RegisterFlagCompletionFunc("node", g.completeFrom(nodeNames))
	return c
}

// psRows joins the replicas with their cards' residency plans. A plan
// that cannot be had (a node unreachable) leaves the replicas' own state.
func psRows(c context.Context, api *apiClients, model, node string) ([]psRow, error) {
	resp, err := api.Models.ListReplicas(c, connect.NewRequest(&pb.ListReplicasRequest{Model: model, Node: node}))
	if err != nil {
		return nil, err
	}
	type planned struct {
		card *pb.ResidencyCardPlan
		e    *pb.ResidencyPlanEntry
	}
	plans := map[string]planned{}
	if p, err := api.Residency.GetPlan(c, connect.NewRequest(&pb.GetPlanRequest{Node: node})); err == nil {
		for _, card := range p.Msg.GetCards() {
			for _, e := range card.GetEntries() {
				plans[card.GetNode()+"\x00"+e.GetModel()] = planned{card, e}
			}
		}
	}
	var rows []psRow
	for _, r := range resp.Msg.GetReplicas() {
		cards := make([]string, len(r.GetCards()))
		for i, x := range r.GetCards() {
			cards[i] = itoa(x)
		}
		row := psRow{Model: r.GetModel(), Replica: r.GetIndex(), Node: r.GetNode(), Cards: strings.Join(cards, ","),
			State: fsm.ReplicaStateName(r.GetState())}
		if r.GetState() == pb.ReplicaState_REPLICA_STATE_RUNNING {
			row.GPUBytes = int64(r.GetMemoryMib()) << 20
		}
		p, ok := plans[r.GetNode()+"\x00"+fmt.Sprintf("%s/%d", r.GetModel(), r.GetIndex())]
		if !ok {
			rows = append(rows, row)
			continue
		}
		e := p.e
		now := time.Now()
		if p.card.GetObservedAt() != nil {
			now = p.card.GetObservedAt().AsTime()
		}
		row.State, row.GPUBytes, row.HostBytes, row.Queue = e.GetState(), e.GetCostBytes(), e.GetHostBytes(), e.GetActive()
		row.BestEffort = e.GetBestEffort()
		switch {
		case e.GetWaiting() > 0:
			row.Wait = e.GetWait()
			row.OldestWait = math.Round(e.GetWaitedSeconds())
			if e.GetWaitBy() != nil {
				at := e.GetWaitBy().AsTime()
				row.Next, row.NextAt = "gets the card", &at
			}
		case e.GetAction() != "" && e.GetAction() != "reject":
			at := now
			row.Next, row.NextAt = e.GetAction()+" now", &at
		case e.GetNextAt() != nil:
			at := e.GetNextAt().AsTime()
			row.Next, row.NextAt = e.GetNextAction(), &at
		case e.GetResidency() == "pinned":
			row.Next = "stays (pinned)"
		}
		rows = append(rows, row)
	}
	slices.SortFunc(rows, func(a, b psRow) int {
		if c := strings.Compare(a.Model, b.Model); c != 0 {
			return c
		}
		return int(a.Replica) - int(b.Replica)
	})
	return rows, nil
}

var psHeader = []string{"MODEL", "NODE", "CARD", "STATE", "GPU", "HOST", "QUEUE", "OLDEST WAIT", "NEXT"}

// psCells is a row's cells; when is relative to now.
func psCells(r psRow, now time.Time) []string {
	wait := ""
	if r.OldestWait > 0 {
		wait = (time.Duration(r.OldestWait) * time.Second).String()
	}
	next := r.Next
	if r.NextAt != nil {
		in := r.NextAt.Sub(now).Round(time.Second)
		switch {
		case strings.HasSuffix(next, " now"):
		case r.Wait != "":
			next = fmt.Sprintf("%s by %s (in %s)", next, r.NextAt.Local().Format(time.TimeOnly), max(in, 0))
		case in <= 0:
			next += " due"
		default:
			next = fmt.Sprintf("%s in %s", next, in)
		}
	}
	queue := ""
	if r.Queue > 0 {
		queue = fmt.Sprint(r.Queue)
	}
	state := r.State
	if r.BestEffort != "" {
		state += " (best-effort)"
	}
	return []string{fmt.Sprintf("%s/%d", r.Model, r.Replica), r.Node, r.Cards, state,
		bytesLabel(r.GPUBytes), bytesLabel(r.HostBytes), queue, wait, next}
}

func psTable(rows []psRow, now time.Time) table {
	t := table{header: psHeader}
	for _, r := range rows {
		t.rows = append(t.rows, psCells(r, now))
	}
	return t
}

// watchPs prints the rows, then every interval the rows that changed (a
// replica gone is printed with state Deleted), as `kubectl get -w` does;
// -o json prints one object per line. It ends with ctx.
func (g *globals) watchPs(c context.Context, api *apiClients, model, node string, rows []psRow, interval time.Duration) error {
	key := func(r psRow) string { return fmt.Sprintf("%s/%d", r.Model, r.Replica) }
	// What a row shows, less the figures that move every second.
	same := func(a, b psRow) bool {
		a.OldestWait, b.OldestWait, a.NextAt, b.NextAt, a.Wait, b.Wait = 0, 0, nil, nil, "", ""
		return a == b
	}
	print := func(rs []psRow, header bool) error {
		if g.output != outputTable {
			for _, r := range rs {
				b, err := json.Marshal(r)
				if err != nil {
					return err
				}
				if err := writeLine(g.stdout, b); err != nil {
					return err
				}
			}
			return nil
		}
		t := psTable(rs, time.Now())
		if !header {
			t.header = nil
		}
		return t.write(g.stdout)
	}
	if err := print(rows, true); err != nil {
		return err
	}
	last := map[string]psRow{}
	for _, r := range rows {
		last[key(r)] = r
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-c.Done():
			return nil
		case <-tick.C:
		}
		now, err := psRows(c, api, model, node)
		if err != nil {
			if c.Err() != nil {
				return nil
			}
			return err
		}
		var changed []psRow
		seen := map[string]bool{}
		for _, r := range now {
			seen[key(r)] = true
			if old, ok := last[key(r)]; !ok || !same(old, r) {
				changed = append(changed, r)
			}
			last[key(r)] = r
		}
		for k, r := range last {
			if !seen[k] {
				r.State, r.Next, r.NextAt, r.Queue, r.Wait, r.OldestWait = "Deleted", "", nil, 0, "", 0
				changed = append(changed, r)
				delete(last, k)
			}
		}
		if len(changed) > 0 {
			if err := print(changed, false); err != nil {
				return err
			}
		}
	}
}
