package servesim

import (
	"fmt"

	"github.com/gpuplane/gpuplane/node/gateway/queue"
	"slices"
	"strings"
)

// Variants of the interference matrix (docs/simulate.md): the same cells
// with LoRA adapters, with quantized weights, with continuous batching
// off and with the gateway's preemption off. A variant is a change to the
// config; `simulate interference` and `bench interference` run the matrix
// once per variant asked for, on the changed config.

// Variant is one repetition of the matrix.
type Variant struct {
	Name string
	// Doc says what it changes, for the help and the report.
	Doc   string
	apply func(c *Config)
}

// Variants are the matrix's variants, in the order they run.
var Variants = []Variant{
	{"base", "the config as written", func(*Config) {}},
	{"adapters", "each request asks for its tenant's own LoRA adapter", func(c *Config) {
		c.TenantAdapters = true
		for i := range c.Models {
			m := &c.Models[i]
			for _, t := range c.Tenants {
				if !slices.Contains(m.Adapters, t.Name) {
					m.Adapters = append(m.Adapters, t.Name)
				}
			}
			m.MaxAdapters = max(m.MaxAdapters, len(m.Adapters))
		}
	}},
	{"quantized", "fp8 weights: half the weight memory and loads, twice the decode", func(c *Config) {
		for i := range c.Models {
			Quantize(&c.Models[i])
		}
	}},
	{"batching-off", "one request at a time per engine (--max-num-seqs 1)", func(c *Config) {
		c.EngineBatch = true
		for i := range c.Models {
			c.Models[i].MaxInFlight = 1
		}
	}},
	{"preemption", "a background batch beside each interactive model, preempted for it", func(c *Config) {
		c.BackgroundBeside = true
	}},
	{"preemption-off", "the same background batch, never preempted", func(c *Config) {
		c.BackgroundBeside, c.NoPreemption = true, true
	}},
}

// weightShare is the part of a model's footprint that is weights in the
// sim engine's split (bench interference: a quarter is the KV pool, the
// CUDA context is small beside it).
const weightShare = 0.75

// Quantize turns m into its 8-bit (fp8) variant of 16-bit weights, by
// the sim engine's model (docs/engines.md, CONTROLLER-NOTES §6b): the
// weights take half the bytes, so the footprint loses half its weight
// share and the residual as much in proportion; a load and a wake copy
// half the bytes (T = bytes / bandwidth); one stream's decode rate,
// r1 = 0.77 × memory bandwidth / weight bytes, doubles. The KV pool and
// the prefill rate stay.
func Quantize(m *ModelConfig) {
	f := 1 - weightShare/2
	m.MemoryGiB *= f
	m.PeakGiB *= f
	m.ResidualGiB *= f
	m.LoadSeconds /= 2
	m.WakeSeconds /= 2
	m.TokensPerSecond *= 2
	m.Quantization = "fp8"
}

// VariantNames lists the variants' names.
func VariantNames() []string {
	var out []string
	for _, v := range Variants {
		out = append(out, v.Name)
	}
	return out
}

// ParseVariants reads a comma-separated list of variant names ("all" for
// every one), in the order given, without repeats.
func ParseVariants(list string) ([]Variant, error) {
	var out []Variant
	for name := range strings.SplitSeq(list, ",") {
		name = strings.TrimSpace(name)
		if name == "all" {
			for _, v := range Variants {
				if !slices.ContainsFunc(out, func(x Variant) bool { return x.Name == v.Name }) {
					out = append(out, v)
				}
			}
			continue
		}
		i := slices.IndexFunc(Variants, func(v Variant) bool { return v.Name == name })
		if i < 0 {
			return nil, fmt.Errorf("invalid --variants %q: want a comma-separated list of %s, or all", name, strings.Join(VariantNames(), ", "))
		}
		if !slices.ContainsFunc(out, func(x Variant) bool { return x.Name == name }) {
			out = append(out, Variants[i])
		}
	}
	return out, nil
}

// Apply returns a copy of cfg with the variant's changes; cfg is not
// changed.
func (v Variant) Apply(cfg *Config) *Config {
	c := *cfg
	c.Models = slices.Clone(cfg.Models)
	for i := range c.Models {
		c.Models[i].Adapters = slices.Clone(c.Models[i].Adapters)
	}
	c.Tenants = slices.Clone(cfg.Tenants)
	v.apply(&c)
	return &c
}

// Beside is the background batch a mix adds beside interactive model m's
// own traffic under BackgroundBeside: 2 requests always outstanding, 1k
// tokens in and out, of class background; false for a model that gets
// none.
func (c *Config) Beside(m *ModelConfig) (SyntheticStream, bool) {
	if !c.BackgroundBeside || m.class != queue.Interactive {
		return SyntheticStream{}, false
	}
	return SyntheticStream{Model: m.Name, Concurrency: 2, PromptTokens: 1000, OutputTokens: 1000, aside: true}, true
}

// Aside says the stream is background work beside a model's own traffic
// (Beside): its requests are of class background and not measured.
func (st SyntheticStream) Aside() bool { return st.aside }

// tenantAdapter is the adapter (index + 1) of model m a request of tenant
// asks for under TenantAdapters, or 0.
func (c *Config) tenantAdapter(m int, tenant string) int {
	if !c.TenantAdapters {
		return 0
	}
	return slices.Index(c.Models[m].Adapters, tenant) + 1
}
