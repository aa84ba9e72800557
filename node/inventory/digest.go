package inventory

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// Digest is a short stable hash of an inventory: equal for the same cards in
// any order, different when any field of any card changes (health included),
// so gossip can carry it and the leader re-reads only nodes whose digest moved.
func Digest(cards []*pb.Card) string {
	sorted := slices.SortedFunc(slices.Values(cards), func(a, b *pb.Card) int {
		return cmp.Or(cmp.Compare(a.GetIndex(), b.GetIndex()), cmp.Compare(a.GetUuid(), b.GetUuid()))
	})
	h := sha256.New()
	for _, c := range sorted {
		fmt.Fprintf(h, "%d %q %q %q %d %q %t %t\n", c.GetIndex(), c.GetUuid(), c.GetDevice(), c.GetProduct(),
			c.GetMemoryMib(), c.GetArchitecture(), c.GetFp8(), c.GetHealthy())
	}
	return hex.EncodeToString(h.Sum(nil)[:8])
}
