package sim

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/node/inventory"
)

func TestSimServesAfterLoadingAndRegistersMemory(t *testing.T) {
	usage := inventory.NewSimUsage(t.TempDir())
	addrc := make(chan net.Addr, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Config{
			Host: "127.0.0.1", ServedModelName: "chat", LoadTime: 300 * time.Millisecond,
			MemoryMiB: 4096, TokensPerSecond: 1000, CardUUIDs: []string{"GPU-a", "GPU-b"}, Usage: usage,
			Ready: func(a net.Addr) { addrc <- a },
		})
	}()
	base := "http://" + (<-addrc).String()

	if code := get(t, base+"/health"); code != http.StatusServiceUnavailable {
		t.Fatalf("/health while loading = %d, want 503", code)
	}
	if procs, _ := usage.Processes("GPU-a"); len(procs) != 0 {
		t.Fatalf("memory registered before loading: %v", procs)
	}
	deadline := time.Now().Add(5 * time.Second)
	for get(t, base+"/health") != http.StatusOK {
		if time.Now().After(deadline) {
			t.Fatal("/health never answered 200")
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, card := range []string{"GPU-a", "GPU-b"} {
		procs, err := usage.Processes(card)
		if err != nil || len(procs) != 1 || procs[0].PID != os.Getpid() || procs[0].UsedMiB != 4096 {
			t.Fatalf("usage of %s = %v, %v; want this process at 4096 MiB", card, procs, err)
		}
	}

	var models struct {
		Data []struct{ ID string } `json:"data"`
	}
	getJSON(t, base+"/v1/models", &models)
	if len(models.Data) != 1 || models.Data[0].ID != "chat" {
		t.Fatalf("/v1/models = %+v", models)
	}

	var chat struct {
		Object  string `json:"object"`
		Choices []struct {
			Message struct{ Role, Content string } `json:"message"`
		} `json:"choices"`
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	post(t, base+"/v1/chat/completions", `{"model":"chat","messages":[{"role":"user","content":"hi there"}],"max_tokens":5}`, &chat)
	if chat.Object != "chat.completion" || len(chat.Choices) != 1 || chat.Choices[0].Message.Role != "assistant" ||
		chat.Usage.CompletionTokens != 5 || len(strings.Fields(chat.Choices[0].Message.Content)) != 5 {
		t.Fatalf("chat completion = %+v", chat)
	}
	var completion struct {
		Choices []struct{ Text string } `json:"choices"`
	}
	post(t, base+"/v1/completions", `{"prompt":"once upon","max_tokens":3}`, &completion)
	if len(completion.Choices) != 1 || len(strings.Fields(completion.Choices[0].Text)) != 3 {
		t.Fatalf("completion = %+v", completion)
	}

	if text := streamChat(t, base, `{"model":"chat","stream":true,"max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`); len(strings.Fields(text)) != 4 {
		t.Fatalf("streamed %q, want 4 words", text)
	}

	resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"other","messages":[{"role":"user","content":"x"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("unknown model answered %d, want 404", resp.StatusCode)
	}

	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if procs, _ := usage.Processes("GPU-a"); len(procs) != 0 {
		t.Fatalf("memory still registered after stopping: %v", procs)
	}
}

// streamChat posts a streaming chat request and returns the concatenated
// deltas, checking the SSE framing and the final [DONE].
func streamChat(t *testing.T, base, body string) string {
	t.Helper()
	resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("Content-Type = %q", ct)
	}
	var text strings.Builder
	sc := bufio.NewScanner(resp.Body)
	done := false
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if line == "[DONE]" {
			done = true
			break
		}
		var chunk struct {
			Object  string `json:"object"`
			Choices []struct {
				Delta struct{ Content string } `json:"delta"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(line), &chunk); err != nil || chunk.Object != "chat.completion.chunk" {
			t.Fatalf("bad chunk %q: %v", line, err)
		}
		text.WriteString(chunk.Choices[0].Delta.Content)
	}
	if !done {
		t.Fatal("stream ended without [DONE]")
	}
	return text.String()
}

func get(t *testing.T, url string) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatal(err)
	}
}

func post(t *testing.T, url, body string, v any) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST %s: %s", url, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatal(err)
	}
}
