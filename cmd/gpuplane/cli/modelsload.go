package cli

import (
	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// `gpuplane models load|unload`: the operator's hand on the residency
// controllers, with Ollama's meaning (`ollama run` preloads, `ollama stop`
// unloads).

func newModelsLoadCommand(g *globals) *cobra.Command {
	return modelsOperateCommand(g, pb.OperateAction_OPERATE_ACTION_LOAD, &cobra.Command{
		Use:   "load NAME [--node N]",
		Short: "Load a model's replicas onto their cards now",
		Long: `Load each replica of NAME (a deployment, or one replica such as chat/0) onto
its card now, or wake it where it sleeps, as ` + "`ollama run`" + ` preloads a model.
The card must hold it beside what it promised the others (pinned and warm
shares, what runs now); where it needs more, idle onDemand models (no
request running or waiting) are unloaded to make room, the least valuable
first, and listed with it. Where even that is not enough the command
fails, naming what holds the card, and nothing changes. Once loaded the
model follows its card's idle timeouts as usual. Each load and each
unload making room for it is a residency decision with trigger operator,
naming who asked.`,
	})
}

func newModelsUnloadCommand(g *globals) *cobra.Command {
	return modelsOperateCommand(g, pb.OperateAction_OPERATE_ACTION_UNLOAD, &cobra.Command{
		Use:   "unload NAME [--node N]",
		Short: "Take a model's replicas off their cards now",
		Long: `Take each replica of NAME (a deployment, or one replica such as chat/0) off its
card now, as ` + "`ollama stop`" + ` does: an onDemand model is unloaded, a warm one put
to sleep (unloaded where its engine cannot sleep; its share stays reserved).
Requests running on it finish first (the card's drain deadline). A pinned
model is refused with the reason. The model stays off until the next
request for it (which loads it again as usual) or a load: an arrival
forecast does not bring it back. Each unload is a residency decision
with trigger operator, naming who asked.`,
	})
}

func modelsOperateCommand(g *globals, action pb.OperateAction, c *cobra.Command) *cobra.Command {
	var node string
	c.Args = argsNamed("NAME")
	c.ValidArgsFunction = g.completeNames(modelNames)
	c.RunE = func(cmd *cobra.Command, args []string) error {
		api, err := g.api(cmd)
		if err != nil {
			return err
		}
		resp, err := api.Residency.Operate(ctx(cmd), connect.NewRequest(&pb.OperateRequest{Node: node, Model: args[0], Action: action}))
		if err != nil {
			return err
		}
		rs := resp.Msg.GetResults()
		t := table{header: []string{"NODE", "CARD", "REPLICA", "ACTION", "REASON"}}
		for _, r := range rs {
			t.rows = append(t.rows, []string{r.GetNode(), r.GetCard(), r.GetReplica(), r.GetAction(), r.GetReason()})
		}
		return g.printList(messages(rs), t)
	}
	c.Flags().StringVar(&node, "node", "", "only this node's replicas")
	_ = c.RegisterFlagCompletionFunc("node", g.completeFrom(nodeNames))
	return c
}
