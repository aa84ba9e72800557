// Command flood measures, live, how far a background flood pushes back an
// interactive tenant (`make bench-flood`; docs/gateway.md, Admission):
// one `gpuplane agent --dev` on a simulated l4, one pinned interactive sim
// deployment `chat` (--max-num-seqs 16 --tokens-per-second 40 by default),
// tenant heavy keeping 120 streams of 200 tokens open at background
// priority, tenant light sending one short streamed interactive request
// every half second. It reports light's time to first token idle and
// under the flood, against the bound 2 × idle p95 + 0.3 s, for each
// engine scheduling policy asked for: fcfs (the gateway cuts a background
// stream to make room) and priority (the engine pauses one).
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

func main() {
	bin := flag.String("bin", "bin/gpuplane", "the gpuplane binary")
	streams := flag.Int("streams", 120, "heavy's background streams kept open")
	tokens := flag.Int("tokens", 200, "tokens per heavy stream")
	seqs := flag.Int("seqs", 16, "the engine's --max-num-seqs")
	tps := flag.Float64("tps", 40, "the engine's --tokens-per-second")
	every := flag.Duration("every", 500*time.Millisecond, "light's interval")
	samples := flag.Int("samples", 40, "light's requests per phase")
	policies := flag.String("policies", "fcfs,priority", "engine --scheduling-policy values to run, comma-separated")
	flag.Parse()
	ok := true
	for _, p := range strings.Split(*policies, ",") {
		r, err := run(*bin, strings.TrimSpace(p), *streams, *tokens, *seqs, *tps, *every, *samples)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench/flood:", err)
			os.Exit(1)
		}
		ok = r && ok
	}
	if !ok {
		os.Exit(1)
	}
}

func freePorts(n int) []int {
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			panic(err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports
}

func cli(bin, addr string, args ...string) error {
	out, err := exec.Command(bin, append([]string{"--addr", addr}, args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("gpuplane %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

func run(bin, policy string, streams, tokens, seqs int, tps float64, every time.Duration, samples int) (bool, error) {
	dir, err := os.MkdirTemp("", "bench-flood-")
	if err != nil {
		return false, err
	}
	defer os.RemoveAll(dir)
	ports := freePorts(4)
	logf, err := os.Create(filepath.Join(dir, "agent.log"))
	if err != nil {
		return false, err
	}
	agent := exec.Command(bin, "agent", "--dev", "--node-name", "flood", "--data-dir", filepath.Join(dir, "data"),
		"--api-port", strconv.Itoa(ports[0]), "--raft-port", strconv.Itoa(ports[1]), "--gossip-port", strconv.Itoa(ports[2]),
		"--gateway-port", strconv.Itoa(ports[3]), "--sim-gpus", "l4=1")
	agent.Stdout, agent.Stderr = logf, logf
	agent.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := agent.Start(); err != nil {
		return false, err
	}
	defer func() {
		// The agent and the engines it started.
		_ = syscall.Kill(-agent.Process.Pid, syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = agent.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = syscall.Kill(-agent.Process.Pid, syscall.SIGKILL)
			<-done
		}
	}()
	api := "http://127.0.0.1:" + strconv.Itoa(ports[0])
	gw := "http://127.0.0.1:" + strconv.Itoa(ports[3])
	if err := until(90*time.Second, func() bool {
		resp, err := http.Get(api + "/healthz")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == http.StatusOK
	}); err != nil {
		return false, fmt.Errorf("agent never healthy (log %s)", logf.Name())
	}
	if err := cli(bin, api, "accelerators", "create", "shared", "--device", "l4", "--tenancy", "shared", "--max-models", "2"); err != nil {
		return false, err
	}
	desc := fmt.Sprintf(`resource: ModelDeployment
resourceVersion: v1
metadata: {name: chat}
spec:
  model: /models/chat
  placement: {accelerator: shared}
  residency: pinned
  priority: interactive
  engine: {kind: sim, memoryPercent: 40, args: [--max-num-seqs, "%d", --tokens-per-second, "%g", --scheduling-policy, %s]}
`, seqs, tps, policy)
	path := filepath.Join(dir, "chat.yaml")
	if err := os.WriteFile(path, []byte(desc), 0o644); err != nil {
		return false, err
	}
	if err := cli(bin, api, "apply", "-f", path); err != nil {
		return false, err
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: streams + 16}}
	if err := until(120*time.Second, func() bool {
		_, err := stream(context.Background(), client, gw, "light", "interactive", 1, nil)
		return err == nil
	}); err != nil {
		return false, fmt.Errorf("chat never answered through the gateway (log %s)", logf.Name())
	}
	light := func() []time.Duration {
		var ttft []time.Duration
		tick := time.NewTicker(every)
		defer tick.Stop()
		var mu sync.Mutex
		var wg sync.WaitGroup
		for range samples {
			<-tick.C
			wg.Go(func() {
				d, err := stream(context.Background(), client, gw, "light", "interactive", 8, nil)
				if err != nil {
					fmt.Fprintln(os.Stderr, "light:", err)
					return
				}
				mu.Lock()
				ttft = append(ttft, d)
				mu.Unlock()
			})
		}
		wg.Wait()
		slices.Sort(ttft)
		return ttft
	}
	idle := light()

	flood, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var done, cut, got atomic.Int64
	for range streams {
		wg.Go(func() {
			for flood.Err() == nil {
				var st streamStats
				if _, err := stream(flood, client, gw, "heavy", "background", tokens, &st); err == nil {
					done.Add(1)
				}
				got.Add(int64(st.tokens))
				if st.preempted {
					cut.Add(1)
				}
			}
		})
	}
	time.Sleep(3 * time.Second) // the flood fills the engine and the queue
	began, before := time.Now(), got.Load()
	loaded := light()
	heavyRate := float64(got.Load()-before) / time.Since(began).Seconds()
	stop()
	wg.Wait()

	p := func(s []time.Duration, q float64) time.Duration {
		if len(s) == 0 {
			return 0
		}
		return s[min(len(s)-1, int(q*float64(len(s))))]
	}
	bound := 2*p(idle, 0.95) + 300*time.Millisecond
	pass := len(loaded) == samples && p(loaded, 0.95) <= bound
	verdict := "PASS"
	if !pass {
		verdict = "FAIL"
	}
	fmt.Printf("engine --scheduling-policy %s, --max-num-seqs %d, --tokens-per-second %g; heavy %d background streams of %d tokens\n",
		policy, seqs, tps, streams, tokens)
	fmt.Printf("  light TTFT idle:   p50 %s  p95 %s  (%d requests)\n", r(p(idle, 0.5)), r(p(idle, 0.95)), len(idle))
	fmt.Printf("  light TTFT flood:  p50 %s  p95 %s  (%d requests)\n", r(p(loaded, 0.5)), r(p(loaded, 0.95)), len(loaded))
	fmt.Printf("  bound 2 x idle p95 + 0.3s = %s: %s\n", r(bound), verdict)
	fmt.Printf("  heavy: %d streams finished, %d cut by the gateway for light, %.0f tokens/s during the measurement\n",
		done.Load(), cut.Load(), heavyRate)
	return pass, nil
}

func r(d time.Duration) string { return d.Round(time.Millisecond).String() }

type streamStats struct {
	tokens    int
	preempted bool
}

// stream sends one streamed completion and reads it to the end; it returns
// the time to the first token.
func stream(ctx context.Context, c *http.Client, gw, tenant, class string, maxTokens int, st *streamStats) (time.Duration, error) {
	body := fmt.Sprintf(`{"model":"chat","prompt":"hello there","max_tokens":%d,"stream":true}`, maxTokens)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, gw+"/v1/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Gpuplane-Tenant", tenant)
	req.Header.Set("X-Gpuplane-Priority", class)
	start := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("%s", resp.Status)
	}
	var ttft time.Duration
	br := bufio.NewReader(resp.Body)
	n := 0
	for {
		line, err := br.ReadString('\n')
		if strings.HasPrefix(line, "data: {") {
			if strings.Contains(line, `"preempted"`) {
				if st != nil {
					st.preempted = true
				}
				return ttft, fmt.Errorf("preempted")
			}
			if strings.Contains(line, `"text":"`) && !strings.Contains(line, `"text":""`) {
				if n == 0 {
					ttft = time.Since(start)
				}
				n++
				if st != nil {
					st.tokens = n
				}
			}
		}
		if err != nil {
			break
		}
	}
	if n == 0 {
		return 0, fmt.Errorf("no token")
	}
	return ttft, nil
}

func until(timeout time.Duration, f func() bool) error {
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if f() {
			return nil
		}
	}
	return fmt.Errorf("timed out")
}
