package inventory

import (
	"testing"

	"google.golang.org/protobuf/proto"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

func TestDigest(t *testing.T) {
	cards, err := Simulated("n1", "l4=2,h100=1")
	if err != nil {
		t.Fatal(err)
	}
	base := Digest(cards)
	if len(base) != 16 {
		t.Errorf("digest %q is not 16 hex digits", base)
	}
	if got := Digest([]*pb.Card{cards[2], cards[0], cards[1]}); got != base {
		t.Errorf("digest depends on card order: %q vs %q", got, base)
	}
	change := map[string]func(*pb.Card){
		"health":       func(c *pb.Card) { c.Healthy = false },
		"memory":       func(c *pb.Card) { c.MemoryMib-- },
		"device":       func(c *pb.Card) { c.Device = "l4x" },
		"uuid":         func(c *pb.Card) { c.Uuid += "0" },
		"architecture": func(c *pb.Card) { c.Architecture = "hopper" },
		"fp8":          func(c *pb.Card) { c.Fp8 = !c.Fp8 },
		"product":      func(c *pb.Card) { c.Product += " " },
		"index":        func(c *pb.Card) { c.Index = 7 },
	}
	for field, mutate := range change {
		changed := []*pb.Card{cards[0], proto.Clone(cards[1]).(*pb.Card), cards[2]}
		mutate(changed[1])
		if Digest(changed) == base {
			t.Errorf("changing %s leaves the digest unchanged", field)
		}
	}
	if Digest(cards[:2]) == base {
		t.Errorf("removing a card leaves the digest unchanged")
	}
}
