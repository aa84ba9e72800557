package fsm

import (
	"fmt"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

func validateCards(field string, cards []*pb.Card) []*pb.Violation {
	var v violations
	seen := map[uint32]bool{}
	for i, c := range cards {
		f := fmt.Sprintf("%s[%d]", field, i)
		if seen[c.GetIndex()] {
			v.add(f+".index", "duplicate card index %d", c.GetIndex())
		}
		seen[c.GetIndex()] = true
		if c.GetDevice() == "" {
			v.add(f+".device", "is required")
		}
		if c.GetMemoryMib() == 0 {
			v.add(f+".memoryMib", "must be greater than 0")
		}
	}
	return v
}

// sortedCards returns a copy of cards ordered by index, so that equal
// inventories are stored identically whatever order a node reported them in.
func sortedCards(cards []*pb.Card) []*pb.Card {
	out := make([]*pb.Card, len(cards))
	for i, c := range cards {
		out[i] = proto.Clone(c).(*pb.Card)
	}
	slices.SortFunc(out, func(a, b *pb.Card) int { return int(a.GetIndex()) - int(b.GetIndex()) })
	return out
}

func (f *FSM) registerNode(c *pb.RegisterNode, dry bool) *pb.Result {
	n := c.GetNode()
	var v violations
	if n.GetName() == "" {
		v.add("node.name", "is required")
	} else if strings.ContainsAny(n.GetName(), " \t\n/") {
		v.add("node.name", "%q must not contain spaces or '/'", n.GetName())
	}
	if n.GetRole() == pb.NodeRole_NODE_ROLE_UNSPECIFIED {
		v.add("node.role", "must be server or client")
	}
	v = append(v, validateCards("node.cards", n.GetCards())...)
	if len(v) > 0 {
		return invalid("node", v)
	}
	next := proto.Clone(n).(*pb.Node)
	next.Cards = sortedCards(n.GetCards())
	if next.Status == pb.NodeStatus_NODE_STATUS_UNSPECIFIED {
		next.Status = pb.NodeStatus_NODE_STATUS_ALIVE
	}
	prev, exists := f.nodes[n.GetName()]
	if exists && proto.Equal(prev, next) {
		return accept(pb.Outcome_OUTCOME_UNCHANGED, "node %q unchanged", n.GetName())
	}
	if dry {
		return accept(outcomeOf(exists), "node %q would be registered", n.GetName())
	}
	f.nodes[n.GetName()] = next
	f.indexDevices()
	return accept(outcomeOf(exists), "node %q registered with %d cards", n.GetName(), len(next.Cards))
}

func outcomeOf(existed bool) pb.Outcome {
	if existed {
		return pb.Outcome_OUTCOME_CONFIGURED
	}
	return pb.Outcome_OUTCOME_CREATED
}

func (f *FSM) updateInventory(c *pb.UpdateInventory, dry bool) *pb.Result {
	n, exists := f.nodes[c.GetNode()]
	if !exists {
		return reject(pb.Code_CODE_NOT_FOUND, "node %q not found", c.GetNode())
	}
	if v := validateCards("cards", c.GetCards()); len(v) > 0 {
		return invalid("inventory", v)
	}
	cards := sortedCards(c.GetCards())
	if slices.EqualFunc(n.Cards, cards, func(a, b *pb.Card) bool { return proto.Equal(a, b) }) {
		return accept(pb.Outcome_OUTCOME_UNCHANGED, "inventory of node %q unchanged", c.GetNode())
	}
	if !dry {
		n.Cards = cards
		f.indexDevices()
		f.unplaceWhere(func(r *pb.Replica) bool {
			return r.Node == n.Name && slices.ContainsFunc(r.Cards, func(idx uint32) bool { return cardOf(n, idx) == nil })
		}, fmt.Sprintf("a card of node %s disappeared from its inventory", n.Name))
	}
	return accept(pb.Outcome_OUTCOME_CONFIGURED, "node %q now reports %d cards", c.GetNode(), len(cards))
}

func (f *FSM) setNodeStatus(c *pb.SetNodeStatus, dry bool) *pb.Result {
	n, exists := f.nodes[c.GetNode()]
	if !exists {
		return reject(pb.Code_CODE_NOT_FOUND, "node %q not found", c.GetNode())
	}
	if c.GetStatus() == pb.NodeStatus_NODE_STATUS_UNSPECIFIED {
		return invalid("node status", []*pb.Violation{{Field: "status", Description: "must be alive, down or left"}})
	}
	if n.Status == c.GetStatus() {
		return accept(pb.Outcome_OUTCOME_UNCHANGED, "node %q already %s", c.GetNode(), StatusName(c.GetStatus()))
	}
	if !dry {
		n.Status = c.GetStatus()
		if n.Status != pb.NodeStatus_NODE_STATUS_ALIVE {
			f.unplaceOn(n.Name, fmt.Sprintf("node %s is %s", n.Name, StatusName(n.Status))+lostSuffix)
		}
	}
	return accept(pb.Outcome_OUTCOME_CONFIGURED, "node %q is %s", c.GetNode(), StatusName(c.GetStatus()))
}

func (f *FSM) deregisterNode(c *pb.DeregisterNode, dry bool) *pb.Result {
	if _, exists := f.nodes[c.GetNode()]; !exists {
		return reject(pb.Code_CODE_NOT_FOUND, "node %q not found", c.GetNode())
	}
	if !dry {
		f.unplaceWhere(func(r *pb.Replica) bool { return r.Node == c.GetNode() },
			fmt.Sprintf("node %s left the cluster", c.GetNode())+lostSuffix)
		delete(f.nodes, c.GetNode())
		f.indexDevices()
	}
	return accept(pb.Outcome_OUTCOME_DELETED, "node %q deregistered", c.GetNode())
}

// StatusName is the lowercase name users see for a node status.
func StatusName(s pb.NodeStatus) string {
	switch s {
	case pb.NodeStatus_NODE_STATUS_ALIVE:
		return "alive"
	case pb.NodeStatus_NODE_STATUS_DOWN:
		return "down"
	case pb.NodeStatus_NODE_STATUS_LEFT:
		return "left"
	}
	return "unknown"
}

func cardOf(n *pb.Node, index uint32) *pb.Card {
	for _, c := range n.Cards {
		if c.Index == index {
			return c
		}
	}
	return nil
}
