package inventory

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/gpuplane/gpuplane/internal/catalog"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// DefaultSimSpec is what --dev simulates when no NVIDIA driver is found.
const DefaultSimSpec = "l4=2"

// maxSimCount bounds one kind's count: more cards than any real node has
// is a typo, not a machine.
const maxSimCount = 64

// SimEntry is one KIND=COUNT of a simulation spec.
type SimEntry struct {
	// Kind is a catalog slug, e.g. "l4".
	Kind  string
	Count int
}

// ParseSimSpec parses a simulation spec such as "l4=2,h100=1": catalog slugs
// (case-insensitive) with counts from 1 to 64, each kind once. The entries
// keep the spec's order, which is the order of the simulated card indexes.
func ParseSimSpec(spec string) ([]SimEntry, error) {
	if strings.TrimSpace(spec) == "" {
		return nil, errors.New("sim GPUs: empty spec; want KIND=COUNT[,KIND=COUNT...] such as l4=2,h100=1")
	}
	fail := func(format string, a ...any) error {
		return fmt.Errorf("sim GPUs %q: %s", spec, fmt.Sprintf(format, a...))
	}
	var entries []SimEntry
	seen := map[string]bool{}
	for i, part := range strings.Split(spec, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			return nil, fail("entry %d is empty", i+1)
		}
		kind, count, ok := strings.Cut(part, "=")
		if !ok {
			return nil, fail("entry %q is not KIND=COUNT", part)
		}
		kind, count = strings.ToLower(strings.TrimSpace(kind)), strings.TrimSpace(count)
		if _, known := catalog.BySlug(kind); !known {
			return nil, fail("unknown device kind %q; known kinds: %s", kind, strings.Join(catalog.Slugs(), ", "))
		}
		n, err := strconv.Atoi(count)
		if err != nil || n < 1 || n > maxSimCount {
			return nil, fail("count %q for %s is not a whole number from 1 to %d", count, kind, maxSimCount)
		}
		if seen[kind] {
			return nil, fail("device kind %q is listed twice", kind)
		}
		seen[kind] = true
		entries = append(entries, SimEntry{Kind: kind, Count: n})
	}
	return entries, nil
}

// Simulated returns the cards spec describes for node nodeName: indexes in
// spec order, memory, architecture and fp8 from the catalog, all healthy.
// UUIDs depend only on the node name, index and kind, so they survive
// restarts and differ between nodes.
func Simulated(nodeName string, spec string) ([]*pb.Card, error) {
	if nodeName == "" {
		return nil, errors.New("simulated cards need a node name: their UUIDs derive from it")
	}
	entries, err := ParseSimSpec(spec)
	if err != nil {
		return nil, err
	}
	var cards []*pb.Card
	for _, e := range entries {
		d, _ := catalog.BySlug(e.Kind) // ParseSimSpec checked it
		for range e.Count {
			i := uint32(len(cards))
			cards = append(cards, &pb.Card{
				Index:        i,
				Uuid:         simUUID(nodeName, i, d.Slug),
				Device:       d.Slug,
				Product:      d.Product,
				MemoryMib:    d.MemoryMiB,
				Architecture: d.Architecture,
				Fp8:          d.FP8,
				Healthy:      true,
			})
		}
	}
	return cards, nil
}

// simUUID formats a hash of the card's identity like an NVML UUID
// ("GPU-" and an RFC 9562 UUID), with version 8, the vendor-specific one, so
// that code parsing UUIDs accepts it and no real card can collide with it.
func simUUID(node string, index uint32, slug string) string {
	sum := sha256.Sum256(fmt.Appendf(nil, "gpuplane-sim\x00%s\x00%d\x00%s", node, index, slug))
	b := sum[:16]
	b[6] = b[6]&0x0f | 0x80 // version 8
	b[8] = b[8]&0x3f | 0x80 // RFC variant
	return fmt.Sprintf("GPU-%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
