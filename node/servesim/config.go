package servesim

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/gpuplane/gpuplane/internal/cardfit"
	"github.com/gpuplane/gpuplane/internal/class"
	"github.com/gpuplane/gpuplane/internal/strictyaml"
	"github.com/gpuplane/gpuplane/node/gateway/queue"
	"github.com/gpuplane/gpuplane/node/residency"
)

const gib = float64(1 << 30)

// Config is the serving simulator's input besides the traces: one card, the
// models on it with their engine figures, the tenants, how trace files map
// onto models and tenants, synthetic streams, and the baselines' knobs.
// EXAMPLE: examples/serve/home.yaml; the format is documented in `gpuplane
// simulate serve --help` (configHelp).
type Config struct {
	Card      CardConfig        `json:"card"`
	Models    []ModelConfig     `json:"models"`
	Tenants   []TenantConfig    `json:"tenants"`
	Traces    []TraceMapping    `json:"traces"`
	Synthetic []SyntheticStream `json:"synthetic"`
	// DurationSeconds ends arrivals; 0 means the last trace arrival, or one
	// hour when there is no trace.
	DurationSeconds float64 `json:"durationSeconds"`
	// WarmupSeconds: requests arriving before it run but are not measured,
	// nor are the loads, wakes and evictions before it (a warm-up, so
	// that what is measured is the steady state, not how each policy
	// fills an empty card): every policy starts with a cold card.
	WarmupSeconds float64         `json:"warmupSeconds"`
	Ollama        OllamaConfig    `json:"ollama"`
	LlamaSwap     LlamaSwapConfig `json:"llamaswap"`

	// What a variant of the interference matrix (variant.go) changes
	// besides the models; a config file cannot set them.
	//
	// NoPreemption turns off the gateway's preemption of background
	// requests for interactive ones (queue.Config.NoPreemption).
	NoPreemption bool `json:"-"`
	// EngineBatch makes each engine's own batch its model's MaxInFlight
	// (the sim engine's --max-num-seqs, vLLM's) also where the node's
	// fronts, not the gateway, hand requests to the engines (a replay).
	EngineBatch bool `json:"-"`
	// TenantAdapters sends each request that names no adapter to its
	// tenant's own LoRA adapter of the model: the adapter named as the
	// tenant.
	TenantAdapters bool `json:"-"`
	// BackgroundBeside adds to every mix, for each interactive model, a
	// background batch on the same model (Beside), which the gateway
	// preempts for the model's own requests unless NoPreemption.
	BackgroundBeside bool `json:"-"`
	// ExactPriors gives gpuplane's controller each model's exact load and
	// wake times and footprints at the start (`--priors exact`); by
	// default it starts as the agent does, with the shares only, and
	// learns the rest from what it sees.
	ExactPriors bool `json:"-"`
	// NoBestEffort runs gpuplane's controller without its protected set
	// (`--best-effort=false`; residency.Config.BestEffort).
	NoBestEffort bool `json:"-"`
	// StaticBestCap bounds the sets static-best's search simulates
	// (0: DefaultStaticBestCap).
	StaticBestCap int `json:"-"`

	path string
}

// hasBackground reports whether any model is of the background class.
func (c *Config) hasBackground() bool {
	for i := range c.Models {
		if c.Models[i].class == queue.Background {
			return true
		}
	}
	return false
}

// CardConfig is the simulated card.
type CardConfig struct {
	Name            string  `json:"name"`
	MemoryGiB       float64 `json:"memoryGiB"`
	HeadroomPercent float64 `json:"headroomPercent"`
}

// ModelConfig is one model: its class and residency for gpuplane, its
// memory and timing figures (the sim engine's parameters, docs/engines.md), its
// batching limits and its targets.
type ModelConfig struct {
	Name      string `json:"name"`
	Class     string `json:"class"`
	Residency string `json:"residency"`
	// MemoryGiB is the resident footprint (overhead + weights + KV pool);
	// PeakGiB what a load holds (default MemoryGiB); ResidualGiB what it
	// holds asleep (default 5% of MemoryGiB).
	MemoryGiB   float64 `json:"memoryGiB"`
	PeakGiB     float64 `json:"peakGiB"`
	ResidualGiB float64 `json:"residualGiB"`
	CanSleep    *bool   `json:"canSleep"`
	// LoadSeconds, WakeSeconds are at the card's full copy bandwidth;
	// concurrent copies split it. SleepSeconds and StopSeconds default 1.
	LoadSeconds  float64 `json:"loadSeconds"`
	WakeSeconds  float64 `json:"wakeSeconds"`
	SleepSeconds float64 `json:"sleepSeconds"`
	StopSeconds  float64 `json:"stopSeconds"`
	// TokensPerSecond is one stream's decode rate alone on the card;
	// PrefillTokensPerSecond the prompt rate (0: prefill is free, as in
	// the sim engine); BatchSlowdown is α in r/(1+α(C−1)) (default 0.03);
	// ComputePercent weighs busy engines' split of the card (default 100).
	TokensPerSecond        float64  `json:"tokensPerSecond"`
	PrefillTokensPerSecond float64  `json:"prefillTokensPerSecond"`
	BatchSlowdown          *float64 `json:"batchSlowdown"`
	ComputePercent         float64  `json:"computePercent"`
	// MaxInFlight is the engine's batch (max_num_seqs, default 16);
	// KVTokens the KV pool in tokens (0: unbounded).
	MaxInFlight int `json:"maxInFlight"`
	KVTokens    int `json:"kvTokens"`
	// KeepAliveSeconds is Ollama's keep_alive for this model (default 300).
	KeepAliveSeconds float64 `json:"keepAliveSeconds"`
	// SLOTTFTSeconds and SLOTPOTSeconds are the targets; 0 means none.
	SLOTTFTSeconds float64 `json:"sloTTFTSeconds"`
	SLOTPOTSeconds float64 `json:"sloTPOTSeconds"`
	// Adapters are LoRA adapters on this base model, asked for as
	// "model:adapter" (docs/gateway.md). The engine keeps MaxAdapters (default
	// 4) loaded and loads another in AdapterLoadSeconds (default 0.2 s,
	// between the 370 ms and 83.5 ms ServerlessLLM, OSDI'24, reports for
	// loading a LoRA adapter without and with its loader).
	Adapters           []string `json:"adapters"`
	AdapterLoadSeconds float64  `json:"adapterLoadSeconds"`
	MaxAdapters        int      `json:"maxAdapters"`
	// Quantization names the weights' numeric format (bf16, fp8, awq,
	// q4_k_m) where the figures above are those of a quantized variant;
	// the node profiles each format apart (spec.engine.quantization).
	Quantization string `json:"quantization"`

	class     queue.Class
	residency residency.Residency
}

// TenantConfig is a tenant and its fair-share weight (default 1).
type TenantConfig struct {
	Name   string  `json:"name"`
	Weight float64 `json:"weight"`
}

// TraceMapping says how a trace file given with --trace maps onto the card.
type TraceMapping struct {
	// File matches a trace's base name (a filepath.Match pattern).
	File string `json:"file"`
	// Path, relative to the config file, is read when no --trace is given
	// (skipped when absent).
	Path string `json:"path"`
	// Model receives the file's requests (required for Azure CSV; for JSONL
	// it replaces the file's model when set).
	Model string `json:"model"`
	// Tenants are drawn uniformly from the seed for each request that has
	// none (default: the first tenant).
	Tenants []string `json:"tenants"`
	// TimeScale multiplies the trace's times (0.5 = twice the rate;
	// default 1). OffsetSeconds shifts them.
	TimeScale     float64 `json:"timeScale"`
	OffsetSeconds float64 `json:"offsetSeconds"`
	// MaxOutputTokens caps the output of each request (0: no cap).
	MaxOutputTokens int `json:"maxOutputTokens"`
	// Adapters: for traces that name none (Azure), AdapterPercent of the
	// requests (default 100) ask for one of these adapters of the model,
	// drawn uniformly from the seed.
	Adapters       []string `json:"adapters"`
	AdapterPercent float64  `json:"adapterPercent"`
	// For GenTD26 request traces: Models maps a checkpoint_model_version_id
	// to a model; rows of other checkpoints go to OtherModel, or are
	// skipped when it is empty. A request's prompt is prompt_length +
	// negative_prompt_length tokens and its output num_images_per_prompt ×
	// num_inference_steps × TokensPerImageStep (default 1) tokens; its
	// groupId is hashed onto Tenants.
	Models             map[string]string `json:"models"`
	OtherModel         string            `json:"otherModel"`
	TokensPerImageStep float64           `json:"tokensPerImageStep"`
}

// SyntheticStream generates requests for a model from the seed: Poisson
// arrivals at RatePerSecond (open loop), or Concurrency requests always
// outstanding (closed loop, a batch job); token lengths uniform in ±50% of
// the means.
type SyntheticStream struct {
	Model         string   `json:"model"`
	Tenants       []string `json:"tenants"`
	RatePerSecond float64  `json:"ratePerSecond"`
	Concurrency   int      `json:"concurrency"`
	PromptTokens  int      `json:"promptTokens"`
	OutputTokens  int      `json:"outputTokens"`
	// OnSeconds/OffSeconds make the open-loop stream bursty: it sends only
	// during OnSeconds of every OnSeconds+OffSeconds.
	OnSeconds  float64 `json:"onSeconds"`
	OffSeconds float64 `json:"offSeconds"`

	// from and until bound when a closed-loop stream sends (until 0: the
	// run's end); a replay of a live run (replay.go) sets them per mix.
	from, until float64
	// sent, when set, are the requests a live closed loop sent, in order
	// (replay.go): the stream's n-th send has the n-th one's lengths and,
	// timed, its paths to and from the engine.
	sent []LiveRequest
	// aside: its requests are background work beside the model's own
	// traffic (Config.Beside): background class, not measured.
	aside bool
}

// OllamaConfig sets the ollama baseline (defaults from ollama's
// envconfig: OLLAMA_MAX_LOADED_MODELS 3 per GPU, OLLAMA_NUM_PARALLEL 1,
// OLLAMA_MAX_QUEUE 512).
type OllamaConfig struct {
	MaxLoaded   int `json:"maxLoaded"`
	NumParallel int `json:"numParallel"`
	MaxQueue    int `json:"maxQueue"`
}

// LlamaSwapConfig sets the llama-swap baseline (concurrencyLimit default 10).
type LlamaSwapConfig struct {
	ConcurrencyLimit int `json:"concurrencyLimit"`
}

// LoadConfig reads and checks a config file.
func LoadConfig(path string) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return ParseConfig(path, b)
}

// ParseConfig checks a config; path names it in errors.
func ParseConfig(path string, b []byte) (*Config, error) {
	var c Config
	at := func(err error) error {
		if line := lineOf(b, err.Error()); line > 0 {
			return fmt.Errorf("config %s: line %d: %w", path, line, err)
		}
		return fmt.Errorf("config %s: %w", path, err)
	}
	if err := strictyaml.Unmarshal(b, &c, true); err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err) // it names the line
	}
	c.path = path
	if err := c.validate(); err != nil {
		return nil, at(err)
	}
	return &c, nil
}

func (c *Config) validate() error {
	if c.Card.Name == "" {
		c.Card.Name = "gpu0"
	}
	if c.Card.MemoryGiB <= 0 {
		return fmt.Errorf("card.memoryGiB: must be > 0, got %g", c.Card.MemoryGiB)
	}
	if c.Card.HeadroomPercent == 0 {
		c.Card.HeadroomPercent = 5
	}
	if c.Card.HeadroomPercent < 0 || c.Card.HeadroomPercent >= 100 {
		return fmt.Errorf("card.headroomPercent: must be in [0, 100), got %g", c.Card.HeadroomPercent)
	}
	if len(c.Models) == 0 {
		return fmt.Errorf("models: at least one model is required")
	}
	if c.DurationSeconds < 0 {
		return fmt.Errorf("durationSeconds: must be ≥ 0, got %g", c.DurationSeconds)
	}
	if c.WarmupSeconds < 0 || c.DurationSeconds > 0 && c.WarmupSeconds >= c.DurationSeconds {
		return fmt.Errorf("warmupSeconds: must be ≥ 0 and less than durationSeconds, got %g", c.WarmupSeconds)
	}
	seen := map[string]bool{}
	var reserved float64
	var holders []string
	for i := range c.Models {
		m := &c.Models[i]
		f := fmt.Sprintf("models[%d]", i)
		if m.Name == "" {
			return fmt.Errorf("%s.name: must not be empty", f)
		}
		f = fmt.Sprintf("models[%d] (%s)", i, m.Name)
		if seen[m.Name] {
			return fmt.Errorf("%s.name: duplicate model", f)
		}
		seen[m.Name] = true
		// A simulated model defaults to interactive and onDemand (the
		// config help says so), not to a descriptor's standard and
		// pinned: the simulator studies a card that swaps models.
		m.class = queue.Interactive
		if strings.TrimSpace(m.Class) != "" {
			c, ok := class.Parse(m.Class)
			if !ok {
				return fmt.Errorf("%s.class: want interactive, standard or background, got %q", f, m.Class)
			}
			m.class = c
		}
		m.residency = residency.OnDemand
		if strings.TrimSpace(m.Residency) != "" {
			r, ok := cardfit.ParseResidency(m.Residency)
			if !ok {
				return fmt.Errorf("%s.residency: want pinned, warm or onDemand, got %q", f, m.Residency)
			}
			m.residency = residency.Residency(r)
		}
		if m.MemoryGiB <= 0 {
			return fmt.Errorf("%s.memoryGiB: must be > 0, got %g", f, m.MemoryGiB)
		}
		if m.PeakGiB == 0 {
			m.PeakGiB = m.MemoryGiB
		}
		if m.PeakGiB < m.MemoryGiB {
			return fmt.Errorf("%s.peakGiB: must be ≥ memoryGiB (%g), got %g", f, m.MemoryGiB, m.PeakGiB)
		}
		if m.ResidualGiB == 0 {
			m.ResidualGiB = m.MemoryGiB * 0.05
		}
		if m.ResidualGiB < 0 || m.ResidualGiB > m.MemoryGiB {
			return fmt.Errorf("%s.residualGiB: must be in [0, memoryGiB], got %g", f, m.ResidualGiB)
		}
		if m.CanSleep == nil {
			t := true
			m.CanSleep = &t
		}
		for name, v := range map[string]float64{"loadSeconds": m.LoadSeconds, "wakeSeconds": m.WakeSeconds,
			"sleepSeconds": m.SleepSeconds, "stopSeconds": m.StopSeconds, "prefillTokensPerSecond": m.PrefillTokensPerSecond,
			"keepAliveSeconds": m.KeepAliveSeconds, "sloTTFTSeconds": m.SLOTTFTSeconds, "sloTPOTSeconds": m.SLOTPOTSeconds,
			"computePercent": m.ComputePercent} {
			if v < 0 {
				return fmt.Errorf("%s.%s: must be ≥ 0, got %g", f, name, v)
			}
		}
		if m.TokensPerSecond <= 0 {
			return fmt.Errorf("%s.tokensPerSecond: must be > 0, got %g", f, m.TokensPerSecond)
		}
		if m.LoadSeconds == 0 {
			return fmt.Errorf("%s.loadSeconds: must be > 0", f)
		}
		if m.WakeSeconds == 0 {
			m.WakeSeconds = m.LoadSeconds / 10
		}
		if m.SleepSeconds == 0 {
			m.SleepSeconds = 1
		}
		if m.StopSeconds == 0 {
			m.StopSeconds = 1
		}
		if m.BatchSlowdown == nil {
			a := 0.03
			m.BatchSlowdown = &a
		}
		if *m.BatchSlowdown < 0 {
			return fmt.Errorf("%s.batchSlowdown: must be ≥ 0, got %g", f, *m.BatchSlowdown)
		}
		if m.ComputePercent == 0 {
			m.ComputePercent = 100
		}
		if m.MaxInFlight == 0 {
			m.MaxInFlight = 16
		}
		if m.MaxInFlight < 0 || m.KVTokens < 0 {
			return fmt.Errorf("%s: maxInFlight and kvTokens must be ≥ 0", f)
		}
		if m.KeepAliveSeconds == 0 {
			m.KeepAliveSeconds = 300
		}
		names := map[string]bool{}
		for j, a := range m.Adapters {
			if a == "" || strings.Contains(a, ":") {
				return fmt.Errorf("%s.adapters[%d]: want a non-empty name without ':', got %q", f, j, a)
			}
			if names[a] {
				return fmt.Errorf("%s.adapters[%d]: duplicate adapter %q", f, j, a)
			}
			names[a] = true
		}
		if m.AdapterLoadSeconds < 0 || m.MaxAdapters < 0 {
			return fmt.Errorf("%s: adapterLoadSeconds and maxAdapters must be ≥ 0", f)
		}
		if m.AdapterLoadSeconds == 0 {
			m.AdapterLoadSeconds = 0.2
		}
		if m.MaxAdapters == 0 {
			m.MaxAdapters = 4
		}
		if m.residency == residency.Pinned || m.residency == residency.Warm {
			reserved += m.MemoryGiB
			holders = append(holders, fmt.Sprintf("%s (%s) %g", m.Name, strings.ToLower(m.residency.String()), m.MemoryGiB))
		}
		if m.PeakGiB > c.usableGiB() {
			return fmt.Errorf("%s.peakGiB: %g GiB does not fit the card's usable %.2f GiB", f, m.PeakGiB, c.usableGiB())
		}
	}
	// Reserved shares are promised whatever else runs (rule 11 counts them
	// against the card, docs/residency.md): together they must fit.
	if reserved > c.usableGiB() {
		return fmt.Errorf("models: the reserved shares (pinned and warm) need %.2f GiB, more than the card's usable %.2f GiB (memoryGiB %g less %g%% headroom): %s",
			reserved, c.usableGiB(), c.Card.MemoryGiB, c.Card.HeadroomPercent, strings.Join(holders, " + "))
	}
	tenants := map[string]bool{}
	for i := range c.Tenants {
		t := &c.Tenants[i]
		if t.Name == "" {
			return fmt.Errorf("tenants[%d].name: must not be empty", i)
		}
		if tenants[t.Name] {
			return fmt.Errorf("tenants[%d].name: duplicate tenant %q", i, t.Name)
		}
		tenants[t.Name] = true
		if t.Weight == 0 {
			t.Weight = 1
		}
		if t.Weight < 0 {
			return fmt.Errorf("tenants[%d] (%s).weight: must be > 0, got %g", i, t.Name, t.Weight)
		}
	}
	if len(c.Tenants) == 0 {
		c.Tenants = []TenantConfig{{Name: "default", Weight: 1}}
		tenants["default"] = true
	}
	checkTenants := func(f string, ts []string) error {
		for j, t := range ts {
			if !tenants[t] {
				return fmt.Errorf("%s.tenants[%d]: tenant %q is not in tenants", f, j, t)
			}
		}
		return nil
	}
	for i := range c.Traces {
		t := &c.Traces[i]
		f := fmt.Sprintf("traces[%d]", i)
		if t.File == "" {
			return fmt.Errorf("%s.file: must not be empty", f)
		}
		if _, err := filepath.Match(t.File, ""); err != nil {
			return fmt.Errorf("%s.file: bad pattern %q: %w", f, t.File, err)
		}
		if t.Model != "" && !seen[t.Model] {
			return fmt.Errorf("%s.model: model %q is not in models", f, t.Model)
		}
		if t.TimeScale == 0 {
			t.TimeScale = 1
		}
		if t.TokensPerImageStep == 0 {
			t.TokensPerImageStep = 1
		}
		if t.TokensPerImageStep < 0 {
			return fmt.Errorf("%s.tokensPerImageStep: must be > 0, got %g", f, t.TokensPerImageStep)
		}
		if t.OtherModel != "" && !seen[t.OtherModel] {
			return fmt.Errorf("%s.otherModel: model %q is not in models", f, t.OtherModel)
		}
		for ck, m := range t.Models {
			if !seen[m] {
				return fmt.Errorf("%s.models[%s]: model %q is not in models", f, ck, m)
			}
		}
		for j, a := range t.Adapters {
			if t.Model == "" || !slices.Contains(c.Models[c.model(t.Model)].Adapters, a) {
				return fmt.Errorf("%s.adapters[%d]: adapter %q is not in the adapters of the entry's model %q", f, j, a, t.Model)
			}
		}
		if t.AdapterPercent < 0 || t.AdapterPercent > 100 {
			return fmt.Errorf("%s.adapterPercent: must be in [0, 100], got %g", f, t.AdapterPercent)
		}
		if t.AdapterPercent == 0 {
			t.AdapterPercent = 100
		}
		if t.TimeScale < 0 || t.OffsetSeconds < 0 || t.MaxOutputTokens < 0 {
			return fmt.Errorf("%s: timeScale, offsetSeconds and maxOutputTokens must be ≥ 0", f)
		}
		if err := checkTenants(f, t.Tenants); err != nil {
			return err
		}
	}
	for i := range c.Synthetic {
		s := &c.Synthetic[i]
		f := fmt.Sprintf("synthetic[%d]", i)
		if !seen[s.Model] {
			return fmt.Errorf("%s.model: model %q is not in models", f, s.Model)
		}
		if (s.RatePerSecond > 0) == (s.Concurrency > 0) {
			return fmt.Errorf("%s: set exactly one of ratePerSecond (open loop) and concurrency (closed loop)", f)
		}
		if s.RatePerSecond < 0 || s.Concurrency < 0 || s.PromptTokens < 0 || s.OutputTokens < 0 || s.OnSeconds < 0 || s.OffSeconds < 0 {
			return fmt.Errorf("%s: rates, token counts and on/off seconds must be ≥ 0", f)
		}
		if (s.OnSeconds > 0) != (s.OffSeconds > 0) {
			return fmt.Errorf("%s: onSeconds and offSeconds go together", f)
		}
		if err := checkTenants(f, s.Tenants); err != nil {
			return err
		}
	}
	if c.Ollama.MaxLoaded == 0 {
		c.Ollama.MaxLoaded = 3
	}
	if c.Ollama.NumParallel == 0 {
		c.Ollama.NumParallel = 1
	}
	if c.Ollama.MaxQueue == 0 {
		c.Ollama.MaxQueue = 512
	}
	if c.LlamaSwap.ConcurrencyLimit == 0 {
		c.LlamaSwap.ConcurrencyLimit = 10
	}
	if c.Ollama.MaxLoaded < 0 || c.Ollama.NumParallel < 0 || c.Ollama.MaxQueue < 0 || c.LlamaSwap.ConcurrencyLimit < 0 {
		return fmt.Errorf("ollama and llamaswap settings must be ≥ 0")
	}
	return nil
}

// DefaultTraces returns the traces entries' paths (relative to the config
// file) that exist, and those that do not.
func (c *Config) DefaultTraces() (found, missing []string) {
	for _, t := range c.Traces {
		if t.Path == "" {
			continue
		}
		p := t.Path
		if !filepath.IsAbs(p) {
			p = filepath.Join(filepath.Dir(c.path), p)
		}
		if _, err := os.Stat(p); err == nil {
			found = append(found, p)
		} else {
			missing = append(missing, p)
		}
	}
	return found, missing
}

func (c *Config) usableGiB() float64 { return c.Card.MemoryGiB * (1 - c.Card.HeadroomPercent/100) }

func (c *Config) usableBytes() int64 { return int64(c.usableGiB() * gib) }

func (c *Config) model(name string) int {
	for i := range c.Models {
		if c.Models[i].Name == name {
			return i
		}
	}
	return -1
}

// modelRef resolves "model" or "model:adapter" (docs/gateway.md) to the model's
// index and the adapter's number (its index + 1; 0 for the base model).
func (c *Config) modelRef(ref string) (model, adapter int, err error) {
	name, ad, hasAdapter := strings.Cut(ref, ":")
	model = c.model(name)
	if model < 0 {
		return -1, 0, fmt.Errorf("%q is not in config %s", name, c.path)
	}
	if !hasAdapter {
		return model, 0, nil
	}
	i := slices.Index(c.Models[model].Adapters, ad)
	if i < 0 {
		return -1, 0, fmt.Errorf("adapter %q is not in config %s's models[%d] (%s).adapters", ad, c.path, model, name)
	}
	return model, i + 1, nil
}

func bytesOf(g float64) int64 { return int64(g * gib) }

func secs(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
