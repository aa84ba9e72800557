package sim

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/node/inventory"
)

// startSGLang runs the sglang dialect on GPU-a of a 23034 MiB card at
// fraction of the card, with the memory saver and its weights' CPU backup
// as given; it returns the engine's address, or the error its start ended
// with.
func startSGLang(t *testing.T, usage *inventory.SimUsage, fraction float64, saver, backup bool) (string, error) {
	t.Helper()
	addrc := make(chan net.Addr, 1)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Config{Host: "127.0.0.1", ServedModelName: "chat", Dialect: DialectSGLang,
			MemoryMiB: 4000, OverheadMiB: 300, ResidualMiB: 300, CardMiB: 23034, MemFractionStatic: fraction,
			EnableMemorySaver: saver, WeightsCPUBackup: backup,
			CardUUIDs: []string{"GPU-a"}, Usage: usage, Ready: func(a net.Addr) { addrc <- a }})
	}()
	base := "http://" + (<-addrc).String()
	deadline := time.Now().Add(5 * time.Second)
	for {
		select {
		case err := <-done:
			return "", err
		default:
		}
		if resp, err := http.Get(base + "/health"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return base, nil
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the sglang dialect neither started nor failed")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// holds is what the processes other than pid hold on GPU-a.
func holds(t *testing.T, usage *inventory.SimUsage, pid int) uint64 {
	t.Helper()
	procs, err := usage.Processes("GPU-a")
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, p := range procs {
		if p.PID != pid {
			n += p.UsedMiB
		}
	}
	return n
}

func sgPost(t *testing.T, url, body string) (int, string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// The sglang dialect sizes itself as SGLang does: --mem-fraction-static of
// the whole card less what its neighbours hold (a fraction they fill fails
// the start with SGLang's words); a release without the memory saver
// answers 200 and frees nothing; with it, the memory goes, and a resume
// without the weights' CPU backup leaves requests refused; vLLM's routes
// are FastAPI's 404.
func TestSGLangDialectMemory(t *testing.T) {
	usage := inventory.NewSimUsage(t.TempDir())
	n := newNeighbour(t, usage, 5000)
	if _, err := startSGLang(t, usage, 0.2, true, true); err == nil || !strings.Contains(err.Error(), "Not enough memory. Please try to increase --mem-fraction-static.") {
		t.Errorf("a fraction of 4606 MiB beside 5000 MiB of neighbours: %v, want SGLang's refusal", err)
	}

	base, err := startSGLang(t, usage, 0.5, false, true)
	if err != nil {
		t.Fatal(err)
	}
	// 0.5 of 23034 MiB is 11517 MiB of the card, 5000 of it the neighbour's.
	if got := holds(t, usage, n.pid); got != 11517-5000 {
		t.Errorf("the engine holds %d MiB, want %d", got, 11517-5000)
	}
	if code, body := sgPost(t, base+"/release_memory_occupation", `{"tags": null}`); code != http.StatusOK {
		t.Errorf("release without the memory saver: %d %s, want 200", code, body)
	}
	if got := holds(t, usage, n.pid); got != 11517-5000 {
		t.Errorf("after a release without the memory saver the engine holds %d MiB, want all of its %d", got, 11517-5000)
	}
	if code, body := sgPost(t, base+"/sleep?level=1", ""); code != http.StatusNotFound || body != `{"detail":"Not Found"}`+"\n" {
		t.Errorf("vLLM's /sleep: %d %q, want FastAPI's 404", code, body)
	}

	usage2 := inventory.NewSimUsage(t.TempDir())
	base, err = startSGLang(t, usage2, 0.5, true, false)
	if err != nil {
		t.Fatal(err)
	}
	if code, body := sgPost(t, base+"/release_memory_occupation", `{}`); code != http.StatusOK {
		t.Fatalf("release: %d %s", code, body)
	}
	if got := holds(t, usage2, 0); got != 300 {
		t.Errorf("released, the engine holds %d MiB, want its 300 MiB residual", got)
	}
	if code, body := sgPost(t, base+"/resume_memory_occupation", `{"tags": null}`); code != http.StatusOK {
		t.Fatalf("resume: %d %s", code, body)
	}
	if code, body := sgPost(t, base+"/v1/completions", `{"model": "chat", "prompt": "hi", "max_tokens": 1}`); code == http.StatusOK || !strings.Contains(body, "--enable-weights-cpu-backup") {
		t.Errorf("a request after a resume without the weights' backup: %d %s, want it refused naming the flag", code, body)
	}
	if code, body := sgPost(t, base+"/load_lora_adapter", `{"lora_name": "sql", "lora_path": "/a/sql"}`); code != http.StatusBadRequest || !strings.Contains(body, `"success":false`) || !strings.Contains(body, "--enable-lora") {
		t.Errorf("a load without --enable-lora: %d %s, want 400 success false", code, body)
	}
}
