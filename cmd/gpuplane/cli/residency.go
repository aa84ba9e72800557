package cli

import (
	"fmt"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// `gpuplane residency`: what each node's residency controllers decided,
// plan and learned (docs/residency.md). Every node answers for the whole cluster;
// --node narrows to one node.

func newResidencyCommand(g *globals) *cobra.Command {
	return newGroupCommand("residency", "Show the residency controllers' decisions, plans and learned profiles", nil,
		newResidencyDecisionsCommand(g),
		newResidencyPlanCommand(g),
		newResidencyProfilesCommand(g),
	)
}

func newResidencyDecisionsCommand(g *globals) *cobra.Command {
	var (
		node, model string
		follow      bool
	)
	c := &cobra.Command{
		Use:   "decisions [--node N] [--model M] [--follow]",
		Short: "List residency decisions (load, prewarm, sleep, wake, evict, serialize, protect, reject) and the numbers behind each",
		Long: `List the decisions of every node's residency controllers, oldest first: each
load, prewarm, sleep, wake, evict, unload, drain, serialize, protect and reject, with
what triggered it (request, forecast, pressure, idle, operator) and the
numbers that decided it. A decision taken in advise mode was recorded but not
executed; its ACTION reads e.g. "load (advised)". Each node keeps its last
4096 decisions in memory.

--model keeps the decisions about a model or made to make room for it;
--follow keeps printing decisions as they are taken (one per line; with
-o json one JSON object per line) by the nodes alive when it started.`,
		Args: argsNamed(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			api, err := g.api(cmd)
			if err != nil {
				return err
			}
			stream, err := api.Residency.ListDecisions(ctx(cmd), connect.NewRequest(&pb.ListDecisionsRequest{
				Node: node, Model: model, Follow: follow,
			}))
			if err != nil {
				return err
			}
			defer stream.Close()
			var all []*pb.ResidencyDecision
			var write func(*pb.ResidencyDecision) error
			if follow {
				// The header at once: a quiet card may take minutes to
				// decide anything.
				write = g.decisionWriter()
			}
			for stream.Receive() {
				ds := stream.Msg().GetDecisions()
				if !follow {
					all = append(all, ds...)
					continue
				}
				for _, d := range ds {
					if err := write(d); err != nil {
						return err
					}
				}
			}
			if err := stream.Err(); err != nil {
				if follow && ctx(cmd).Err() != nil {
					return nil // interrupted: the stream was what the user asked for
				}
				return err
			}
			if follow {
				return nil
			}
			return g.printList(messages(all), tableOf(decisionHeader, all, decisionRow))
		},
	}
	c.Flags().StringVar(&node, "node", "", "only this node's decisions")
	c.Flags().StringVar(&model, "model", "", "only decisions about this model or made for it")
	c.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing decisions as they are taken")
	_ = c.RegisterFlagCompletionFunc("model", g.completeFrom(modelNames))
	_ = c.RegisterFlagCompletionFunc("node", g.completeFrom(nodeNames))
	return c
}

var decisionHeader = []string{"TIME", "NODE", "CARD", "ACTION", "MODEL", "TRIGGER", "REASON"}

func decisionRow(d *pb.ResidencyDecision) []string {
	action := d.GetAction()
	if d.GetAdvised() {
		action += " (advised)"
	}
	at := ""
	if d.GetTime() != nil {
		at = d.GetTime().AsTime().UTC().Format(time.RFC3339)
	}
	trigger := d.GetTrigger()
	if d.GetBy() != "" {
		trigger += " (" + d.GetBy() + ")"
	}
	return []string{at, d.GetNode(), d.GetCard(), action, d.GetModel(), trigger, d.GetReason()}
}

// decisionWriter prints decisions one at a time as they arrive (--follow):
// a table line (not aligned across lines, which a stream cannot have) under
// the header it prints now, one JSON object per line for -o json, a YAML
// document for -o yaml.
func (g *globals) decisionWriter() func(*pb.ResidencyDecision) error {
	if g.output == outputTable {
		fmt.Fprintln(g.stdout, strings.Join(decisionHeader, "  "))
	}
	return func(d *pb.ResidencyDecision) error {
		switch g.output {
		case outputTable:
			cells := decisionRow(d)
			for i, c := range cells {
				cells[i] = orDash(c)
			}
			_, err := fmt.Fprintln(g.stdout, strings.Join(cells, "  "))
			return err
		case outputJSON:
			return writeJSONLine(g.stdout, d)
		default:
			fmt.Fprintln(g.stdout, "---")
			return g.printObject(d, table{})
		}
	}
}

func newResidencyPlanCommand(g *globals) *cobra.Command {
	var node string
	c := &cobra.Command{
		Use:   "plan [--node N]",
		Short: "Show each card's residency plan: per model its rate, predicted next request, value, tier and the action the controller would take now",
		Long: `Show, per model on each card a residency controller manages, its state and
tier (gpu, host when asleep, disk when cold), its arrival rate in requests per
minute, when its next request is predicted (NEXT, relative to when the node
answered; "-" until two gaps between requests were seen), its value per GiB,
and the action the controller would take now with the reason. It changes
nothing and works in advise mode too. -o json/yaml also gives each card's
mode, pinned-only fallback, violation count and memory account.`,
		Args: argsNamed(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			api, err := g.api(cmd)
			if err != nil {
				return err
			}
			resp, err := api.Residency.GetPlan(ctx(cmd), connect.NewRequest(&pb.GetPlanRequest{Node: node}))
			if err != nil {
				return err
			}
			cards := resp.Msg.GetCards()
			t := table{header: []string{"NODE", "CARD", "MODEL", "RESIDENCY", "STATE", "TIER", "RATE", "NEXT", "VALUE", "ACTION", "REASON"}}
			for _, c := range cards {
				for _, e := range c.GetEntries() {
					t.rows = append(t.rows, []string{
						c.GetNode(), cardLabel(c), e.GetModel(), e.GetResidency(), e.GetState(), e.GetTier(),
						fmt.Sprintf("%.2f/min", e.GetRatePerMinute()), nextIn(c, e), fmt.Sprintf("%.2f", e.GetValue()),
						planAction(c, e), e.GetReason(),
					})
				}
			}
			return g.printList(messages(cards), t)
		},
	}
	c.Flags().StringVar(&node, "node", "", "only this node's cards")
	_ = c.RegisterFlagCompletionFunc("node", g.completeFrom(nodeNames))
	return c
}

// cardLabel is the card, marked when it fell back to pinned-only behaviour
// after a ledger violation (the operator must look).
func cardLabel(c *pb.ResidencyCardPlan) string {
	if c.GetPinnedOnly() {
		return c.GetCard() + " (pinned-only)"
	}
	return c.GetCard()
}

// planAction is what the controller would do now; on a card in advise mode
// it would only be recorded.
func planAction(c *pb.ResidencyCardPlan, e *pb.ResidencyPlanEntry) string {
	a := e.GetAction()
	if a != "" && c.GetMode() == "advise" {
		a += " (advised)"
	}
	return a
}

// nextIn is the predicted next request relative to when the node answered:
// "in 42s", "overdue" (predicted, and none came yet), "-" (unknown).
func nextIn(c *pb.ResidencyCardPlan, e *pb.ResidencyPlanEntry) string {
	if e.GetNextRequest() == nil {
		return ""
	}
	now := time.Now()
	if c.GetObservedAt() != nil {
		now = c.GetObservedAt().AsTime()
	}
	d := e.GetNextRequest().AsTime().Sub(now).Round(time.Second)
	if d < 0 {
		return "overdue"
	}
	return "in " + d.String()
}

func newResidencyProfilesCommand(g *globals) *cobra.Command {
	var node string
	c := &cobra.Command{
		Use:   "profiles [--node N]",
		Short: "Show learned load time, wake time, footprint and tokens/s per (model, quantization, engine, device)",
		Long: `Show what each node's residency controllers learned per variant (model,
quantization, engine, device), one row each: MODEL is the deployments'
spec.model, so two quantizations of one model are two rows, and replicas
of one variant (of one deployment or several) share a row. The load and
wake times (moving averages of
those observed), the most memory seen while resident (FOOTPRINT), tokens per
second over finished requests, and how many loads and wakes were measured.
-o json/yaml also gives the peak while loading, the residual while asleep and
the failures.`,
		Args: argsNamed(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			api, err := g.api(cmd)
			if err != nil {
				return err
			}
			resp, err := api.Residency.ListProfiles(ctx(cmd), connect.NewRequest(&pb.ListProfilesRequest{Node: node}))
			if err != nil {
				return err
			}
			ps := resp.Msg.GetProfiles()
			return g.printList(messages(ps), tableOf(
				[]string{"NODE", "MODEL", "QUANTIZATION", "ENGINE", "DEVICE", "LOAD", "WAKE", "FOOTPRINT", "TOKENS/S", "LOADS", "WAKES"}, ps,
				func(p *pb.ResidencyProfile) []string {
					return []string{p.GetNode(), p.GetModel(), p.GetQuantization(), p.GetEngine(), p.GetDevice(),
						measured(p.GetLoads(), p.GetLoadMs()), measured(p.GetWakes(), p.GetWakeMs()),
						bytesLabel(p.GetFootprintBytes()), fmt.Sprintf("%.1f", p.GetTokensPerSecond()),
						itoa(p.GetLoads()), itoa(p.GetWakes())}
				}))
		},
	}
	c.Flags().StringVar(&node, "node", "", "only this node's profiles")
	_ = c.RegisterFlagCompletionFunc("node", g.completeFrom(nodeNames))
	return c
}

// measured is a learned duration, or "-" before the first observation.
func measured(n, ms int64) string {
	if n == 0 {
		return ""
	}
	return (time.Duration(ms) * time.Millisecond).String()
}

// bytesLabel formats a byte count the way residency reasons do: "9.8Gi",
// "512Mi".
func bytesLabel(b int64) string {
	switch {
	case b == 0:
		return ""
	case b >= 1<<30:
		return fmt.Sprintf("%.1fGi", float64(b)/(1<<30))
	}
	return fmt.Sprintf("%dMi", b>>20)
}
