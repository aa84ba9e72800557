package agent_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/gpuplane/gpuplane/node/gateway/queue"
)

// TestBackgroundRequestRunsAgainAfterItsEngineLeft: on a --dev agent whose
// card holds one of two onDemand sim models at a time, a request of the
// background deployment, not streamed, is cut off in the middle when an
// interactive request for the other model takes the card (the
// controller's clock runs 30 times faster, so its waits pass in seconds).
// Nothing of it reached its client, so the gateway puts it back in its
// queue; once the other model is done the controller loads its model
// again for it, and the client gets the whole answer, not the 502 of an
// engine gone.
func TestBackgroundRequestRunsAgainAfterItsEngineLeft(t *testing.T) {
	n := pairNode(t, "requeue", queue.Config{}, "5", "0")
	waitReplica(t, n, "chat", "Resident")
	c := openaiClient(n)
	done := askBatch(c)
	waitReplica(t, n, "batch", "Resident") // loaded for it, in chat's place
	select {
	case a := <-done:
		t.Fatalf("answered before it was cut off: %d tokens, %v", a.tokens, a.err)
	case <-time.After(2 * time.Second): // 10 of its 40 tokens generated
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := c.Completions.New(ctx, openai.CompletionNewParams{Model: "chat",
		Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("hi")}, MaxTokens: openai.Int(2)}); err != nil {
		t.Fatalf("the interactive request: %v\n%s", err, gpuplane(t, n, "residency", "decisions"))
	}
	a := <-done
	decisions := gpuplane(t, n, "residency", "decisions", "--model", "batch/0")
	t.Logf("decisions:\n%s", decisions)
	if a.err != nil {
		t.Fatalf("the background request cut off for chat: %v, want it run again and answered", a.err)
	}
	if a.tokens != 40 {
		t.Errorf("answer with %d tokens, want the whole 40", a.tokens)
	}
	if loads := strings.Count(decisions, " load "); loads < 2 {
		t.Errorf("batch/0 loaded %d times, want twice (once more for the request it was cut from)", loads)
	}
}

// pairNode starts a --dev agent (the residency controller's clock 30 times
// faster) with the gateway's queue configured by qc, and two onDemand sim
// models of 60% of its card, so that one fits at a time: "batch"
// (background) and "chat" (interactive), generating batchTPS and chatTPS
// tokens a second.
func pairNode(t *testing.T, name string, qc queue.Config, batchTPS, chatTPS string) *node {
	t.Helper()
	return pairNodeWith(t, name, qc, batchTPS, chatTPS, "onDemand")
}

// pairNodeWith is pairNode with the chat's residency.
func pairNodeWith(t *testing.T, name string, qc queue.Config, batchTPS, chatTPS, chatResidency string) *node {
	t.Helper()
	n := newNode(t, name, true, "l4=1")
	n.cfg.Dev, n.cfg.BootstrapExpect = true, 0
	n.cfg.ResidencyTimeScale = 30
	n.cfg.Gateway.Queue = qc
	n.start(t)
	gpuplane(t, n, "accelerators", "create", "shared", "--device", "l4", "--tenancy", "shared", "--max-models", "4")
	for _, m := range []struct{ name, residency, priority, tps string }{{"batch", "onDemand", "background", batchTPS}, {"chat", chatResidency, "interactive", chatTPS}} {
		applySpec(t, n, m.name, fmt.Sprintf(`resource: ModelDeployment
resourceVersion: v1
metadata: {name: %s}
spec:
  model: /models/%s
  residency: %s
  priority: %s
  placement: {accelerator: shared}
  engine: {kind: sim, memoryPercent: 60, args: ["--tokens-per-second", %q, "--load-seconds", "0.2"]}
`, m.name, m.name, m.residency, m.priority, m.tps))
	}
	waitServed(t, n.a.GatewayURL(), "chat")
	return n
}

type answer struct {
	tokens int64
	err    error
}

// askBatch sends one 40-token completion to "batch"; its answer comes on
// the channel.
func askBatch(c openai.Client) <-chan answer {
	done := make(chan answer, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		resp, err := c.Completions.New(ctx, openai.CompletionNewParams{Model: "batch",
			Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("summarise this")}, MaxTokens: openai.Int(40)})
		if err != nil {
			done <- answer{err: err}
			return
		}
		done <- answer{tokens: resp.Usage.CompletionTokens}
	}()
	return done
}

// keepBusy has clients callers each send model one 10-token completion
// after another (each waiting at most timeout) until the returned halt is
// called, which waits for them; each, when set, hears every outcome.
func keepBusy(c openai.Client, model string, clients int, timeout time.Duration, each func(error)) (halt func()) {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), timeout)
				_, err := c.Completions.New(ctx, openai.CompletionNewParams{Model: openai.CompletionNewParamsModel(model),
					Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("hi")}, MaxTokens: openai.Int(10)})
				cancel()
				if each != nil {
					each(err)
				}
			}
		})
	}
	var once sync.Once
	return func() { once.Do(func() { close(stop); wg.Wait() }) }
}

// TestBackgroundRequestWaitsForItsPromisedTurn: the gateway's background
// cold wait is 2 s here, and a busy interactive chat keeps the card; the
// batch model, best-effort and answered none of its requests yet, gets its
// turn only after its request has waited 1 min of the controller's clock
// (2 s), then the chat's drain and its own load. The gateway keeps the
// request past its cold wait until the turn the controller promises
// (residency plan's "gets the card by"), and it is answered in that turn
// (its 40 tokens take 1 s, well within the turn's 3 min of the
// controller's clock), instead of a 503 after 2 s.
func TestBackgroundRequestWaitsForItsPromisedTurn(t *testing.T) {
	n := pairNode(t, "promise", queue.Config{ColdWait: time.Second, ColdWaitBackground: 2 * time.Second}, "40", "5")
	waitReplica(t, n, "chat", "Resident")
	c := openaiClient(n)
	defer keepBusy(c, "chat", 2, 30*time.Second, nil)()
	time.Sleep(time.Second)
	start := time.Now()
	a := <-askBatch(c)
	took := time.Since(start)
	decisions := gpuplane(t, n, "residency", "decisions", "--model", "batch/0")
	t.Logf("answered after %v; decisions:\n%s", took, decisions)
	if a.err != nil {
		t.Fatalf("the background request waiting for its turn: %v, want it answered in the turn", a.err)
	}
	if a.tokens != 40 {
		t.Errorf("answer with %d tokens, want 40", a.tokens)
	}
	// With the protected set on, the batch model waits as best-effort;
	// its turn is the same promise under that name.
	if took <= 2*time.Second || !strings.Contains(decisions, "turn as a background model") && !strings.Contains(decisions, "turn as a best-effort model") {
		t.Errorf("answered after %v without a background turn: the test shows nothing", took)
	}
}

// TestWarmOwnerWaitsForTheCardPromisedBack: the chat is warm and kept busy;
// the batch model's request waits 10 min of the controller's clock (20 s)
// and gets a lower-class turn, for which the chat is put to sleep. The
// chat's requests that come during the turn find the warm owner yielding
// to it (a serialize decision, "back by …"): the gateway keeps them
// until the card promised back instead of a 503 after its 2 s cold wait,
// and they are answered once the chat is back (without the gateway
// asking whether the chat yields, 4 of them were refused).
func TestWarmOwnerWaitsForTheCardPromisedBack(t *testing.T) {
	n := pairNodeWith(t, "yield", queue.Config{ColdWait: 2 * time.Second, ColdWaitBackground: 4 * time.Second}, "10", "5", "warm")
	waitReplica(t, n, "chat", "Resident")
	c := openaiClient(n)
	var mu sync.Mutex
	var refused []string
	answered := 0
	halt := keepBusy(c, "chat", 2, time.Minute, func(err error) {
		mu.Lock()
		defer mu.Unlock()
		// A drain for the turn cuts requests in flight off with an error
		// after its deadline; a 503 model_not_loaded is a request refused
		// while it waited for the card.
		var e *openai.Error
		if errors.As(err, &e) && e.StatusCode == http.StatusServiceUnavailable && e.Code == "model_not_loaded" {
			refused = append(refused, e.Message)
		} else if err == nil {
			answered++
		}
	})
	defer halt()
	time.Sleep(time.Second)
	a := <-askBatch(c)
	time.Sleep(2 * time.Second)
	halt()
	decisions := gpuplane(t, n, "residency", "decisions")
	if a.err != nil {
		t.Fatalf("the background request: %v\n%s", a.err, decisions)
	}
	if !strings.Contains(decisions, "serialize chat/0 and batch/0") || !strings.Contains(decisions, "back by") {
		t.Fatalf("the chat never yielded to the batch's turn: the test shows nothing\n%s", decisions)
	}
	if len(refused) > 0 {
		t.Errorf("%d of the yielding chat's requests refused with 503 (%d answered), want them kept until the card promised back: %q\n%s",
			len(refused), answered, refused[:min(3, len(refused))], decisions)
	}
	t.Logf("chat: %d answered, %d refused", answered, len(refused))
}
