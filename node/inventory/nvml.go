package inventory

import (
	"fmt"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuplane/gpuplane/internal/catalog"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// nvmlLibrary is the shared library go-nvml loads by default.
const nvmlLibrary = "libnvidia-ml.so.1"

const mib = 1 << 20

// architectures names NVML's architecture codes the way the catalog does.
var architectures = map[nvml.DeviceArchitecture]string{
	nvml.DEVICE_ARCH_KEPLER:    "kepler",
	nvml.DEVICE_ARCH_MAXWELL:   "maxwell",
	nvml.DEVICE_ARCH_PASCAL:    "pascal",
	nvml.DEVICE_ARCH_VOLTA:     "volta",
	nvml.DEVICE_ARCH_TURING:    "turing",
	nvml.DEVICE_ARCH_AMPERE:    "ampere",
	nvml.DEVICE_ARCH_ADA:       "ada",
	nvml.DEVICE_ARCH_HOPPER:    "hopper",
	nvml.DEVICE_ARCH_BLACKWELL: "blackwell",
}

// readNVML reads every card lib reports. It initialises lib and shuts it
// down before returning. A product missing from the catalog gets a slug
// derived from its name and a warning; a card whose memory cannot be read is
// reported unhealthy. The warnings are returned, not logged, so that Detect
// can hand them to the agent.
func readNVML(lib nvml.Interface) ([]*pb.Card, []string, error) {
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return nil, nil, fmt.Errorf("initialise NVML: %w", ret)
	}
	// The inventory is read once; a failed shutdown leaves nothing to undo.
	defer lib.Shutdown()

	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, nil, fmt.Errorf("count cards: %w", ret)
	}
	var (
		cards    []*pb.Card
		warnings []string
	)
	for i := range n {
		card, warn, err := readCard(lib, i)
		if err != nil {
			return nil, nil, fmt.Errorf("card %d: %w", i, err)
		}
		if warn != "" {
			warnings = append(warnings, fmt.Sprintf("card %d: %s", i, warn))
		}
		if card != nil {
			cards = append(cards, card)
		}
	}
	return cards, warnings, nil
}

// readCard reads card i. Without a UUID or a name the card cannot be
// registered, so those failures are errors; any other failed read marks the
// card unhealthy. A nil card with a warning means the card was skipped.
func readCard(lib nvml.Interface, i int) (*pb.Card, string, error) {
	dev, ret := lib.DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		return nil, "", fmt.Errorf("get handle: %w", ret)
	}
	uuid, ret := dev.GetUUID()
	if ret != nvml.SUCCESS {
		return nil, "", fmt.Errorf("read UUID: %w", ret)
	}
	product, ret := dev.GetName()
	if ret != nvml.SUCCESS {
		return nil, "", fmt.Errorf("read product name: %w", ret)
	}
	card := &pb.Card{Index: uint32(i), Uuid: uuid, Product: product, Healthy: true}
	var warn string
	if d, ok := catalog.Lookup(product); ok {
		card.Device, card.MemoryMib, card.Architecture, card.Fp8 = d.Slug, d.MemoryMiB, d.Architecture, d.FP8
	} else {
		card.Device, card.Architecture = slugOf(product), "unknown"
		warn = fmt.Sprintf("product %q is not in the device catalog; calling its kind %q", product, card.Device)
	}
	if mem, ret := dev.GetMemoryInfo(); ret == nvml.SUCCESS {
		card.MemoryMib = mem.Total / mib
	} else {
		card.Healthy = false
		if card.MemoryMib == 0 {
			// The state machine rejects a card of unknown size, and with it
			// the whole node.
			return nil, fmt.Sprintf("skipped %s: unknown product and memory unreadable: %v", uuid, ret), nil
		}
	}
	if arch, ret := dev.GetArchitecture(); ret == nvml.SUCCESS && architectures[arch] != "" {
		card.Architecture = architectures[arch]
	}
	return card, warn, nil
}

// slugOf derives a device kind from a product name missing from the catalog:
// lowercased, each run of other characters turned into one '-', at most a DNS
// label long.
func slugOf(product string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(product) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		case b.Len() > 0 && !strings.HasSuffix(b.String(), "-"):
			b.WriteByte('-')
		}
	}
	s := b.String()
	if len(s) > 63 {
		s = s[:63]
	}
	s = strings.TrimSuffix(s, "-")
	if s == "" {
		return "unknown"
	}
	return s
}
