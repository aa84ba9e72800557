package cli

import (
	"maps"
	"slices"
	"strings"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// `gpuplane nodes`: the machines of the cluster.

func newNodesCommand(g *globals) *cobra.Command {
	return newGroupCommand("nodes", "List the nodes of the cluster", []string{"node"},
		newNodesListCommand(g),
		newNodesGetCommand(g),
	)
}

func newNodesListCommand(g *globals) *cobra.Command {
	var stale bool
	c := &cobra.Command{
		Use:   "list",
		Short: "List nodes with their role, status, cards and labels",
		Args:  argsNamed(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			api, err := g.api(cmd)
			if err != nil {
				return err
			}
			resp, err := api.Nodes.ListNodes(ctx(cmd), connect.NewRequest(&pb.ListNodesRequest{Stale: stale}))
			if err != nil {
				return err
			}
			nodes := resp.Msg.GetNodes()
			return g.printList(messages(nodes), nodeTable(nodes))
		},
	}
	addStaleFlag(c, &stale)
	return c
}

func newNodesGetCommand(g *globals) *cobra.Command {
	var stale bool
	c := &cobra.Command{
		Use:               "get NAME",
		Short:             "Show one node",
		Args:              argsNamed("NAME"),
		ValidArgsFunction: g.completeNames(nodeNames),
		RunE: func(cmd *cobra.Command, args []string) error {
			api, err := g.api(cmd)
			if err != nil {
				return err
			}
			resp, err := api.Nodes.GetNode(ctx(cmd), connect.NewRequest(&pb.GetNodeRequest{Name: args[0], Stale: stale}))
			if err != nil {
				return err
			}
			node := resp.Msg.GetNode()
			return g.printObject(node, nodeTable([]*pb.Node{node}))
		},
	}
	addStaleFlag(c, &stale)
	return c
}

func nodeTable(nodes []*pb.Node) table {
	return tableOf([]string{"NAME", "ADDRESS", "ROLE", "STATUS", "CARDS", "LABELS"}, nodes,
		func(n *pb.Node) []string {
			return []string{n.GetName(), n.GetAddress(), enumName(n.GetRole().String(), "NODE_ROLE_"),
				enumName(n.GetStatus().String(), "NODE_STATUS_"), cardCounts(n.GetCards()), labelList(n.GetLabels())}
		})
}

// cardCounts summarises a node's cards by device kind, in the order the kinds
// first appear: "l4=2,h100=1".
func cardCounts(cards []*pb.Card) string {
	var kinds []string
	count := make(map[string]int)
	for _, c := range cards {
		k := c.GetDevice()
		if k == "" {
			k = "unknown"
		}
		if count[k] == 0 {
			kinds = append(kinds, k)
		}
		count[k]++
	}
	parts := make([]string, len(kinds))
	for i, k := range kinds {
		parts[i] = k + "=" + itoa(count[k])
	}
	return strings.Join(parts, ",")
}

// labelList prints labels as sorted "k=v,k2=v2".
func labelList(labels map[string]string) string {
	keys := slices.Sorted(maps.Keys(labels))
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + labels[k]
	}
	return strings.Join(parts, ",")
}

func nodeNames(cmd *cobra.Command, api *apiClients) ([]string, error) {
	resp, err := api.Nodes.ListNodes(ctx(cmd), connect.NewRequest(&pb.ListNodesRequest{Stale: true}))
	if err != nil {
		return nil, err
	}
	var names []string
	for _, n := range resp.Msg.GetNodes() {
		names = append(names, n.GetName())
	}
	return names, nil
}
