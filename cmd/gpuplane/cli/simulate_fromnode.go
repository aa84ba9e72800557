package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/gpuplane/gpuplane/fsm"
	"github.com/gpuplane/gpuplane/fsm/descriptor"
	"github.com/gpuplane/gpuplane/internal/engines"
	"github.com/gpuplane/gpuplane/node/servesim"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// `gpuplane simulate serve --from-node`: the serving simulator over the
// traffic one card actually served (its node's request record,
// ResidencyService.ListRequests), with the card's own deployments and the
// profiles its node learned; then what-ifs on the same traffic.

// fromNode is what --from-node asks.
type fromNode struct {
	node       string
	card       int // -1: the only card with records
	since      time.Duration
	cardMemory string
	add        []string
	remove     []string
	set        []string
	policy     string
	seed       uint64
	// noBestEffort replays without the protected set (--best-effort=false).
	noBestEffort bool
	// saveRecord: also write what was read to this file; record: replay
	// such a file instead of asking a node.
	saveRecord string
	record     string
}

// whatIf reports whether any what-if is asked.
func (f fromNode) whatIf() bool {
	return f.cardMemory != "" || len(f.add) > 0 || len(f.remove) > 0 || len(f.set) > 0
}

// replayModel is one model's SLO attainment as served, as simulated and
// under the what-if.
type replayModel struct {
	Model     string   `json:"model"`
	Class     string   `json:"class"`
	Offered   int      `json:"offered"`
	Served    float64  `json:"servedSLO"`
	Simulated float64  `json:"simulatedSLO"`
	WhatIf    *float64 `json:"whatIfSLO,omitempty"`
}

// replayResult is what --from-node prints.
type replayResult struct {
	Node     string        `json:"node"`
	Card     uint32        `json:"card"`
	Requests int           `json:"requests"`
	Seconds  float64       `json:"seconds"`
	Policy   string        `json:"policy"`
	WhatIf   []string      `json:"whatIf,omitempty"`
	Models   []replayModel `json:"models"`
	// ColdLoads and Evictions on the card as simulated, and under the
	// what-if.
	ColdLoads       int  `json:"coldLoads"`
	Evictions       int  `json:"evictions"`
	WhatIfColdLoads *int `json:"whatIfColdLoads,omitempty"`
	WhatIfEvictions *int `json:"whatIfEvictions,omitempty"`
	// BestEffort are the models under 90% of their requests within SLO
	// under the what-if (or as simulated, without one).
	BestEffort []string `json:"bestEffort"`
	// Chosen are the models the replay's controller serves best-effort
	// at the end of the replay (its protected set's complement), each
	// with why; Live those the node's controller serves best-effort now
	// (its plan), for the same card. SameChoice: the two name the same
	// models.
	Chosen     []string `json:"chosenBestEffort"`
	Live       []string `json:"liveBestEffort"`
	SameChoice bool     `json:"sameChoice"`
}

// runFromNode checks the --from-node flags and runs the replay.
func (g *globals) runFromNode(cmd *cobra.Command, f fromNode, configPath, policy string, seed uint64) error {
	switch {
	case f.node == "" && f.record == "":
		return usageErrorf(cmd, "--card, --since, --card-memory, --add, --remove, --set and --save-record need --from-node (or --record)")
	case f.node != "" && f.record != "":
		return usageErrorf(cmd, "--record replays a saved record instead of --from-node: give one of them")
	case f.record != "" && (f.card >= 0 || f.since > 0 || f.saveRecord != ""):
		return usageErrorf(cmd, "--card, --since and --save-record read a node: give them with --from-node, not --record")
	case configPath != "":
		return usageErrorf(cmd, "--from-node and --record replace --config: give one of them")
	case strings.EqualFold(policy, policyAll):
		return usageErrorf(cmd, "--from-node replays under one policy: give --policy gpuplane (the default) or one baseline")
	case f.card < -1:
		return usageErrorf(cmd, "invalid --card %d: must be ≥ 0", f.card)
	case f.since < 0:
		return usageErrorf(cmd, "invalid --since %s: must be > 0", f.since)
	}
	p, err := servesim.ParsePolicy(policy)
	if err != nil {
		return usageErrorf(cmd, "invalid --policy %q: want %s", policy, strings.Join(servesim.Policies, ", "))
	}
	f.policy, f.seed = p, seed
	var api *apiClients
	if f.record == "" {
		if api, err = g.api(cmd); err != nil {
			return err
		}
	}
	return g.simulateFromNode(ctx(cmd), api, f)
}

func (g *globals) simulateFromNode(c context.Context, api *apiClients, f fromNode) error {
	var rec *cardRecord
	var err error
	if f.record != "" {
		rec, err = loadCardRecord(f.record)
	} else {
		rec, err = fetchCardRecord(c, api, f)
	}
	if err != nil {
		return err
	}
	if f.saveRecord != "" {
		if err := rec.save(f.saveRecord); err != nil {
			return err
		}
	}
	out, err := replayRecord(rec, f)
	if err != nil {
		return err
	}
	return g.printValue(out, func(w io.Writer) error { return writeReplay(w, out) })
}

// cardRecord is what a replay reads from a node: one card's request record,
// its memory, the deployments on it (their specs and the shares their
// replicas hold) and the profiles the node learned. --save-record writes
// it to a file and --record replays such a file without asking a node.
type cardRecord struct {
	Node      string
	Card      uint32
	MemoryMiB uint64
	// Shares is each deployment's memory on the card in MiB (0: its spec's).
	Shares   map[string]uint64
	Specs    map[string]*pb.ModelSpec
	Profiles []*pb.ResidencyProfile
	Requests []*pb.RequestRecord
	// LiveBestEffort is why, as the node's plan gave it when it was read,
	// for each replica its controller served best-effort on the card
	// (the plan's best_effort: "MODEL/N: needs …").
	LiveBestEffort []string
}

// fetchCardRecord reads f's card's record and deployments from its node.
func fetchCardRecord(c context.Context, api *apiClients, f fromNode) (*cardRecord, error) {
	req := &pb.ListRequestsRequest{Node: f.node}
	if f.card >= 0 {
		card := uint32(f.card)
		req.Card = &card
	}
	if f.since > 0 {
		req.Since = timestamppb.New(time.Now().Add(-f.since))
	}
	resp, err := api.Residency.ListRequests(c, connect.NewRequest(req))
	if err != nil {
		return nil, err
	}
	recs := resp.Msg.GetRequests()
	cards := map[uint32]bool{}
	for _, r := range recs {
		cards[r.GetCard()] = true
	}
	switch {
	case len(recs) == 0:
		return nil, fmt.Errorf("simulate serve --from-node %s: no requests recorded on that node%s", f.node, sinceText(f.since))
	case len(cards) > 1:
		var cs []string
		for _, k := range slices.Sorted(mapsKeys(cards)) {
			cs = append(cs, strconv.Itoa(int(k)))
		}
		return nil, fmt.Errorf("simulate serve --from-node %s: requests recorded on cards %s: give --card", f.node, strings.Join(cs, ", "))
	}
	rec, err := fetchCard(c, api, f.node, recs[0].GetCard(), recs)
	if err != nil {
		return nil, fmt.Errorf("simulate serve --from-node %s: %w", f.node, err)
	}
	return rec, nil
}

// replayRecord replays rec through the simulator, and under f's what-if.
func replayRecord(rec *cardRecord, f fromNode) (replayResult, error) {
	recs := rec.Requests
	cfg := cardConfig(rec)
	dir, err := os.MkdirTemp("", "gpuplane-replay-")
	if err != nil {
		return replayResult{}, err
	}
	defer os.RemoveAll(dir)
	trace, seconds, err := writeRecordTrace(dir, recs, cfg)
	if err != nil {
		return replayResult{}, err
	}
	cfg.DurationSeconds = seconds + 1
	run := func(cfg *servesim.Config) (servesim.Result, error) {
		b, err := json.Marshal(cfg)
		if err != nil {
			return servesim.Result{}, err
		}
		parsed, err := servesim.ParseConfig(filepath.Join(dir, "card.yaml"), b)
		if err != nil {
			return servesim.Result{}, err
		}
		// As the agent runs: its controller learns the figures (no
		// priors) and protects a set unless told not to.
		parsed.ExactPriors, parsed.NoBestEffort = false, f.noBestEffort
		w, err := servesim.NewWorkload(parsed, []string{trace}, f.seed)
		if err != nil {
			return servesim.Result{}, err
		}
		return servesim.Run(parsed, w, f.policy, f.seed)
	}
	base, err := run(cfg)
	if err != nil {
		return replayResult{}, fmt.Errorf("simulate serve --from-node %s: %w", rec.Node, err)
	}
	out := replayResult{Node: rec.Node, Card: rec.Card, Requests: len(recs), Seconds: seconds, Policy: f.policy,
		ColdLoads: base.ColdLoads, Evictions: base.Evictions}
	served := servedSLO(recs, cfg)
	for _, m := range base.Models {
		if m.Requests == 0 {
			continue
		}
		out.Models = append(out.Models, replayModel{Model: m.Model, Class: m.Class, Offered: m.Requests, Served: served[m.Model], Simulated: m.SLO / 100})
	}
	final := base
	if f.whatIf() {
		wcfg, what, err := applyWhatIf(cfg, f)
		if err != nil {
			return replayResult{}, err
		}
		out.WhatIf = what
		if final, err = run(wcfg); err != nil {
			return replayResult{}, fmt.Errorf("simulate serve --from-node %s: what-if: %w", rec.Node, err)
		}
		out.WhatIfColdLoads, out.WhatIfEvictions = &final.ColdLoads, &final.Evictions
		for i := range out.Models {
			for _, m := range final.Models {
				if m.Model == out.Models[i].Model {
					v := m.SLO / 100
					out.Models[i].WhatIf = &v
				}
			}
		}
	}
	for _, m := range final.Models {
		if m.Requests > 0 && m.SLO < 90 {
			out.BestEffort = append(out.BestEffort, m.Model)
		}
	}
	// The replay's choice against the node's own (without a what-if:
	// the same card, the same traffic).
	var chosen, live []string
	for _, why := range base.BestEffort {
		m, _, _ := strings.Cut(why, ":")
		chosen = append(chosen, m)
		out.Chosen = append(out.Chosen, why)
	}
	for _, why := range rec.LiveBestEffort {
		m, _, _ := strings.Cut(why, ":")
		name, _, _ := strings.Cut(m, "/")
		live = append(live, name)
		out.Live = append(out.Live, why)
	}
	slices.Sort(chosen)
	slices.Sort(live)
	out.SameChoice = slices.Equal(chosen, live)
	return out, nil
}

// savedRecord is a cardRecord as a file: the protos as protojson.
type savedRecord struct {
	Node      string                     `json:"node"`
	Card      uint32                     `json:"card"`
	MemoryMiB uint64                     `json:"memoryMiB"`
	Shares    map[string]uint64          `json:"sharesMiB"`
	Specs     map[string]json.RawMessage `json:"specs"`
	Profiles  []json.RawMessage          `json:"profiles"`
	Requests  []json.RawMessage          `json:"requests"`
	// LiveBestEffort: cardRecord.LiveBestEffort.
	LiveBestEffort []string `json:"liveBestEffort,omitempty"`
}

func (r *cardRecord) save(path string) error {
	s := savedRecord{Node: r.Node, Card: r.Card, MemoryMiB: r.MemoryMiB, Shares: r.Shares, Specs: map[string]json.RawMessage{}, LiveBestEffort: r.LiveBestEffort}
	var err error
	for name, spec := range r.Specs {
		if s.Specs[name], err = protojson.Marshal(spec); err != nil {
			return err
		}
	}
	for _, p := range r.Profiles {
		b, err := protojson.Marshal(p)
		if err != nil {
			return err
		}
		s.Profiles = append(s.Profiles, b)
	}
	for _, q := range r.Requests {
		b, err := protojson.Marshal(q)
		if err != nil {
			return err
		}
		s.Requests = append(s.Requests, b)
	}
	b, err := json.Marshal(s)
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("--save-record: %w", err)
	}
	return nil
}

func loadCardRecord(path string) (*cardRecord, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--record: %w", err)
	}
	var s savedRecord
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("--record %s: %w", path, err)
	}
	r := &cardRecord{Node: s.Node, Card: s.Card, MemoryMiB: s.MemoryMiB, Shares: s.Shares, Specs: map[string]*pb.ModelSpec{}, LiveBestEffort: s.LiveBestEffort}
	for name, raw := range s.Specs {
		spec := &pb.ModelSpec{}
		if err := protojson.Unmarshal(raw, spec); err != nil {
			return nil, fmt.Errorf("--record %s: specs.%s: %w", path, name, err)
		}
		r.Specs[name] = spec
	}
	for i, raw := range s.Profiles {
		p := &pb.ResidencyProfile{}
		if err := protojson.Unmarshal(raw, p); err != nil {
			return nil, fmt.Errorf("--record %s: profiles[%d]: %w", path, i, err)
		}
		r.Profiles = append(r.Profiles, p)
	}
	for i, raw := range s.Requests {
		q := &pb.RequestRecord{}
		if err := protojson.Unmarshal(raw, q); err != nil {
			return nil, fmt.Errorf("--record %s: requests[%d]: %w", path, i, err)
		}
		r.Requests = append(r.Requests, q)
	}
	switch {
	case len(r.Requests) == 0:
		return nil, fmt.Errorf("--record %s: requests: none recorded", path)
	case r.MemoryMiB == 0:
		return nil, fmt.Errorf("--record %s: memoryMiB must be > 0", path)
	}
	for _, q := range r.Requests {
		if _, ok := r.Specs[q.GetDeployment()]; !ok {
			return nil, fmt.Errorf("--record %s: specs: no spec for deployment %s, which has requests", path, q.GetDeployment())
		}
	}
	return r, nil
}

func sinceText(d time.Duration) string {
	if d <= 0 {
		return ""
	}
	return " in the last " + shortDuration(d)
}

func mapsKeys[K comparable, V any](m map[K]V) func(func(K) bool) {
	return func(yield func(K) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// fetchCard reads the card's memory, the deployments placed on it (and
// those the record names) with their specs and shares, and the profiles
// its node learned.
func fetchCard(c context.Context, api *apiClients, node string, card uint32, recs []*pb.RequestRecord) (*cardRecord, error) {
	n, err := api.Nodes.GetNode(c, connect.NewRequest(&pb.GetNodeRequest{Name: node}))
	if err != nil {
		return nil, err
	}
	rec := &cardRecord{Node: node, Card: card, Shares: map[string]uint64{}, Specs: map[string]*pb.ModelSpec{}, Requests: recs}
	for _, cd := range n.Msg.GetNode().GetCards() {
		if cd.GetIndex() == card {
			rec.MemoryMiB = cd.GetMemoryMib()
		}
	}
	if rec.MemoryMiB == 0 {
		return nil, fmt.Errorf("node %s has no card %d", node, card)
	}
	reps, err := api.Models.ListReplicas(c, connect.NewRequest(&pb.ListReplicasRequest{Node: node}))
	if err != nil {
		return nil, err
	}
	for _, r := range reps.Msg.GetReplicas() {
		if len(r.GetCards()) > 0 && r.GetCards()[0] == card {
			rec.Shares[r.GetModel()] = max(rec.Shares[r.GetModel()], r.GetMemoryMib())
		}
	}
	for _, r := range recs {
		if _, ok := rec.Shares[r.GetDeployment()]; !ok {
			rec.Shares[r.GetDeployment()] = 0
		}
	}
	profs, err := api.Residency.ListProfiles(c, connect.NewRequest(&pb.ListProfilesRequest{Node: node}))
	if err != nil {
		return nil, err
	}
	rec.Profiles = profs.Msg.GetProfiles()
	if p, err := api.Residency.GetPlan(c, connect.NewRequest(&pb.GetPlanRequest{Node: node})); err == nil {
		for _, cp := range p.Msg.GetCards() {
			if cp.GetNode() != node || cp.GetCard() != strconv.Itoa(int(card)) {
				continue
			}
			for _, e := range cp.GetEntries() {
				if e.GetBestEffort() != "" {
					rec.LiveBestEffort = append(rec.LiveBestEffort, e.GetBestEffort())
				}
			}
		}
	}
	for name := range rec.Shares {
		m, err := api.Models.GetModel(c, connect.NewRequest(&pb.GetModelRequest{Name: name}))
		if err != nil {
			return nil, fmt.Errorf("deployment %s: %w", name, err)
		}
		rec.Specs[name] = m.Msg.GetModel().GetSpec()
		if rec.Shares[name] == 0 {
			// No replica on the card now: the share one would take, as
			// the state machine computes it.
			rec.Shares[name] = perCard(m.Msg.GetModel())
		}
	}
	return rec, nil
}

// cardConfig is the simulator's card: its memory, its deployments with
// their classes, residencies, shares and targets, and what the node
// learned of each (load and wake times, footprint, tokens/s), as the
// controller knows them.
func cardConfig(rec *cardRecord) *servesim.Config {
	cfg := &servesim.Config{Card: servesim.CardConfig{Name: fmt.Sprintf("%s/%d", rec.Node, rec.Card), MemoryGiB: float64(rec.MemoryMiB) / 1024}}
	for _, name := range slices.Sorted(mapsKeys(rec.Specs)) {
		spec := rec.Specs[name]
		cfg.Models = append(cfg.Models, modelConfig(name, spec, rec.Shares[name], rec.Profiles))
	}
	tenants := map[string]bool{}
	for _, r := range rec.Requests {
		tenants[r.GetTenant()] = true
	}
	for _, t := range slices.Sorted(mapsKeys(tenants)) {
		cfg.Tenants = append(cfg.Tenants, servesim.TenantConfig{Name: t, Weight: 1})
	}
	return cfg
}

// perCard is the memory share of each card a replica of deployment m
// takes (its status's share per replica over its cards, rule 9).
func perCard(m *pb.ModelDeployment) uint64 {
	e := m.GetSpec().GetEngine()
	cards := uint64(max(e.GetTensorParallel(), 1)) * uint64(max(e.GetPipelineParallel(), 1))
	return m.GetStatus().GetMemoryPerReplicaMib() / cards
}

// gatewayMaxInFlight is the gateway's default cap on an engine's requests
// in flight (gateway.Options.MaxInFlight).
const gatewayMaxInFlight = 64

// simEngineSleepSeconds and simEngineStopSeconds are a sim engine's sleep
// (one HTTP call) and stop (its process's exit), as the node sees them.
const (
	simEngineSleepSeconds = 0.05
	simEngineStopSeconds  = 0.2
)

// modelConfig maps a deployment onto the simulator's model: the learned
// profile's figures where its node measured them, else the sim engine's
// own flags, else the simulator's defaults.
func modelConfig(name string, spec *pb.ModelSpec, shareMiB uint64, profs []*pb.ResidencyProfile) servesim.ModelConfig {
	mc := servesim.ModelConfig{
		Name: name, Class: fsm.PriorityName(spec.GetPriority()), Residency: fsm.ResidencyName(spec.GetResidency()),
		MemoryGiB: float64(shareMiB) / 1024, SLOTTFTSeconds: float64(spec.GetSlo().GetTtftMs()) / 1000,
	}
	args := spec.GetEngine().GetArgs()
	flag := func(name string) float64 {
		for i, a := range args {
			if a == name && i+1 < len(args) {
				v, _ := strconv.ParseFloat(args[i+1], 64)
				return v
			}
			if v, ok := strings.CutPrefix(a, name+"="); ok {
				f, _ := strconv.ParseFloat(v, 64)
				return f
			}
		}
		return 0
	}
	mc.TokensPerSecond = flag("--tokens-per-second")
	mc.LoadSeconds = flag("--load-seconds")
	// The batch the gateway sends the engine, as the agent sizes it: the
	// spec's cap, else vLLM's (or a sim's) --max-num-seqs, else the
	// gateway's default of 64; the simulator's own default of 16 would
	// hold back work the card ran at once.
	switch kind := spec.GetEngine().GetKind(); {
	case spec.GetEngine().GetMaxInFlight() > 0:
		mc.MaxInFlight = int(spec.GetEngine().GetMaxInFlight())
	case (kind == engines.VLLM || kind == engines.Sim) && flag("--max-num-seqs") > 0:
		mc.MaxInFlight = int(flag("--max-num-seqs"))
	default:
		mc.MaxInFlight = gatewayMaxInFlight
	}
	if spec.GetEngine().GetKind() == engines.Sim {
		// A sim engine slows its streams only by its --batch-slowdown,
		// sleeps at once (it copies nothing out) and stops as its process
		// exits: not the simulator's default second each, which would
		// hand a waiting model the card seconds later than the node did.
		a := flag("--batch-slowdown")
		mc.BatchSlowdown = &a
		mc.SleepSeconds, mc.StopSeconds = simEngineSleepSeconds, simEngineStopSeconds
		// Asleep it holds its --sleep-residual-mib, else its
		// --overhead-mib (none unless given), not the simulator's default
		// of 5 % of its footprint, which reads 0 as unset: at least 1 MiB.
		res := flag("--sleep-residual-mib")
		if res <= 0 {
			res = flag("--overhead-mib")
		}
		mc.ResidualGiB = max(res, 1) / 1024
	}
	for _, p := range profs {
		if p.GetModel() != spec.GetModel() || p.GetQuantization() != spec.GetEngine().GetQuantization() {
			continue
		}
		if p.GetLoads() > 0 && p.GetLoadMs() > 0 {
			mc.LoadSeconds = float64(p.GetLoadMs()) / 1000
		}
		if p.GetWakes() > 0 && p.GetWakeMs() > 0 {
			mc.WakeSeconds = float64(p.GetWakeMs()) / 1000
		}
		if p.GetTokensPerSecond() > 0 {
			mc.TokensPerSecond = p.GetTokensPerSecond()
		}
		if f := p.GetFootprintBytes(); f > 0 {
			mc.MemoryGiB = max(mc.MemoryGiB, float64(f)/(1<<30))
		}
	}
	if mc.TokensPerSecond <= 0 {
		mc.TokensPerSecond = 50
	}
	if mc.LoadSeconds <= 0 {
		mc.LoadSeconds = 1
	}
	return mc
}

// writeRecordTrace writes the record as gpuplane's JSONL trace: arrival
// times from the first request, each request's model (and adapter),
// tenant and lengths. A request that got no answer is offered with its
// model's mean output. It returns the file and the span in seconds.
func writeRecordTrace(dir string, recs []*pb.RequestRecord, cfg *servesim.Config) (string, float64, error) {
	mean := map[string][2]int64{}
	for _, r := range recs {
		if r.GetOutcome() == "served" {
			m := mean[r.GetDeployment()]
			mean[r.GetDeployment()] = [2]int64{m[0] + r.GetOutputTokens(), m[1] + 1}
		}
	}
	path := filepath.Join(dir, "record.jsonl")
	f, err := os.Create(path)
	if err != nil {
		return "", 0, err
	}
	bw := bufio.NewWriter(f)
	start := recs[0].GetArrived().AsTime()
	var span float64
	for _, r := range recs {
		out := r.GetOutputTokens()
		if r.GetOutcome() != "served" || out <= 0 {
			if m := mean[r.GetDeployment()]; m[1] > 0 {
				out = max(m[0]/m[1], 1)
			} else {
				out = 16
			}
		}
		model := r.GetDeployment()
		if r.GetAdapter() != "" && slices.ContainsFunc(cfg.Models, func(m servesim.ModelConfig) bool { return slices.Contains(m.Adapters, r.GetAdapter()) }) {
			model += ":" + r.GetAdapter()
		}
		span = r.GetArrived().AsTime().Sub(start).Seconds()
		line, _ := json.Marshal(map[string]any{"time": span, "model": model, "tenant": r.GetTenant(),
			"prompt_tokens": max(r.GetPromptTokens(), 1), "output_tokens": out})
		bw.Write(line)
		bw.WriteByte('\n')
	}
	if err := bw.Flush(); err != nil {
		f.Close()
		return "", 0, err
	}
	return path, span, f.Close()
}

// servedSLO is each model's share of its recorded requests that were
// served within its TTFT target (served at all, where it has none): the
// simulator's measure, on what the gateway measured.
func servedSLO(recs []*pb.RequestRecord, cfg *servesim.Config) map[string]float64 {
	slo := map[string]float64{}
	for _, m := range cfg.Models {
		slo[m.Name] = m.SLOTTFTSeconds
	}
	ok, all := map[string]int{}, map[string]int{}
	for _, r := range recs {
		m := r.GetDeployment()
		all[m]++
		if r.GetOutcome() == "served" && (slo[m] == 0 || r.GetTtftSeconds() <= slo[m]) {
			ok[m]++
		}
	}
	out := map[string]float64{}
	for m, n := range all {
		out[m] = float64(ok[m]) / float64(n)
	}
	return out
}

// applyWhatIf is cfg changed as f asks, and the changes in words.
func applyWhatIf(base *servesim.Config, f fromNode) (*servesim.Config, []string, error) {
	b, _ := json.Marshal(base)
	cfg := &servesim.Config{}
	_ = json.Unmarshal(b, cfg)
	var what []string
	if f.cardMemory != "" {
		gib, err := parseGiB(f.cardMemory)
		if err != nil {
			return nil, nil, fmt.Errorf("--card-memory %q: %w", f.cardMemory, err)
		}
		what = append(what, fmt.Sprintf("card memory %.0fGiB (was %.1fGiB)", gib, cfg.Card.MemoryGiB))
		cfg.Card.MemoryGiB = gib
	}
	for _, name := range f.remove {
		i := slices.IndexFunc(cfg.Models, func(m servesim.ModelConfig) bool { return m.Name == name })
		if i < 0 {
			return nil, nil, fmt.Errorf("--remove %s: no such model on the card (it has %s)", name, configModels(cfg))
		}
		cfg.Models = slices.Delete(cfg.Models, i, i+1)
		what = append(what, "without "+name+" (its requests are rejected)")
	}
	for _, s := range f.set {
		ref, val, ok := strings.Cut(s, "=")
		name, field, ok2 := strings.Cut(ref, ".")
		if !ok || !ok2 {
			return nil, nil, fmt.Errorf("--set %q: want MODEL.FIELD=VALUE (FIELD class, residency or memoryGiB)", s)
		}
		i := slices.IndexFunc(cfg.Models, func(m servesim.ModelConfig) bool { return m.Name == name })
		if i < 0 {
			return nil, nil, fmt.Errorf("--set %q: no model %s on the card (it has %s)", s, name, configModels(cfg))
		}
		switch field {
		case "class":
			cfg.Models[i].Class = val
		case "residency":
			cfg.Models[i].Residency = val
		case "memoryGiB":
			v, err := strconv.ParseFloat(val, 64)
			if err != nil || v <= 0 {
				return nil, nil, fmt.Errorf("--set %q: memoryGiB must be a number > 0", s)
			}
			cfg.Models[i].MemoryGiB = v
		default:
			return nil, nil, fmt.Errorf("--set %q: field %s: want class, residency or memoryGiB", s, field)
		}
		what = append(what, fmt.Sprintf("%s.%s=%s", name, field, val))
	}
	for _, path := range f.add {
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, nil, fmt.Errorf("--add: %w", err)
		}
		file, err := descriptor.Parse(data)
		if err != nil {
			return nil, nil, fmt.Errorf("--add %s: %w", path, err)
		}
		for _, r := range file.Resources {
			if r.ModelDeployment == nil {
				continue
			}
			r.ModelDeployment.SetDefaults(r.Name)
			spec := r.ModelDeployment.Proto()
			// The serving simulator's card is one shared card.
			mib := fsm.MemoryShareMiB(spec, &pb.AcceleratorSpec{Tenancy: pb.Tenancy_TENANCY_SHARED}, uint64(cfg.Card.MemoryGiB*1024))
			mc := modelConfig(r.Name, spec, mib, nil)
			cfg.Models = append(cfg.Models, mc)
			what = append(what, fmt.Sprintf("with %s (%s, %s, %.1fGiB; no requests of its own in the record)", r.Name, mc.Residency, mc.Class, mc.MemoryGiB))
		}
	}
	return cfg, what, nil
}

func configModels(cfg *servesim.Config) string {
	var names []string
	for _, m := range cfg.Models {
		names = append(names, m.Name)
	}
	return strings.Join(names, ", ")
}

// parseGiB reads a memory size: "48GiB", "48Gi", "48G" or "48".
func parseGiB(s string) (float64, error) {
	t := strings.TrimSpace(s)
	for _, suf := range []string{"GiB", "Gi", "G"} {
		if v, ok := strings.CutSuffix(t, suf); ok {
			t = v
			break
		}
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || v <= 0 {
		return 0, fmt.Errorf("want a size in GiB > 0, such as 48GiB")
	}
	return v, nil
}

func writeReplay(w io.Writer, r replayResult) error {
	fmt.Fprintf(w, "node %s card %d: %d requests over %s, replayed under %s\n", r.Node, r.Card, r.Requests,
		(time.Duration(r.Seconds) * time.Second).String(), r.Policy)
	for _, x := range r.WhatIf {
		fmt.Fprintf(w, "what if: %s\n", x)
	}
	tw := tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
	head := "MODEL\tCLASS\tOFFERED\tSLO AS SERVED\tSLO AS SIMULATED\tDIFF"
	if len(r.WhatIf) > 0 {
		head += "\tSLO WHAT-IF"
	}
	fmt.Fprintln(tw, head)
	for _, m := range r.Models {
		row := fmt.Sprintf("%s\t%s\t%d\t%.1f%%\t%.1f%%\t%+.1f", m.Model, m.Class, m.Offered, 100*m.Served, 100*m.Simulated, 100*(m.Simulated-m.Served))
		if m.WhatIf != nil {
			row += fmt.Sprintf("\t%.1f%%", 100**m.WhatIf)
		}
		fmt.Fprintln(tw, row)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "cold loads %d, evictions %d as simulated", r.ColdLoads, r.Evictions)
	if r.WhatIfColdLoads != nil {
		fmt.Fprintf(w, "; %d and %d under the what-if", *r.WhatIfColdLoads, *r.WhatIfEvictions)
	}
	fmt.Fprintln(w)
	be := "none"
	if len(r.BestEffort) > 0 {
		be = strings.Join(r.BestEffort, ", ")
	}
	if _, err := fmt.Fprintf(w, "best-effort (under 90%% within SLO): %s\n", be); err != nil {
		return err
	}
	same := "the same choice"
	if !r.SameChoice {
		same = "a different choice"
	}
	_, err := fmt.Fprintf(w, "protected set: the replay serves best-effort %s; the node's controller %s (%s)\n", modelsOf(r.Chosen), modelsOf(r.Live), same)
	return err
}

// modelsOf names the models of best-effort reasons ("coder: needs …"),
// or "none".
func modelsOf(whys []string) string {
	var ms []string
	for _, w := range whys {
		m, _, _ := strings.Cut(w, ":")
		ms = append(ms, m)
	}
	if len(ms) == 0 {
		return "none"
	}
	return strings.Join(ms, ", ")
}
