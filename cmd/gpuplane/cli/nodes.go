package cli

import (
	"context"
	"maps"
	"slices"
	"strconv"
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
	return listCommand(g, "List nodes with their role, status, cards and labels",
		func(c context.Context, api *apiClients, stale bool) ([]*pb.Node, error) {
			resp, err := answer(api.Nodes.ListNodes(c, connect.NewRequest(&pb.ListNodesRequest{Stale: stale})))
			return resp.GetNodes(), err
		}, nodeTable)
}

func newNodesGetCommand(g *globals) *cobra.Command {
	return getCommand(g, "Show one node and its cards", nodeNames,
		func(c context.Context, api *apiClients, name string, stale bool) (*pb.Node, error) {
			resp, err := answer(api.Nodes.GetNode(c, connect.NewRequest(&pb.GetNodeRequest{Name: name, Stale: stale})))
			return resp.GetNode(), err
		}, nodeDetail)
}

// nodeDetail is `nodes get`: the listing's columns, what the node offers
// besides its cards, and its cards.
func nodeDetail(n *pb.Node) detail {
	cpu := ""
	if m := n.GetCpuMilli(); m > 0 {
		cpu = strconv.FormatFloat(float64(m)/1000, 'f', -1, 64)
	}
	memory := ""
	if m := n.GetMemoryMib(); m > 0 {
		memory = mib(m)
	}
	cards := tableOf([]string{"INDEX", "DEVICE", "PRODUCT", "MEMORY", "UUID", "HEALTHY"}, n.GetCards(), func(c *pb.Card) []string {
		return []string{itoa(c.GetIndex()), c.GetDevice(), c.GetProduct(), mib(c.GetMemoryMib()), c.GetUuid(), strconv.FormatBool(c.GetHealthy())}
	})
	return detailOf(nodeTable([]*pb.Node{n})).with(
		[2]string{"Raft address", n.GetRaftAddress()},
		[2]string{"Gossip address", n.GetGossipAddress()},
		[2]string{"Version", n.GetVersion()},
		[2]string{"CPU", cpu},
		[2]string{"Memory", memory},
	).withPart("Cards", cards)
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
	resp, err := answer(api.Nodes.ListNodes(ctx(cmd), connect.NewRequest(&pb.ListNodesRequest{Stale: true})))
	return namesOf(resp.GetNodes(), err)
}
