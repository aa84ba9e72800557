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
		newResidencyProtectCommand(g),
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
and the action the controller would take now with the reason. On a card
that cannot hold every model with demand at once, SET says which models
the controller protects and which are best-effort, and a line per
best-effort model below the table says why, in numbers (what it needs,
what the protected set leaves the card to lend). It changes nothing and
works in advise mode too. -o json/yaml also gives each card's mode,
pinned-only fallback, violation count and memory account, and each
model's bestEffort reason.`,
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
			t := table{header: []string{"NODE", "CARD", "MODEL", "RESIDENCY", "STATE", "TIER", "RATE", "NEXT", "VALUE", "SET", "ACTION", "REASON"}}
			var whys []string
			for _, c := range cards {
				for _, e := range c.GetEntries() {
					t.rows = append(t.rows, []string{
						c.GetNode(), cardLabel(c), e.GetModel(), e.GetResidency(), e.GetState(), e.GetTier(),
						fmt.Sprintf("%.2f/min", e.GetRatePerMinute()), nextIn(c, e), fmt.Sprintf("%.2f", e.GetValue()),
						planSet(c, e), planAction(c, e), e.GetReason(),
					})
					if why := e.GetBestEffort(); why != "" {
						whys = append(whys, fmt.Sprintf("best-effort on %s card %s: %s", c.GetNode(), c.GetCard(), why))
					}
				}
			}
			if err := g.printList(messages(cards), t); err != nil || g.output != outputTable {
				return err
			}
			for _, w := range whys {
				fmt.Fprintln(g.stdout, w)
			}
			return nil
		},
	}
	c.Flags().StringVar(&node, "node", "", "only this node's cards")
	_ = c.RegisterFlagCompletionFunc("node", g.completeFrom(nodeNames))
	return c
}

// planSet is the model's standing on a card that cannot hold every model
// with demand: best-effort or protected; empty while the card holds them
// all.
func planSet(c *pb.ResidencyCardPlan, e *pb.ResidencyPlanEntry) string {
	if e.GetBestEffort() != "" {
		return "best-effort"
	}
	for _, x := range c.GetEntries() {
		if x.GetBestEffort() != "" {
			return "protected"
		}
	}
	return ""
}

func newResidencyProtectCommand(g *globals) *cobra.Command {
	var (
		node  string
		clear bool
	)
	c := &cobra.Command{
		Use:   "protect MODEL... | --clear [--node N]",
		Short: "Choose which models a card that cannot hold them all protects; the others there are best-effort",
		Long: `Put the operator's choice of the protected set in force on every card that
holds a replica of one of the MODELs (deployment names): on such a card
those models are protected — their demand keeps the card — and every other
model with demand there is best-effort: it runs in what the protected set
leaves free and gets bounded turns. Pinned and warm models are always
protected. The choice stays until --clear gives it back to the controllers,
which then choose again the largest set each card can hold. Each card's
change is a residency decision with trigger operator naming who asked
(the token's name with --acl), and one per model whose standing changed.
Refused, changing nothing, on a node whose agent runs with
--best-effort=false.`,
		Args: func(cmd *cobra.Command, args []string) error {
			switch {
			case clear && len(args) > 0:
				return usageErrorf(cmd, "--clear takes no MODEL: it gives the choice back to the controllers on every card")
			case !clear && len(args) == 0:
				return usageErrorf(cmd, "name at least one MODEL to protect, or give --clear")
			}
			return nil
		},
		ValidArgsFunction: g.completeNames(modelNames),
		RunE: func(cmd *cobra.Command, args []string) error {
			api, err := g.api(cmd)
			if err != nil {
				return err
			}
			resp, err := api.Residency.Operate(ctx(cmd), connect.NewRequest(&pb.OperateRequest{Node: node, Models: args,
				Action: pb.OperateAction_OPERATE_ACTION_PROTECT}))
			if err != nil {
				return err
			}
			rs := resp.Msg.GetResults()
			t := table{header: []string{"NODE", "CARD", "REASON"}}
			for _, r := range rs {
				t.rows = append(t.rows, []string{r.GetNode(), r.GetCard(), r.GetReason()})
			}
			return g.printList(messages(rs), t)
		},
	}
	c.Flags().BoolVar(&clear, "clear", false, "give the choice back to the controllers on every card")
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
