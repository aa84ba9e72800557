package servesim

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
)

// Replay of a live run: `gpuplane bench interference` runs a set of models
// on a real agent with real sim engine processes, one mix after the other
// on the same card, and records every request it sent. ReplaySet runs the
// same timeline in virtual time under gpuplane's policy, so that the two
// p95s compared model the same thing: the same models deployed (and only
// those), the same warm-up and calibration requests, the same open-loop
// requests at the same times with the same lengths, the closed-loop
// streams over the same windows, the residency state carried from one mix
// to the next, and the deployments as the agent gives them to its
// controller (shares, no load or wake priors). What the simulator has no
// model of — the client's, the node front's and the engine's HTTP and
// scheduling time on the machine the bench ran on — is the measured
// per-request overhead. A request the live engine timed (LiveRequest.In
// and Out: the sim engine stamps when it received the request and wrote
// its first token) reaches the simulated engine its own In after its send
// and adds its own Out to its TTFT, so that the replay and the live run
// differ only by the engine's part; a closed loop's requests, whose sends
// follow the replay's own answers, are the live loop's in order
// (LiveClosed.Sent), with their paths where timed; any other request is
// delayed by a draw of its model's overhead samples.
// TTFTs count from the send. The bench sends to the replicas' fronts,
// which hold a request only while its model is not resident: the replay
// has no gateway queue before the engines (no in-flight cap, no
// reservation of prompt + output tokens), and each engine runs every
// request whose prompt fits its KV pool, as the sim
// engine process does.

// LiveRequest is one request the live bench sent: when, in the config's
// seconds from the set's start, to which model, and its lengths.
type LiveRequest struct {
	Time         float64 `json:"time"`
	Model        string  `json:"model"`
	PromptTokens int     `json:"promptTokens"`
	OutputTokens int     `json:"outputTokens"`
	// Timed says In and Out were measured: In from the send to the
	// engine's receipt, Out from the engine's first token to the
	// client's, config seconds.
	Timed   bool    `json:"timed,omitempty"`
	In, Out float64 `json:"-"`
	// Tenant sent it (empty: the config's first tenant).
	Tenant string `json:"tenant,omitempty"`
}

// LiveClosed is a closed-loop stream of a mix: Concurrency requests
// always outstanding for Model, lengths drawn around the means.
//
// Sent are the requests it sent, in the order sent: the replay's loop
// sends the same ones in the same order (lengths, and paths where timed),
// as the replay's answers let it; without them, lengths are drawn around
// the means.
type LiveClosed struct {
	Model        string        `json:"model"`
	Concurrency  int           `json:"concurrency"`
	PromptTokens int           `json:"promptTokens"`
	OutputTokens int           `json:"outputTokens"`
	Sent         []LiveRequest `json:"-"`
	// Aside: background work beside the model's own traffic
	// (Config.Beside), not measured.
	Aside bool `json:"aside,omitempty"`
}

// LivePhase is one mix as the live bench ran it on a set: the open-loop
// requests it sent (times from the set's start), and its closed-loop
// streams, which send from Start until End.
type LivePhase struct {
	Mix        string        `json:"mix"`
	Start, End float64       `json:"-"`
	Open       []LiveRequest `json:"-"`
	Closed     []LiveClosed  `json:"-"`
}

// ReplayOptions are what a replay adds to the config.
type ReplayOptions struct {
	// Overhead holds, per model, the per-request overheads measured live
	// (config seconds); each request is delayed by one drawn from the
	// seed. None: no overhead.
	Overhead map[string][]float64
	// Bare replays without any overhead: every request reaches the node
	// as it is sent, timed or not.
	Bare bool
	// Gateway: the live bench sent through the node's gateway (its queue,
	// in-flight caps and preemption), not to the replicas' fronts.
	Gateway bool
	Seed    uint64
}

// ReplaySet runs models (names of cfg's models) through the warm-up
// requests, then the phases, in one run, and returns each phase's stats
// per model, in the order of models. A request belongs to the phase
// whose window [Start, next phase's Start) holds its send time.
func ReplaySet(cfg *Config, models []string, warm []LiveRequest, phases []LivePhase, o ReplayOptions) ([][]ModelStats, error) {
	if len(phases) == 0 {
		return nil, fmt.Errorf("replay: no phases")
	}
	c := *cfg
	c.Models, c.Traces, c.Synthetic = nil, nil, nil
	for _, name := range models {
		i := cfg.model(name)
		if i < 0 {
			return nil, fmt.Errorf("replay: model %q is not in the config", name)
		}
		m := cfg.Models[i]
		// The sim engine process holds its footprint while it loads.
		m.PeakGiB = m.MemoryGiB
		c.Models = append(c.Models, m)
	}
	tenant := c.Tenants[0].Name
	c.WarmupSeconds = phases[0].Start
	end := phases[0].Start
	for _, ph := range phases {
		end = max(end, ph.End)
		for _, r := range ph.Open {
			end = max(end, r.Time)
		}
		for _, cl := range ph.Closed {
			if c.model(cl.Model) < 0 {
				return nil, fmt.Errorf("replay: phase %s: model %q is not in the set", ph.Mix, cl.Model)
			}
			st := SyntheticStream{Model: cl.Model, Tenants: []string{tenant}, Concurrency: cl.Concurrency,
				PromptTokens: cl.PromptTokens, OutputTokens: cl.OutputTokens, from: ph.Start, until: ph.End}
			st.sent, st.aside = cl.Sent, cl.Aside
			c.Synthetic = append(c.Synthetic, st)
		}
	}
	c.DurationSeconds = end
	s := newSim(&c, o.Seed, end)
	s.agentPriors = true
	// The live bench sends to the replicas' fronts (the node's own
	// endpoints), not through the gateway's queue.
	s.fronted = !o.Gateway
	s.livePaths = !o.Bare
	s.ovRng = rand.New(rand.NewPCG(o.Seed, 0x0e7e7ead))
	for _, m := range c.Models {
		if !o.Bare {
			s.overhead = append(s.overhead, o.Overhead[m.Name])
		}
	}
	var arr []Arrival
	add := func(r LiveRequest) error {
		m := c.model(r.Model)
		if m < 0 {
			return fmt.Errorf("replay: request for %q, not in the set", r.Model)
		}
		a := Arrival{Model: m, Tenant: cmp.Or(r.Tenant, tenant), PromptTokens: r.PromptTokens, OutputTokens: r.OutputTokens, order: len(arr)}
		switch {
		case !o.Bare && r.Timed:
			a.lag, a.back = max(r.In, 0), max(r.Out, 0)
		case !o.Bare:
			a.lag = s.drawOverhead(m)
		}
		a.Time = r.Time + a.lag
		arr = append(arr, a)
		return nil
	}
	for _, r := range warm {
		if err := add(r); err != nil {
			return nil, err
		}
	}
	for _, ph := range phases {
		for _, r := range ph.Open {
			if err := add(r); err != nil {
				return nil, err
			}
		}
	}
	sortArrivals(arr)
	type rec struct {
		sent, ttft float64
		o          outcome
	}
	recs := make([][]rec, len(c.Models))
	s.onEnd = func(r *request, o outcome) {
		x := rec{sent: r.a.Time - r.a.lag, o: o}
		if o == outcomeDone {
			x.ttft = r.firstAt - x.sent + r.a.back
		}
		recs[r.a.Model] = append(recs[r.a.Model], x)
	}
	p, err := newGpuplane(s)
	if err != nil {
		return nil, err
	}
	s.pol = p
	s.run(arr)
	out := make([][]ModelStats, len(phases))
	for k, ph := range phases {
		until := end + drainAfter
		if k+1 < len(phases) {
			until = phases[k+1].Start
		}
		for mi, m := range c.Models {
			ms := ModelStats{Model: m.Name, Class: m.Class}
			var ttft []float64
			for _, x := range recs[mi] {
				if x.sent < ph.Start || x.sent >= until {
					continue
				}
				ms.Requests++
				switch x.o {
				case outcomeDone:
					ms.Completed++
					ttft = append(ttft, x.ttft)
				case outcomeRejected:
					ms.Rejected++
				default:
					ms.Failed++
				}
			}
			slices.Sort(ttft)
			ms.TTFTP50 = round(percentile(ttft, 50), 3)
			ms.TTFTP95 = round(percentile(ttft, 95), 3)
			ms.TTFTP99 = round(percentile(ttft, 99), 3)
			out[k] = append(out[k], ms)
		}
	}
	return out, nil
}
