package interference

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gpuplane/gpuplane/node/gateway"
	"github.com/gpuplane/gpuplane/node/gateway/isolation"
	"github.com/gpuplane/gpuplane/node/servesim"
	"github.com/gpuplane/gpuplane/node/sim"
)

// minArrivals is the fewest requests an open-loop mix is expected to send
// per model in a cell.
const minArrivals = 3

// sample is one request: when it was sent (since the set's start), its
// lengths and its outcome, in wall seconds.
//
// A streamed answer from the sim engine carries when the engine received
// the request, when its model had the first token ready and when its
// process wrote it (sim.HeaderReceived, HeaderFirstTokenDue,
// HeaderFirstToken): toEngine and fromEngine split the TTFT into the path
// to the engine, the engine's own part (the model's, under the live
// card's sharing, batch, KV pool and residency) and the path back.
type sample struct {
	at                   float64
	in, out              int
	ttft, tpot           float64
	timed                bool
	toEngine, fromEngine float64
	// late is how long after its model had the first token ready the
	// engine's process wrote it (part of fromEngine).
	late float64
	// tenant sent it; cached is the prompt tokens its answer says the
	// engine's cache held (-1: it did not say).
	tenant string
	cached int
	err    error
}

// live is the request as the replay takes it, in the config's seconds.
func (s sample) live(model string, scale float64) servesim.LiveRequest {
	return servesim.LiveRequest{Time: s.at * scale, Model: model, PromptTokens: s.in, OutputTokens: s.out,
		Timed: s.timed, In: s.toEngine * scale, Out: s.fromEngine * scale, Tenant: s.tenant}
}

// engineTTFT is the engine's own part of the TTFT (wall seconds).
func (s sample) engineTTFT() float64 { return s.ttft - s.toEngine - s.fromEngine }

// drive sends the stream's requests to endpoint for the duration: open
// loop (Poisson arrivals, bursty when the stream has on/off periods) or
// closed loop (Concurrency always outstanding), then waits for every
// request it sent.
func (b *bench) drive(ctx context.Context, endpoint string, m *servesim.ModelConfig, st servesim.SyntheticStream, seed uint64) []sample {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	scale := b.o.TimeScale
	start := time.Now()
	end := start.Add(b.o.Duration)
	var mu sync.Mutex
	var out []sample
	var wg sync.WaitGroup
	lengths := func() (int, int) {
		in := int(float64(st.PromptTokens) * (0.5 + rng.Float64()))
		return max(1, in), max(1, int(float64(st.OutputTokens)*(0.5+rng.Float64())))
	}
	aside := st.Aside()
	one := func(in, outTokens int) {
		s := b.send(ctx, endpoint, m.Name, in, outTokens, aside)
		mu.Lock()
		out = append(out, s)
		mu.Unlock()
		b.mu.Lock()
		if aside {
			b.asideRequests++
			if s.err == nil {
				b.asideAnswered++
			}
		} else {
			b.requests++
			if s.err == nil {
				b.answered++
			}
		}
		b.mu.Unlock()
	}
	if st.Concurrency > 0 {
		var lmu sync.Mutex
		for range st.Concurrency {
			wg.Go(func() {
				for time.Now().Before(end) && ctx.Err() == nil {
					lmu.Lock()
					in, o := lengths()
					lmu.Unlock()
					one(in, o)
				}
			})
		}
		wg.Wait()
		return out
	}
	// Open loop: arrivals in the stream's virtual time, sent at its
	// scaled wall time.
	// A sparse mix (long: one request in 20 s) runs long enough to expect
	// minArrivals requests, or its p95 would rest on none.
	horizon := max(b.o.Duration.Seconds()*scale, minArrivals/st.RatePerSecond)
	for t := rng.ExpFloat64() / st.RatePerSecond; t < horizon; t += rng.ExpFloat64() / st.RatePerSecond {
		if period := st.OnSeconds + st.OffSeconds; st.OnSeconds > 0 && math.Mod(t, period) >= st.OnSeconds {
			continue
		}
		in, o := lengths()
		select {
		case <-ctx.Done():
		case <-time.After(time.Until(start.Add(time.Duration(t / scale * float64(time.Second))))):
		}
		wg.Go(func() { one(in, o) })
	}
	wg.Wait()
	return out
}

// send streams one completion of in prompt words and out tokens for
// model, and times its first token and the tokens after it. The config's
// tenants take turns by request number; under TenantAdapters each asks
// for its own adapter of the model. It goes to endpoint (the replica's
// front) or through the node's gateway, as the run says.
//
// An aside request (background work beside a model's own traffic) is
// sent as class background (the gateway's ClassHeader).
func (b *bench) send(ctx context.Context, endpoint, model string, in, out int, aside bool) sample {
	b.mu.Lock()
	b.sent++
	id := b.sent
	b.mu.Unlock()
	tenant := b.tenants[id%len(b.tenants)]
	asked := model
	if b.cfg.TenantAdapters {
		asked = model + ":" + tenant
	}
	url := endpoint
	if b.via == ViaGateway {
		url = b.gateway
	}
	// A prompt of its own, so that no request finds another's prefix in
	// the engine's cache (simulate serve has no prefix cache).
	words := make([]string, in)
	for i := range words {
		words[i] = "w" + strconv.Itoa((id*7919+i)%100000)
	}
	class := ""
	if aside {
		class = "background"
	}
	return b.sendAs(ctx, url, asked, tenant, class, id, words, out)
}

// sendAs streams one completion of prompt and out tokens for model (as
// the client names it) as tenant to url, with request number id, and
// checks that the answer is the request's (checkIdentity).
func (b *bench) sendAs(ctx context.Context, url, model, tenant, class string, id int, prompt []string, out int) sample {
	rid := "bench-" + strconv.Itoa(id)
	body, _ := json.Marshal(map[string]any{"model": model, "prompt": strings.Join(prompt, " "), "max_tokens": out, "stream": true,
		"stream_options": map[string]any{"include_usage": true}, "request_id": rid})
	t0 := time.Now()
	s := sample{at: t0.Sub(b.setStart).Seconds(), in: len(prompt), out: out, tenant: tenant, cached: -1}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", bytes.NewReader(body))
	if err != nil {
		s.err = err
		return s
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(isolation.TenantHeader, tenant)
	if class != "" {
		req.Header.Set(gateway.ClassHeader, class)
	}
	resp, err := b.http.Do(req)
	if err != nil {
		s.err = err
		return s
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		s.err = fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(msg))
		return s
	}
	var first, last time.Time
	tokens := 0
	var ans answerSeen
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || line == "[DONE]" {
			continue
		}
		var chunk struct {
			ID      string `json:"id"`
			Model   string `json:"model"`
			Choices []struct {
				Text string `json:"text"`
			} `json:"choices"`
			Usage *struct {
				PromptTokens        int `json:"prompt_tokens"`
				CompletionTokens    int `json:"completion_tokens"`
				PromptTokensDetails struct {
					CachedTokens int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
			Error *struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		if json.Unmarshal([]byte(line), &chunk) != nil {
			continue
		}
		if chunk.Error != nil {
			// A stream the gateway cut off (preempted) ends in an error
			// event: not an answer.
			s.err = fmt.Errorf("the stream ended in an error: %s", chunk.Error.Message)
			return s
		}
		ans.ids = append(ans.ids, chunk.ID)
		ans.models = append(ans.models, chunk.Model)
		if chunk.Usage != nil {
			ans.usage = true
			ans.prompt, ans.completion = chunk.Usage.PromptTokens, chunk.Usage.CompletionTokens
			s.cached = chunk.Usage.PromptTokensDetails.CachedTokens
		}
		if len(chunk.Choices) == 0 || chunk.Choices[0].Text == "" {
			continue
		}
		last = time.Now()
		if first.IsZero() {
			first = last
		}
		tokens++
	}
	if err := sc.Err(); err != nil {
		s.err = err
		return s
	}
	if first.IsZero() {
		s.err = errors.New("the stream ended without a token")
		return s
	}
	ans.tokens = tokens
	if problem := checkIdentity(rid, model, len(prompt), ans); problem != "" {
		b.mu.Lock()
		b.iso.Violation("identity", fmt.Sprintf("request %s (%s, tenant %s): %s", rid, model, tenant, problem))
		b.mu.Unlock()
	}
	b.mu.Lock()
	b.iso.Answers++
	b.mu.Unlock()
	s.ttft = first.Sub(t0).Seconds()
	recv, err1 := strconv.ParseInt(resp.Header.Get(sim.HeaderReceived), 10, 64)
	due, err2 := strconv.ParseInt(resp.Header.Get(sim.HeaderFirstTokenDue), 10, 64)
	wrote, err3 := strconv.ParseInt(resp.Header.Get(sim.HeaderFirstToken), 10, 64)
	if err1 == nil && err2 == nil && err3 == nil {
		// All three clocks are this machine's wall clock. The path back
		// starts when the engine's model had the token ready: how late
		// its process wrote it is this machine's, as the path is.
		s.timed = true
		s.toEngine = min(max(0, float64(recv-t0.UnixNano())/1e9), s.ttft)
		s.fromEngine = min(max(0, float64(first.UnixNano()-due)/1e9), s.ttft-s.toEngine)
		s.late = max(0, float64(wrote-due)/1e9)
	}
	if tokens > 1 {
		s.tpot = last.Sub(first).Seconds() / float64(tokens-1)
	}
	return s
}

// answerSeen is what a streamed answer said of itself: each event's id
// and model, its usage (when it sent one) and the tokens streamed.
type answerSeen struct {
	ids, models        []string
	usage              bool
	prompt, completion int
	tokens             int
}

// checkIdentity says how an answer is not the one to request rid for
// model (as the client named it) with prompt tokens, or "": every event
// carries the id the engine forms from rid (vLLM's "cmpl-" + request_id)
// and the model asked for (or the adapter the node resolved "model:
// adapter" to), and its usage counts the request's prompt and the tokens
// streamed.
func checkIdentity(rid, model string, prompt int, ans answerSeen) string {
	want := "cmpl-" + rid
	_, adapter, _ := strings.Cut(model, ":")
	for k, id := range ans.ids {
		if id != want {
			return fmt.Sprintf("event %d carries id %q, not %q", k, id, want)
		}
		if m := ans.models[k]; m != model && (adapter == "" || m != adapter) {
			return fmt.Sprintf("event %d is from model %q, not %q", k, m, model)
		}
	}
	switch {
	case !ans.usage:
		return "no usage in the answer"
	case ans.prompt != prompt:
		return fmt.Sprintf("usage counts %d prompt tokens, the request sent %d", ans.prompt, prompt)
	case ans.completion != ans.tokens:
		return fmt.Sprintf("usage counts %d completion tokens, %d were streamed", ans.completion, ans.tokens)
	}
	return ""
}

// probeCaches reads each engine's prompt cache through the node's gateway
// (where each tenant's cache salt is set): for each model of the set, the
// first tenant sends a prompt no one sent before twice, then the second
// tenant sends it twice. A first send of either must hit nothing (a hit
// is another tenant's, or another set's, prompt); the repeats should hit
// their own tenant's, which shows the cache was there to leak.
func (b *bench) probeCaches(ctx context.Context, setIdx int, names []string) error {
	tenants := slices.Clone(b.tenants)
	if len(tenants) < 2 {
		tenants = append(tenants, "isolation-probe")
	}
	for k, name := range names {
		prompt := make([]string, 4*probeBlock)
		for i := range prompt {
			prompt[i] = fmt.Sprintf("p%dm%di%d", setIdx, k, i)
		}
		for _, tenant := range tenants[:2] {
			for rep := range 2 {
				b.mu.Lock()
				b.sent++
				id := b.sent
				b.mu.Unlock()
				s := b.sendAs(ctx, b.gateway, name, tenant, "", id, prompt, 1)
				if s.err != nil {
					return fmt.Errorf("cache probe of %s as %s: %w", name, tenant, s.err)
				}
				b.mu.Lock()
				b.iso.CacheProbes++
				switch {
				case s.cached < 0:
					b.iso.Violation("cache", fmt.Sprintf("probe of %s as %s: the answer has no cached_tokens", name, tenant))
				case rep == 0 && s.cached > 0:
					b.iso.Violation("cache", fmt.Sprintf("%s: tenant %s's first send of a prompt hit %d cached tokens it never sent (the other tenant sent it)", name, tenant, s.cached))
				case rep == 1 && s.cached > 0:
					b.iso.OwnHits++
				}
				b.mu.Unlock()
			}
		}
	}
	return nil
}

// probeBlock is the sim engine's prefix-cache block, in tokens: a probe's
// prompt is whole blocks.
const probeBlock = 16
