// Package catalog is gpuplane's built-in table of device kinds: the slug users
// name in accelerators (l4, h100, ...), keyed by the product names NVML reports,
// with memory, architecture and fp8 support.
//
// It is plain data: it never reads hardware and imports nothing of the
// project, so the inventory and the state machine both import it without one
// reaching into the other. The node inventory maps NVML
// product names through it; the state machine uses it to accept device kinds
// that no node has reported yet (docs/descriptors.md rule 2).
package catalog

import (
	"sort"
	"strings"
)

// Device describes one kind of card.
type Device struct {
	// Slug is the device kind users write, e.g. "l4".
	Slug string
	// Product is the canonical NVML product name.
	Product string
	// MemoryMiB is the memory NVML reports for this product.
	MemoryMiB    uint64
	Architecture string
	FP8          bool
	// aliases are other NVML product names of the same kind (form factors).
	aliases []string
}

var devices = []Device{
	{Slug: "p100", Product: "Tesla P100-PCIE-16GB", MemoryMiB: 16280, Architecture: "pascal", aliases: []string{"Tesla P100-SXM2-16GB", "Tesla P100-PCIE-12GB"}},
	{Slug: "v100-16gb", Product: "Tesla V100-SXM2-16GB", MemoryMiB: 16160, Architecture: "volta", aliases: []string{"Tesla V100-PCIE-16GB", "Tesla V100S-PCIE-16GB", "Tesla V100-FHHL-16GB"}},
	{Slug: "v100-32gb", Product: "Tesla V100-SXM2-32GB", MemoryMiB: 32510, Architecture: "volta", aliases: []string{"Tesla V100-PCIE-32GB", "Tesla V100S-PCIE-32GB", "Tesla V100-DGXS-32GB"}},
	{Slug: "t4", Product: "Tesla T4", MemoryMiB: 15360, Architecture: "turing", aliases: []string{"NVIDIA T4"}},
	{Slug: "a10", Product: "NVIDIA A10", MemoryMiB: 23028, Architecture: "ampere"},
	{Slug: "a10g", Product: "NVIDIA A10G", MemoryMiB: 23028, Architecture: "ampere"},
	// "Mock NVIDIA A100-SXM4-40GB" is what go-nvml's mock dgxa100 server
	// reports; node/inventory's tests read their cards from it.
	{Slug: "a100-40gb", Product: "NVIDIA A100-SXM4-40GB", MemoryMiB: 40960, Architecture: "ampere", aliases: []string{"NVIDIA A100-PCIE-40GB", "NVIDIA A100 40GB PCIe", "Mock NVIDIA A100-SXM4-40GB"}},
	{Slug: "a100-80gb", Product: "NVIDIA A100-SXM4-80GB", MemoryMiB: 81920, Architecture: "ampere", aliases: []string{"NVIDIA A100 80GB PCIe", "NVIDIA A100-PCIE-80GB"}},
	{Slug: "l4", Product: "NVIDIA L4", MemoryMiB: 23034, Architecture: "ada", FP8: true},
	{Slug: "rtx4090", Product: "NVIDIA GeForce RTX 4090", MemoryMiB: 24564, Architecture: "ada", FP8: true},
	{Slug: "h100", Product: "NVIDIA H100 80GB HBM3", MemoryMiB: 81559, Architecture: "hopper", FP8: true, aliases: []string{"NVIDIA H100 PCIe", "NVIDIA H100"}},
	{Slug: "h100-nvl", Product: "NVIDIA H100 NVL", MemoryMiB: 95830, Architecture: "hopper", FP8: true},
	{Slug: "h200", Product: "NVIDIA H200", MemoryMiB: 143771, Architecture: "hopper", FP8: true, aliases: []string{"NVIDIA H200 NVL"}},
}

var (
	bySlug    = map[string]Device{}
	byProduct = map[string]Device{}
)

func init() {
	for _, d := range devices {
		bySlug[d.Slug] = d
		byProduct[strings.ToLower(d.Product)] = d
		for _, a := range d.aliases {
			byProduct[strings.ToLower(a)] = d
		}
	}
}

// BySlug returns the device kind with this slug.
func BySlug(slug string) (Device, bool) {
	d, ok := bySlug[slug]
	return d, ok
}

// Lookup returns the device kind of an NVML product name (case-insensitive).
func Lookup(product string) (Device, bool) {
	d, ok := byProduct[strings.ToLower(strings.TrimSpace(product))]
	return d, ok
}

// Slugs returns every slug, sorted.
func Slugs() []string {
	out := make([]string, 0, len(devices))
	for _, d := range devices {
		out = append(out, d.Slug)
	}
	sort.Strings(out)
	return out
}
