package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpuplane/gpuplane/node/gateway/queue"
	"github.com/gpuplane/gpuplane/node/sim"
)

// llamaGateway serves a gateway in front of a sim engine of slots slots that
// it takes for a llama.cpp engine, and waits until the replica is placed.
func llamaGateway(t *testing.T, slots int) string {
	t.Helper()
	engine := simEngineWith(t, sim.Config{ServedModelName: "chat", Dialect: sim.DialectLlamaCpp, Parallel: slots})
	_, srv, _ := startGateway(t, Options{Node: "n1", Cluster: fixedView{[]Model{{Served: "chat", Deployment: "chat", Class: queue.Standard,
		Replicas: []Replica{{Deployment: "chat", Node: "n1", Endpoint: engine, Kind: "llamacpp", Slots: slots, Running: true, Resident: true}}}}}})
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		resp, err := http.Post(srv.URL+"/v1/completions", "application/json", strings.NewReader(`{"model":"chat","prompt":"warm","max_tokens":1}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			return srv.URL
		}
		if time.Now().After(deadline) {
			t.Fatalf("the replica was never placed: %d", resp.StatusCode)
		}
	}
}

// cachedFor sends prompt as tenant and returns the cached prompt tokens the
// engine reports.
func cachedFor(t *testing.T, url, tenant, prompt string) int {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": "chat", "prompt": prompt, "max_tokens": 1})
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/completions", strings.NewReader(string(body)))
	req.Header.Set(TenantHeader, tenant)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("tenant %s: %d %s", tenant, resp.StatusCode, data)
	}
	var v struct {
		Usage struct {
			Details struct {
				Cached int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(data, &v); err != nil {
		t.Fatal(err)
	}
	return v.Usage.Details.Cached
}

// A llama.cpp engine keeps its prompt cache per slot: tenant B sending
// tenant A's exact prompt gets no cached token, A resending gets a hit —
// with one slot the two take turns in it, with two each keeps its own.
func TestGatewayLlamaCppSlotsNeverSharedAcrossTenants(t *testing.T) {
	prompt := strings.Repeat("secret ", 47) + "end"
	for _, c := range []struct {
		slots int
		// want is the cached tokens of each step; hit: all but the last.
		steps []string
		want  []int
	}{
		{1, []string{"a", "a", "b", "a", "a"}, []int{0, 47, 0, 0, 47}},
		{2, []string{"a", "a", "b", "a", "b"}, []int{0, 47, 0, 47, 47}},
	} {
		url := llamaGateway(t, c.slots)
		for i, tenant := range c.steps {
			if got := cachedFor(t, url, tenant, prompt); got != c.want[i] {
				t.Errorf("%d slots, step %d (%v), tenant %s: %d cached tokens, want %d", c.slots, i+1, c.steps[:i+1], tenant, got, c.want[i])
			}
		}
	}
}

// A slot runs one request at a time: with none free a request waits (and
// gives up with its context); the tenant that ran a slot to the end reuses
// it, another does not, nor does anyone after an unfinished run.
func TestSlotPool(t *testing.T) {
	p := newSlotPool(1)
	s, reuse, err := p.acquire(context.Background(), "a")
	if err != nil || s != 0 || reuse {
		t.Fatalf("first acquire: slot %d reuse %v err %v; want slot 0, no reuse", s, reuse, err)
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	cause := errors.New("client left")
	got := make(chan error, 1)
	go func() { _, _, err := p.acquire(ctx, "b"); got <- err }()
	cancel(cause)
	if err := <-got; !errors.Is(err, cause) {
		t.Fatalf("acquire of a busy slot, cancelled: %v; want %v", err, cause)
	}
	waited := make(chan bool, 1)
	go func() {
		_, reuse, err := p.acquire(context.Background(), "b")
		if err != nil {
			t.Error(err)
		}
		waited <- reuse
	}()
	p.release(0, "a", true)
	if <-waited {
		t.Fatal("tenant b was told to reuse tenant a's slot")
	}
	p.release(0, "b", false)
	if _, reuse, _ := p.acquire(context.Background(), "b"); reuse {
		t.Fatal("a slot whose run did not finish was reused")
	}
	p.release(0, "b", true)
	if _, reuse, _ := p.acquire(context.Background(), "b"); !reuse {
		t.Fatal("tenant b's own finished slot was not reused")
	}
}

// TestGatewayLlamaCppSlotsGoInQueueOrder: with a llama.cpp engine's one
// slot busy, the requests waiting for it get it in the card's scheduling
// order (interactive, then standard, then background, each oldest first),
// not by which of them the slot pool happens to wake: the slots are the
// replica's in-flight cap, so the waiting happens in the scheduler's queue.
func TestGatewayLlamaCppSlotsGoInQueueOrder(t *testing.T) {
	engine := simEngineWith(t, sim.Config{ServedModelName: "chat", Dialect: sim.DialectLlamaCpp, Parallel: 1, TokensPerSecond: 2})
	reg := prometheus.NewRegistry()
	_, srv, ctx := startGateway(t, Options{Node: "n1", Registerer: reg, Cluster: fixedView{[]Model{{Served: "chat", Deployment: "chat", Class: queue.Standard,
		Replicas: []Replica{{Deployment: "chat", Node: "n1", Endpoint: engine, Kind: "llamacpp", Slots: 1, Running: true, Resident: true}}}}}})
	deadline := time.Now().Add(20 * time.Second)
	// held is the requests the replica holds, running or queued.
	held := func() float64 {
		return gaugeOf(t, reg, "gpuplane_gateway_in_flight", "chat/0") + max(gaugeOf(t, reg, "gpuplane_gateway_queue_depth", "chat/0"), 0)
	}
	waitHeld := func(n float64) {
		t.Helper()
		for held() != n {
			if time.Now().After(deadline) {
				t.Fatalf("the replica holds %v requests; want %v", held(), n)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	for gaugeOf(t, reg, "gpuplane_gateway_in_flight", "chat/0") < 0 {
		if time.Now().After(deadline) {
			t.Fatal("the gateway never placed its replica")
		}
		time.Sleep(10 * time.Millisecond)
	}
	send := func(ctx context.Context, class string, maxTokens int, stream bool) error {
		body := fmt.Sprintf(`{"model":"chat","prompt":"x","max_tokens":%d,"stream":%v}`, maxTokens, stream)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/completions", strings.NewReader(body))
		req.Header.Set(ClassHeader, class)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%d %s", resp.StatusCode, b)
		}
		return nil
	}
	// A standard stream holds the slot (nothing preempts it) until cut.
	blocker, cut := context.WithCancel(ctx)
	go func() { _ = send(blocker, "standard", 1000, true) }()
	waitHeld(1)
	var mu sync.Mutex
	var order []string
	var wg sync.WaitGroup
	arrivals := []struct{ name, class string }{
		{"background 1", "background"}, {"interactive", "interactive"}, {"background 2", "background"},
		{"standard", "standard"}, {"background 3", "background"},
	}
	for i, a := range arrivals {
		wg.Go(func() {
			if err := send(ctx, a.class, 2, false); err != nil {
				t.Errorf("%s: %v", a.name, err)
			}
			mu.Lock()
			order = append(order, a.name)
			mu.Unlock()
		})
		waitHeld(float64(i + 2)) // it arrived before the next is sent
	}
	cut()
	wg.Wait()
	want := []string{"interactive", "standard", "background 1", "background 2", "background 3"}
	if !slices.Equal(order, want) {
		t.Errorf("the slot went to %v; want %v", order, want)
	}
}

// TestGatewayLlamaCppSlowStreamHandsItsSlotBack is
// TestRealLlamaCppSlowStreamHandsItsSlotBack against the sim engine in
// llama.cpp's dialect, so it runs where the real engine is absent.
func TestGatewayLlamaCppSlowStreamHandsItsSlotBack(t *testing.T) {
	slowStreamHandsItsSlotBack(t, simEngineWith(t, sim.Config{ServedModelName: "tiny", Dialect: sim.DialectLlamaCpp, Parallel: 1}))
}
