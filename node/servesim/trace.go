package servesim

import (
	"bufio"
	"bytes"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Arrival is one request of a trace: when it arrives (seconds from the
// start of the run), for which model and tenant, and its token lengths.
type Arrival struct {
	Time         float64
	Model        int
	Tenant       string
	PromptTokens int
	OutputTokens int
	// Adapter is the LoRA adapter asked for: its index in the model's
	// adapters + 1, or 0 for the base model.
	Adapter int
	// order breaks ties between equal times: file, then line.
	order int
	// lag is how long before Time the request was sent: a replay of a live
	// run (replay.go) delivers each request its measured overhead after
	// the client sent it, and its TTFT counts from the send.
	lag float64
	// back is the measured time from the engine's first token to the
	// client's (a replayed live request timed in-band), added to its TTFT.
	back float64
	// aside: a background request beside the model's own traffic
	// (Config.Beside), run but not measured.
	aside bool
}

// jsonlRecord is gpuplane's trace format, one JSON object a line:
//
//	{"time": 1.25, "model": "chat", "tenant": "alice", "prompt_tokens": 812, "output_tokens": 256}
//	{"time": 1.5, "model": "chat:sql", "prompt_tokens": 90, "output_tokens": 40}
//
// time is seconds from the trace's start, non-decreasing; model is a
// model of the config, or "model:adapter" for one of its adapters; tenant
// is optional (drawn from the mapping's tenants when absent). Unknown
// fields are errors.
type jsonlRecord struct {
	Time         *float64 `json:"time"`
	Model        string   `json:"model"`
	Tenant       string   `json:"tenant"`
	PromptTokens *int     `json:"prompt_tokens"`
	OutputTokens *int     `json:"output_tokens"`
}

// azureColumns is the Azure LLM inference trace 2023/2024 header.
var azureColumns = []string{"TIMESTAMP", "ContextTokens", "GeneratedTokens"}

// azureTime is the Azure trace's timestamp (100 ns resolution).
const azureTime = "2006-01-02 15:04:05.999999999"

// ReadTraces reads the trace files with the config's mapping, draws tenants
// from the seed, and returns the arrivals sorted by time. Errors name the
// file, the line and the field.
func ReadTraces(cfg *Config, paths []string, seed uint64) ([]Arrival, error) {
	var (
		all []Arrival
		// Azure files of one day share a clock: each is shifted by its
		// start's distance from the earliest start, so conv and code
		// requests keep their real interleaving.
		azureStart []time.Time
		azureFirst = -1
		scales     []span
	)
	for fi, p := range paths {
		mp, err := cfg.mapping(p)
		if err != nil {
			return nil, err
		}
		rng := rand.New(rand.NewPCG(seed, uint64(fi)+1))
		var (
			arr   []Arrival
			start time.Time
		)
		switch {
		case strings.HasSuffix(p, ".csv") && isGenTD(p):
			arr, err = readGenTD(cfg, p, mp)
		case strings.HasSuffix(p, ".csv"):
			arr, start, err = readAzure(cfg, p, mp, rng)
			if len(arr) > 0 {
				azureStart = append(azureStart, start)
				if azureFirst < 0 || start.Before(azureStart[azureFirst]) {
					azureFirst = len(azureStart) - 1
				}
			}
		case strings.HasSuffix(p, ".jsonl"):
			arr, err = readJSONL(cfg, p, mp, rng)
		default:
			err = fmt.Errorf("trace %s: unknown format: want .csv (Azure LLM or GenTD26 request trace) or .jsonl (gpuplane)", p)
		}
		if err != nil {
			return nil, err
		}
		for i := range arr {
			arr[i].order = fi<<32 | i
		}
		all = append(all, arr...)
		scales = append(scales, span{len(all) - len(arr), len(all), mp, start})
	}
	for _, sp := range scales {
		shift := 0.0
		if !sp.start.IsZero() {
			shift = sp.start.Sub(azureStart[azureFirst]).Seconds()
		}
		for i := sp.from; i < sp.to; i++ {
			all[i].Time = (all[i].Time+shift)*sp.mp.TimeScale + sp.mp.OffsetSeconds
		}
	}
	sortArrivals(all)
	return all, nil
}

// sortArrivals orders arrivals by time, then file and line.
func sortArrivals(a []Arrival) {
	slices.SortStableFunc(a, func(x, y Arrival) int {
		if x.Time != y.Time {
			if x.Time < y.Time {
				return -1
			}
			return 1
		}
		return x.order - y.order
	})
}

// span is one file's arrivals in the combined list.
type span struct {
	from, to int
	mp       TraceMapping
	start    time.Time
}

// mapping finds the traces entry for a file; JSONL files need none.
func (c *Config) mapping(path string) (TraceMapping, error) {
	base := filepath.Base(path)
	for _, t := range c.Traces {
		if ok, _ := filepath.Match(t.File, base); ok {
			return t, nil
		}
	}
	if strings.HasSuffix(path, ".jsonl") {
		return TraceMapping{TimeScale: 1}, nil
	}
	return TraceMapping{}, fmt.Errorf("trace %s: no traces entry of config %s matches %q: add one that names its model", path, c.path, base)
}

func pickTenant(c *Config, ts []string, rng *rand.Rand) string {
	if len(ts) == 0 {
		return c.Tenants[0].Name
	}
	return ts[rng.IntN(len(ts))]
}

// readAzure reads an Azure LLM trace; times are seconds from its first
// row, whose time it also returns.
func readAzure(cfg *Config, path string, mp TraceMapping, rng *rand.Rand) (out []Arrival, start time.Time, err error) {
	if mp.Model == "" {
		return nil, start, fmt.Errorf("trace %s: the traces entry %q has no model (the Azure trace names none)", path, mp.File)
	}
	model := cfg.model(mp.Model)
	f, err := os.Open(path)
	if err != nil {
		return nil, start, err
	}
	defer f.Close()
	r := csv.NewReader(bufio.NewReaderSize(f, 1<<16))
	r.ReuseRecord = true
	head, err := r.Read()
	if err != nil {
		return nil, start, fmt.Errorf("trace %s: line 1: header: %w", path, err)
	}
	if len(head) > 0 {
		head[0] = strings.TrimPrefix(head[0], "\ufeff")
	}
	for i, h := range head {
		if i >= len(azureColumns) || h != azureColumns[i] {
			return nil, start, fmt.Errorf("trace %s: line 1: column %d %q: unknown column, want %s", path, i+1, h, strings.Join(azureColumns, ","))
		}
	}
	if len(head) != len(azureColumns) {
		return nil, start, fmt.Errorf("trace %s: line 1: header has %d columns, want %s", path, len(head), strings.Join(azureColumns, ","))
	}
	var prev float64
	for line := 2; ; line++ {
		rec, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, start, fmt.Errorf("trace %s: line %d: %w", path, line, err)
		}
		ts, err := time.Parse(azureTime, strings.TrimSpace(rec[0]))
		if err != nil {
			return nil, start, fmt.Errorf("trace %s: line %d: TIMESTAMP: %w", path, line, err)
		}
		if line == 2 {
			start = ts
		}
		t := ts.Sub(start).Seconds()
		if t < 0 || t < prev {
			return nil, start, fmt.Errorf("trace %s: line %d: TIMESTAMP: %s is before the previous row's: the trace must be sorted by time", path, line, rec[0])
		}
		prev = t
		in, err := strconv.Atoi(strings.TrimSpace(rec[1]))
		if err != nil || in < 0 {
			return nil, start, fmt.Errorf("trace %s: line %d: ContextTokens: want a non-negative integer, got %q", path, line, rec[1])
		}
		outTok, err := strconv.Atoi(strings.TrimSpace(rec[2]))
		if err != nil || outTok < 0 {
			return nil, start, fmt.Errorf("trace %s: line %d: GeneratedTokens: want a non-negative integer, got %q", path, line, rec[2])
		}
		if mp.MaxOutputTokens > 0 {
			outTok = min(outTok, mp.MaxOutputTokens)
		}
		a := Arrival{Time: t, Model: model, Tenant: pickTenant(cfg, mp.Tenants, rng), PromptTokens: in, OutputTokens: outTok}
		if len(mp.Adapters) > 0 && rng.Float64()*100 < mp.AdapterPercent {
			a.Adapter = 1 + slices.Index(cfg.Models[model].Adapters, mp.Adapters[rng.IntN(len(mp.Adapters))])
		}
		out = append(out, a)
	}
	return out, start, nil
}

func readJSONL(cfg *Config, path string, mp TraceMapping, rng *rand.Rand) ([]Arrival, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	tenants := map[string]bool{}
	for _, t := range cfg.Tenants {
		tenants[t.Name] = true
	}
	var (
		out  []Arrival
		prev float64
	)
	for line := 1; sc.Scan(); line++ {
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		var rec jsonlRecord
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&rec); err != nil {
			return nil, fmt.Errorf("trace %s: line %d: %w", path, line, err)
		}
		switch {
		case rec.Time == nil:
			return nil, fmt.Errorf("trace %s: line %d: time: required", path, line)
		case *rec.Time < 0 || math.IsNaN(*rec.Time):
			return nil, fmt.Errorf("trace %s: line %d: time: must be ≥ 0, got %g", path, line, *rec.Time)
		case *rec.Time < prev:
			return nil, fmt.Errorf("trace %s: line %d: time: %g is before the previous line's %g: the trace must be sorted by time", path, line, *rec.Time, prev)
		case rec.PromptTokens == nil || *rec.PromptTokens < 0:
			return nil, fmt.Errorf("trace %s: line %d: prompt_tokens: required, ≥ 0", path, line)
		case rec.OutputTokens == nil || *rec.OutputTokens < 0:
			return nil, fmt.Errorf("trace %s: line %d: output_tokens: required, ≥ 0", path, line)
		}
		prev = *rec.Time
		name := rec.Model
		if mp.Model != "" {
			name = mp.Model
		}
		m, adapter, err := cfg.modelRef(name)
		if err != nil {
			return nil, fmt.Errorf("trace %s: line %d: model: %w", path, line, err)
		}
		tenant := rec.Tenant
		if tenant == "" {
			tenant = pickTenant(cfg, mp.Tenants, rng)
		} else if !tenants[tenant] {
			return nil, fmt.Errorf("trace %s: line %d: tenant: %q is not in config %s", path, line, tenant, cfg.path)
		}
		o := *rec.OutputTokens
		if mp.MaxOutputTokens > 0 {
			o = min(o, mp.MaxOutputTokens)
		}
		out = append(out, Arrival{Time: *rec.Time, Model: m, Adapter: adapter, Tenant: tenant, PromptTokens: *rec.PromptTokens, OutputTokens: o})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("trace %s: %w", path, err)
	}
	return out, nil
}

// syntheticOpen draws the open-loop synthetic streams' arrivals up to end.
func syntheticOpen(cfg *Config, seed uint64, end float64) []Arrival {
	var out []Arrival
	for i, s := range cfg.Synthetic {
		if s.RatePerSecond <= 0 {
			continue
		}
		rng := rand.New(rand.NewPCG(seed, 0x5eed0000+uint64(i)))
		m := cfg.model(s.Model)
		for t := rng.ExpFloat64() / s.RatePerSecond; t < end; t += rng.ExpFloat64() / s.RatePerSecond {
			if s.OnSeconds > 0 {
				period := s.OnSeconds + s.OffSeconds
				if math.Mod(t, period) >= s.OnSeconds {
					continue
				}
			}
			out = append(out, Arrival{Time: t, Model: m, Tenant: pickTenant(cfg, s.Tenants, rng),
				PromptTokens: around(rng, s.PromptTokens), OutputTokens: around(rng, s.OutputTokens), order: 1<<40 + i<<24})
		}
	}
	return out
}

// around draws uniformly in [mean/2, 3·mean/2].
func around(rng *rand.Rand, mean int) int {
	if mean <= 1 {
		return mean
	}
	return mean/2 + rng.IntN(mean+1)
}

// genTDColumns is the GenTD26 request trace's header
// (lora_request_trace_*.csv).
var genTDColumns = []string{"gmt_create", "predict_type", "predict_status", "exec_time_seconds", "groupId", "prompt_length",
	"negative_prompt_length", "num_images_per_prompt", "num_inference_steps", "checkpoint_model_version_id", "num_lora"}

// isGenTD reports whether a CSV file's header starts like GenTD26's.
func isGenTD(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	b := make([]byte, 64)
	n, _ := io.ReadFull(f, b)
	return strings.HasPrefix(strings.TrimPrefix(string(b[:n]), "\ufeff"), "gmt_create,")
}

// readGenTD reads a GenTD26 request trace. Rows without a checkpoint or
// lengths (requests still pending when the trace was cut) are skipped.
func readGenTD(cfg *Config, path string, mp TraceMapping) ([]Arrival, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r := csv.NewReader(bufio.NewReaderSize(f, 1<<16))
	r.ReuseRecord = true
	head, err := r.Read()
	if err != nil {
		return nil, fmt.Errorf("trace %s: line 1: header: %w", path, err)
	}
	head[0] = strings.TrimPrefix(head[0], "\ufeff")
	for i, h := range head {
		if i >= len(genTDColumns) || h != genTDColumns[i] {
			return nil, fmt.Errorf("trace %s: line 1: column %d %q: unknown column, want %s", path, i+1, h, strings.Join(genTDColumns, ","))
		}
	}
	if len(head) != len(genTDColumns) {
		return nil, fmt.Errorf("trace %s: line 1: header has %d columns, want %s", path, len(head), strings.Join(genTDColumns, ","))
	}
	tenants := mp.Tenants
	if len(tenants) == 0 {
		for _, t := range cfg.Tenants {
			tenants = append(tenants, t.Name)
		}
	}
	num := func(line int, rec []string, col int) (float64, bool, error) {
		v := strings.TrimSpace(rec[col])
		if v == "" {
			return 0, false, nil
		}
		x, err := strconv.ParseFloat(v, 64)
		if err != nil || x < 0 || math.IsNaN(x) {
			return 0, false, fmt.Errorf("trace %s: line %d: %s: want a non-negative number, got %q", path, line, genTDColumns[col], v)
		}
		return x, true, nil
	}
	var (
		out   []Arrival
		start time.Time
		prev  float64
	)
	for line := 2; ; line++ {
		rec, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("trace %s: line %d: %w", path, line, err)
		}
		ts, err := time.Parse(time.DateTime, strings.TrimSpace(rec[0]))
		if err != nil {
			return nil, fmt.Errorf("trace %s: line %d: gmt_create: %w", path, line, err)
		}
		if start.IsZero() {
			start = ts
		}
		t := ts.Sub(start).Seconds()
		if t < prev {
			return nil, fmt.Errorf("trace %s: line %d: gmt_create: %s is before the previous row's: the trace must be sorted by time", path, line, rec[0])
		}
		prev = t
		ck := strings.TrimSpace(rec[9])
		model, ok := mp.Models[ck]
		if !ok {
			model = mp.OtherModel
		}
		if ck == "" || model == "" {
			continue
		}
		var v [4]float64
		complete := true
		for i, col := range []int{5, 6, 7, 8} {
			x, ok, err := num(line, rec, col)
			if err != nil {
				return nil, err
			}
			v[i] = x
			complete = complete && (ok || col == 6)
		}
		if !complete {
			continue
		}
		loras, _, err := num(line, rec, 10)
		if err != nil {
			return nil, err
		}
		h := fnv.New32a()
		h.Write([]byte(rec[4]))
		group := h.Sum32()
		mi := cfg.model(model)
		// A request with LoRAs uses its tenant's adapter of the model: the
		// trace does not say which, so a group keeps to one.
		adapter := 0
		if n := len(cfg.Models[mi].Adapters); loras > 0 && n > 0 {
			adapter = 1 + int(group/7%uint32(n))
		}
		out = append(out, Arrival{Time: t, Model: mi, Adapter: adapter, Tenant: tenants[int(group%uint32(len(tenants)))],
			PromptTokens: int(v[0] + v[1]), OutputTokens: int(v[2] * v[3] * mp.TokensPerImageStep)})
		if mp.MaxOutputTokens > 0 {
			out[len(out)-1].OutputTokens = min(out[len(out)-1].OutputTokens, mp.MaxOutputTokens)
		}
	}
	return out, nil
}
