package cli

import (
	"fmt"
	"strings"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	"github.com/gpuplane/gpuplane/fsm"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// `gpuplane replicas`: the copies of deployments and where they run.

func newReplicasCommand(g *globals) *cobra.Command {
	return newGroupCommand("replicas", "Inspect the replicas of model deployments", []string{"replica"},
		newReplicasListCommand(g),
		newReplicasLogsCommand(g),
	)
}

func newReplicasListCommand(g *globals) *cobra.Command {
	var (
		model, node string
		stale       bool
	)
	c := &cobra.Command{
		Use:   "list [--model M] [--node N]",
		Short: "List replicas: where each runs, its share, its state and why it waits",
		Args:  argsNamed(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			api, err := g.api(cmd)
			if err != nil {
				return err
			}
			resp, err := api.Models.ListReplicas(ctx(cmd), connect.NewRequest(&pb.ListReplicasRequest{
				Model: model, Node: node, Stale: stale,
			}))
			if err != nil {
				return err
			}
			rs := resp.Msg.GetReplicas()
			return g.printList(messages(rs), replicaTable(rs))
		},
	}
	c.Flags().StringVar(&model, "model", "", "only this deployment's replicas")
	c.Flags().StringVar(&node, "node", "", "only replicas on this node")
	addStaleFlag(c, &stale)
	_ = c.RegisterFlagCompletionFunc("model", g.completeFrom(modelNames))
	_ = c.RegisterFlagCompletionFunc("node", g.completeFrom(nodeNames))
	return c
}

// replicaTable is the table of `replicas list`, also shown by `models get`.
// MEMORY is the share on each of the replica's cards (reserved, unless the
// deployment is onDemand); RESIDENCY where its weights are (docs/residency.md).
func replicaTable(rs []*pb.Replica) table {
	return tableOf([]string{"MODEL", "REPLICA", "NODE", "CARDS", "MEMORY", "COMPUTE", "STATE", "RESIDENCY", "ENDPOINT", "REASON"}, rs,
		func(r *pb.Replica) []string {
			cards := make([]string, len(r.GetCards()))
			for i, c := range r.GetCards() {
				cards[i] = itoa(c)
			}
			compute := ""
			if p := r.GetComputePercent(); p > 0 {
				compute = fmt.Sprintf("%d%%", p)
			}
			return []string{r.GetModel(), itoa(r.GetIndex()), r.GetNode(), strings.Join(cards, ","),
				mibOrDash(r.GetMemoryMib()), compute, fsm.ReplicaStateName(r.GetState()), fsm.ReplicaResidencyName(r.GetResidency()),
				r.GetEndpoint(), r.GetReason()}
		})
}
