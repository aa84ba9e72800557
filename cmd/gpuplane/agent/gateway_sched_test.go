package agent_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/gpuplane/gpuplane/cmd/gpuplane/agent"
	"github.com/gpuplane/gpuplane/internal/testutil"
	"github.com/gpuplane/gpuplane/node/gateway/queue"
)

// The gateway's scheduling of requests on a live agent: fairness between
// tenants, priority between classes, admission under overload.

// served is one answered request: whose, and how many tokens.
type served struct {
	tenant string
	tokens int
}

// backlog runs loops concurrent request loops per tenant (non-streamed
// completions of maxTokens) against n's gateway until stop is closed,
// reporting each answer to out.
func backlog(ctx context.Context, t *testing.T, n *node, model string, loops map[string]int, maxTokens int, out chan<- served) *sync.WaitGroup {
	var wg sync.WaitGroup
	body := fmt.Sprintf(`{"model":%q,"prompt":"the same prompt for everyone","max_tokens":%d}`, model, maxTokens)
	for tenant, k := range loops {
		for range k {
			wg.Go(func() {
				for ctx.Err() == nil {
					req, _ := http.NewRequestWithContext(ctx, http.MethodPost, n.a.GatewayURL()+"/v1/completions", strings.NewReader(body))
					req.Header.Set("X-Gpuplane-Tenant", tenant)
					resp, err := http.DefaultClient.Do(req)
					if err != nil {
						continue
					}
					var r struct {
						Usage struct {
							CompletionTokens int `json:"completion_tokens"`
						} `json:"usage"`
					}
					err = json.NewDecoder(resp.Body).Decode(&r)
					resp.Body.Close()
					if err == nil && resp.StatusCode == http.StatusOK {
						select {
						case out <- served{tenant, r.Usage.CompletionTokens}:
						case <-ctx.Done():
						}
					}
				}
			})
		}
	}
	return &wg
}

// shareWhileBacklogged collects answers until want have arrived and returns
// the tokens each tenant was served after the first skip answers (while
// every tenant's loops keep it backlogged).
func shareWhileBacklogged(out <-chan served, skip, want int) map[string]int {
	got := map[string]int{}
	for i := 0; i < skip+want; i++ {
		s := <-out
		if i >= skip {
			got[s.tenant] += s.tokens
		}
	}
	return got
}

// TestGatewayFairness: with real sim engines behind a gateway that lets two
// requests at a time on the engine, two backlogged tenants of equal weight
// are served within 10% of each other although one sends ten times the
// other's load; weights 2:1 give 2:1 within 10%.
func TestGatewayFairness(t *testing.T) {
	n := devNode(t, "fair", agent.GatewayConfig{MaxInFlight: 2, Weights: map[string]float64{"gold": 2, "bronze": 1}})
	deploySim(t, n, "chat", "pinned", "--tokens-per-second", "400")
	waitServed(t, n.a.GatewayURL(), "chat")

	check := func(loops map[string]int, a, b string, ratio float64) {
		t.Helper()
		ctx, cancel := context.WithCancel(context.Background())
		out := make(chan served)
		wg := backlog(ctx, t, n, "chat", loops, 20, out)
		got := shareWhileBacklogged(out, 20, 120)
		cancel()
		wg.Wait()
		r := float64(got[a]) / float64(got[b])
		t.Logf("loops %v: served tokens %v, %s/%s = %.3f (want %.1f)", loops, got, a, b, r, ratio)
		if r < ratio*0.9 || r > ratio*1.1 {
			t.Errorf("loops %v: served tokens %v: %s/%s = %.3f, want %.1f ± 10%%", loops, got, a, b, r, ratio)
		}
	}
	// Equal weights, ten times the load: equal service.
	check(map[string]int{"flood": 30, "steady": 3}, "flood", "steady", 1)
	// Weights 2:1, equal load: twice the service.
	check(map[string]int{"gold": 8, "bronze": 8}, "gold", "bronze", 2)
}

// ttft is the time to the first streamed token of one chat request.
func ttft(t *testing.T, c openai.Client, class string) (time.Duration, error) {
	start := time.Now()
	s := c.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{Model: "chat",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("quick question")}, MaxTokens: openai.Int(2)},
		option.WithHeader("X-Gpuplane-Priority", class))
	defer s.Close()
	var first time.Duration
	for s.Next() {
		if ch := s.Current().Choices; first == 0 && len(ch) > 0 && ch[0].Delta.Content != "" {
			first = time.Since(start)
		}
	}
	return first, s.Err()
}

func p95(ds []time.Duration) time.Duration {
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	return ds[(len(ds)*95+99)/100-1]
}

// TestGatewayPriority: on an engine saturated by background requests,
// interactive requests' p95 time to first token stays within 1.5× of
// interactive alone (the gateway cuts background work for them); the cut
// non-streamed background requests re-run and succeed, cut streams end
// with an OpenAI error event; and background is not starved while
// interactive requests saturate the engine (its floor).
func TestGatewayPriority(t *testing.T) {
	n := devNode(t, "prio", agent.GatewayConfig{MaxInFlight: 4})
	// 10 tokens/s: a first token takes 100 ms, so the comparison is of the
	// engine's time, not of scheduling noise.
	deploySim(t, n, "chat", "pinned", "--tokens-per-second", "10")
	waitServed(t, n.a.GatewayURL(), "chat")
	c := openaiClient(n)

	measure := func() []time.Duration {
		var ds []time.Duration
		for range 20 {
			d, err := ttft(t, c, "interactive")
			if err != nil {
				t.Fatalf("interactive request: %v", err)
			}
			ds = append(ds, d)
		}
		return ds
	}
	alone := p95(measure())

	// Saturate the engine with background work: non-streamed requests and
	// streams, more than its four slots.
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var mu sync.Mutex
	var bgOK, bgFailed, streamsCut, streamsOK int
	for i := range 8 {
		wg.Go(func() {
			for ctx.Err() == nil {
				if i%2 == 0 {
					_, err := c.Completions.New(ctx, openai.CompletionNewParams{Model: "chat",
						Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("batch job")}, MaxTokens: openai.Int(20)},
						option.WithHeader("X-Gpuplane-Priority", "background"))
					mu.Lock()
					switch {
					case err == nil:
						bgOK++
					case ctx.Err() == nil:
						bgFailed++
						t.Errorf("a non-streamed background request failed: %v", err)
					}
					mu.Unlock()
					continue
				}
				s := c.Completions.NewStreaming(ctx, openai.CompletionNewParams{Model: "chat",
					Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("batch stream")}, MaxTokens: openai.Int(20)},
					option.WithHeader("X-Gpuplane-Priority", "background"))
				for s.Next() {
				}
				err := s.Err()
				s.Close()
				mu.Lock()
				switch {
				case err == nil:
					streamsOK++
				case strings.Contains(err.Error(), "preempted"):
					streamsCut++
				case ctx.Err() == nil:
					t.Errorf("a background stream failed other than by preemption: %v", err)
				}
				mu.Unlock()
			}
		})
	}
	// On a failure, the loops stop before the agent does.
	t.Cleanup(func() { cancel(); wg.Wait() })
	testutil.Eventually(t, 30*time.Second, "background fills the engine", func() error {
		if q := metric(t, n, "gpuplane_gateway_in_flight", `replica="chat/0"`); q < 4 {
			return fmt.Errorf("%v in flight", q)
		}
		return nil
	})
	loaded := p95(measure())
	t.Logf("interactive p95 TTFT: alone %v, with the engine saturated by background %v", alone, loaded)
	if loaded > alone*3/2 {
		t.Errorf("interactive p95 TTFT with background load %v is over 1.5× alone (%v)", loaded, alone)
	}

	// Interactive saturation: background still gets its floor (5% of the
	// tokens dispatched, so about one background request in twenty).
	ictx, icancel := context.WithCancel(context.Background())
	var iwg sync.WaitGroup
	var interactiveDone int
	for range 8 {
		iwg.Go(func() {
			for ictx.Err() == nil {
				_, err := c.Completions.New(ictx, openai.CompletionNewParams{Model: "chat",
					Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("urgent")}, MaxTokens: openai.Int(20)},
					option.WithHeader("X-Gpuplane-Priority", "interactive"))
				if err == nil {
					mu.Lock()
					interactiveDone++
					mu.Unlock()
				}
			}
		})
	}
	t.Cleanup(func() { icancel(); iwg.Wait() })
	// Once interactive work holds the engine (the background work that was
	// on it is cut or done), background answers come only from its floor.
	var before int
	testutil.Eventually(t, 120*time.Second, "interactive work saturates the engine", func() error {
		mu.Lock()
		defer mu.Unlock()
		before = bgOK + streamsOK
		if interactiveDone < 8 {
			return fmt.Errorf("%d interactive answered", interactiveDone)
		}
		return nil
	})
	testutil.Eventually(t, 120*time.Second, "background answers while interactive saturates the engine", func() error {
		mu.Lock()
		defer mu.Unlock()
		if bg := bgOK + streamsOK - before; bg < 1 {
			return fmt.Errorf("%d background and %d interactive answered", bg, interactiveDone)
		}
		return nil
	})
	icancel()
	iwg.Wait()
	cancel()
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	t.Logf("background: %d non-streamed answered (%d failed), %d streams whole, %d streams cut; %d interactive under saturation",
		bgOK, bgFailed, streamsOK, streamsCut, interactiveDone)
	if streamsCut == 0 {
		t.Error("no background stream was cut for interactive work")
	}
	if metric(t, n, "gpuplane_gateway_preemptions_total") == 0 {
		t.Error("no preemption counted on /metrics")
	}
}

// TestGatewayAdmission: past a deployment's bounded queue a request gets
// 429 with Retry-After; a cold onDemand model is loaded for the requests
// that wait for it, and one whose load does not finish within the wait
// gets 503 with Retry-After. Each is an OpenAI error.
func TestGatewayAdmission(t *testing.T) {
	n := devNode(t, "adm", agent.GatewayConfig{MaxInFlight: 1, QueueLimit: 1, Queue: queue.Config{ColdWait: 3 * time.Second}})
	deploySim(t, n, "slow", "pinned", "--tokens-per-second", "5")
	waitServed(t, n.a.GatewayURL(), "slow")
	c := openaiClient(n)

	// One request on the engine (six seconds: long enough that the third
	// request comes before it ends on a loaded machine), one queued: a
	// third is turned away.
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			if _, err := c.Completions.New(context.Background(), openai.CompletionNewParams{Model: "slow",
				Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("x")}, MaxTokens: openai.Int(30)}); err != nil {
				t.Errorf("an admitted request failed: %v", err)
			}
		})
	}
	testutil.Eventually(t, 30*time.Second, "one request in flight and one queued", func() error {
		q, f := metric(t, n, "gpuplane_gateway_queue_depth", `replica="slow/0"`), metric(t, n, "gpuplane_gateway_in_flight", `replica="slow/0"`)
		if q != 1 || f != 1 {
			return fmt.Errorf("queued %v, in flight %v", q, f)
		}
		return nil
	})
	_, err := c.Completions.New(context.Background(), openai.CompletionNewParams{Model: "slow",
		Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("x")}, MaxTokens: openai.Int(10)})
	var e *openai.Error
	if !errors.As(err, &e) || e.StatusCode != http.StatusTooManyRequests || e.Code != "queue_full" || !strings.Contains(e.Message, "slow") {
		t.Fatalf("a request past the queue: %v, want 429 queue_full naming slow", err)
	}
	if ra, err := strconv.Atoi(e.Response.Header.Get("Retry-After")); err != nil || ra < 1 {
		t.Fatalf("429 without a Retry-After in seconds: %q", e.Response.Header.Get("Retry-After"))
	}
	wg.Wait()

	// A cold onDemand model loads for the request that waits for it.
	deploySim(t, n, "lazy", "onDemand", "--tokens-per-second", "0", "--load-seconds", "1")
	waitCold(t, n, "lazy")
	if _, err := c.Completions.New(context.Background(), openai.CompletionNewParams{Model: "lazy",
		Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("x")}, MaxTokens: openai.Int(2)}); err != nil {
		t.Fatalf("a request for a cold onDemand model: %v", err)
	}

	// One that never finishes loading: 503 with Retry-After after the wait.
	deploySim(t, n, "stuck", "onDemand", "--tokens-per-second", "0", "--load-seconds", "86400")
	waitCold(t, n, "stuck")
	_, err = c.Completions.New(context.Background(), openai.CompletionNewParams{Model: "stuck",
		Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("x")}, MaxTokens: openai.Int(2)})
	if !errors.As(err, &e) || e.StatusCode != http.StatusServiceUnavailable || e.Code != "model_not_loaded" || !strings.Contains(e.Message, "stuck") {
		t.Fatalf("a request for a model that does not load: %v, want 503 model_not_loaded naming stuck", err)
	}
	if ra, err := strconv.Atoi(e.Response.Header.Get("Retry-After")); err != nil || ra < 1 {
		t.Fatalf("503 without a Retry-After in seconds: %q", e.Response.Header.Get("Retry-After"))
	}
	// The 503 names the one cause, with its numbers, and is the card's
	// recorded reject decision.
	t.Logf("503 for a model that does not load: %s", e.Message)
	if !strings.Contains(e.Message, "loading on card 0") || !strings.Contains(e.Message, "waited") {
		t.Errorf("the 503 for a model still loading does not say so: %q", e.Message)
	}
	out := gpuplane(t, n, "residency", "decisions", "--model", "stuck/0", "-o", "json")
	var ds []struct{ Action, Model, Reason, Trigger string }
	if err := json.Unmarshal([]byte(out), &ds); err != nil {
		t.Fatalf("residency decisions for stuck: %v: %s", err, out)
	}
	if !slices.ContainsFunc(ds, func(d struct{ Action, Model, Reason, Trigger string }) bool {
		return d.Action == "reject" && d.Trigger == "request" && strings.Contains(e.Message, d.Reason)
	}) {
		t.Errorf("no reject decision (trigger request) with the 503's reason %q among %+v", e.Message, ds)
	}
}
