package sim

import (
	"context"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/node/inventory"
)

// neighbour is another process on the simulated card, holding mib.
type neighbour struct {
	t     *testing.T
	usage *inventory.SimUsage
	pid   int
}

func newNeighbour(t *testing.T, usage *inventory.SimUsage, mib uint64) *neighbour {
	t.Helper()
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	n := &neighbour{t: t, usage: usage, pid: cmd.Process.Pid}
	n.hold(mib)
	return n
}

func (n *neighbour) hold(mib uint64) {
	if err := n.usage.Register("GPU-a", n.pid, mib); err != nil {
		n.t.Fatal(err)
	}
}

// startVLLM runs the vllm dialect on GPU-a of a 23034 MiB card, calling
// during once its start began; it returns the engine's address, or the
// error its start ended with.
func startVLLM(t *testing.T, usage *inventory.SimUsage, during func()) (string, error) {
	t.Helper()
	addrc := make(chan net.Addr, 1)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Config{Host: "127.0.0.1", ServedModelName: "chat", Dialect: DialectVLLM,
			InitTime: 300 * time.Millisecond, WakeTime: 300 * time.Millisecond, MemoryMiB: 4000, KVPoolMiB: 1000,
			OvershootMiB: 1434, CardMiB: 23034, VLLMDevMode: true, EnableSleepMode: true,
			CardUUIDs: []string{"GPU-a"}, Usage: usage, Ready: func(a net.Addr) { addrc <- a }})
	}()
	base := "http://" + (<-addrc).String()
	// Into its 300 ms of start.
	time.Sleep(100 * time.Millisecond)
	during()
	deadline := time.Now().Add(5 * time.Second)
	for {
		select {
		case err := <-done:
			return "", err
		default:
		}
		// A start that failed closes the listener: a refused connection
		// means the error is on its way to done.
		if resp, err := http.Get(base + "/health"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return base, nil
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the vllm dialect neither started nor failed")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The vllm dialect measures its card as vLLM does: free memory that rises
// while it starts fails the start, free memory that falls comes out of its
// KV pool (past it, the start fails), its process holds its overshoot
// above its budget, and a sleep during which its neighbours grew by more
// than it freed fails with vLLM's assertion, asleep all the same.
func TestVLLMDialectMeasuresItsCard(t *testing.T) {
	usage := inventory.NewSimUsage(t.TempDir())
	n := newNeighbour(t, usage, 5000)
	if _, err := startVLLM(t, usage, func() { n.hold(4000) }); err == nil ||
		!strings.Contains(err.Error(), "Error in memory profiling. Initial free memory 17.61 GiB, current free memory 18.59 GiB") {
		t.Errorf("a neighbour freeing 1000 MiB while vLLM profiles: %v, want vLLM's assertion", err)
	}
	if _, err := startVLLM(t, usage, func() { n.hold(5500) }); err == nil || !strings.Contains(err.Error(), "No available memory for the cache blocks") {
		t.Errorf("a neighbour taking 1500 MiB while vLLM profiles, KV pool 1000 MiB: %v, want no cache blocks", err)
	}
	n.hold(5000)
	base, err := startVLLM(t, usage, func() { n.hold(5400) })
	if err != nil {
		t.Fatalf("a neighbour taking 400 MiB while vLLM profiles, KV pool 1000 MiB: %v, want a start with a smaller KV pool", err)
	}
	procs, _ := usage.Processes("GPU-a")
	for _, p := range procs {
		// Its budget less the KV pool, empty while idle, and its
		// overshoot.
		if p.PID != n.pid && p.UsedMiB != 3000+1434 {
			t.Errorf("awake, the engine holds %d MiB, want its weights and overshoot, %d", p.UsedMiB, 3000+1434)
		}
	}
	slept := make(chan *http.Response, 1)
	go func() {
		resp, err := http.Post(base+"/sleep?level=1", "", nil)
		if err != nil {
			t.Error(err)
		}
		slept <- resp
	}()
	time.Sleep(100 * time.Millisecond)
	n.hold(5400 + 5000) // more than the 4434 MiB the sleep frees
	resp := <-slept
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusInternalServerError || !strings.Contains(string(body), "Memory usage increased after sleeping.") {
		t.Errorf("a sleep while the neighbour grew 5000 MiB: %d %s, want 500 with vLLM's assertion", resp.StatusCode, body)
	}
}
