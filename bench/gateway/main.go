// Command gateway measures the HTTP gateway (node/gateway) on loopback
// against a real sim engine served in this process (`make
// bench-gateway-http`):
//
//  1. the latency a streamed completion adds at 1, 64 and 512 concurrent
//     streams, through the gateway and, in the same run, through a plain
//     httputil.ReverseProxy, both against calling the engine directly;
//  2. 10,000 concurrent streams through the gateway, counting errors;
//  3. the memory of idle streams (opened, no token yet) through the gateway
//     against the same streams opened directly on the engine: the
//     difference is what the gateway holds per stream.
//
// The gateway's view of the cluster is a fixed one-replica table (no Raft,
// no agent): what is measured is the HTTP path and the card's scheduler.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gpuplane/gpuplane/node/engine/sim"
	"github.com/gpuplane/gpuplane/node/gateway"
	"github.com/gpuplane/gpuplane/node/gateway/queue"
)

// fixed is a one-model cluster view: the engine at url, on this node.
type fixed struct{ models []gateway.Model }

func (f fixed) Models(context.Context) ([]gateway.Model, error) { return f.models, nil }
func (f fixed) Gateway(string) (string, bool)                   { return "", false }

// engine starts a sim engine in this process and returns its URL.
func engine(ctx context.Context, name string, tps float64) string {
	addr := make(chan net.Addr, 1)
	go func() {
		err := sim.Run(ctx, sim.Config{Host: "127.0.0.1", ServedModelName: name, MemoryMiB: 1024,
			TokensPerSecond: tps, Ready: func(a net.Addr) { addr <- a }})
		if err != nil {
			log.Fatal(err)
		}
	}()
	u := "http://" + (<-addr).String()
	for {
		resp, err := http.Get(u + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return u
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func serve(h http.Handler) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go func() { _ = (&http.Server{Handler: h}).Serve(ln) }()
	return "http://" + ln.Addr().String()
}

// startGateway serves a gateway in front of the engine at engineURL.
func startGateway(ctx context.Context, model, engineURL string) string {
	return startGatewayOn(ctx, model, engineURL, serve)
}

func startGatewayOn(ctx context.Context, model, engineURL string, serve func(http.Handler) string) string {
	g, err := gateway.New(gateway.Options{Node: "bench", MaxInFlight: 1 << 20, QueueLimit: 1 << 20,
		Queue: queue.Config{ColdWait: time.Minute},
		Cluster: fixed{[]gateway.Model{{Served: model, Deployment: model, Class: queue.Standard,
			Replicas: []gateway.Replica{{Deployment: model, Node: "bench", Endpoint: engineURL, Kind: "sim", Running: true, Resident: true}}}}},
	})
	if err != nil {
		log.Fatal(err)
	}
	go g.Run(ctx)
	u := serve(g)
	for { // the first refresh has placed the replica
		// An embedding: answered at once, however slowly the engine
		// generates.
		resp, err := http.Post(u+"/v1/embeddings", "application/json", strings.NewReader(`{"model":"`+model+`","input":"x"}`))
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return u
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func client(conns int) *http.Client {
	return &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: conns, IdleConnTimeout: 4 * time.Second}}
}

// h2cClient speaks HTTP/2 in clear: many streams on few connections.
func h2cClient() *http.Client {
	p := new(http.Protocols)
	p.SetUnencryptedHTTP2(true)
	return &http.Client{Transport: &http.Transport{Protocols: p}}
}

// serveH2C serves h with HTTP/1.1 and HTTP/2 in clear.
func serveH2C(h http.Handler) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	p := new(http.Protocols)
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	go func() { _ = (&http.Server{Handler: h, Protocols: p}).Serve(ln) }()
	return "http://" + ln.Addr().String()
}

// engineProcess runs `gpuplane engine sim` as its own process (its
// sockets count against its own open-file limit) and returns its URL.
func engineProcess(bin, name string, tps float64) (string, func()) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	cmd := exec.Command(bin, "engine", "sim", "--host", "127.0.0.1", "--port", strconv.Itoa(port), "--served-model-name", name,
		"--memory-mib", "1024", "--load-seconds", "0", "--tokens-per-second", strconv.FormatFloat(tps, 'g', -1, 64))
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		log.Fatal(err)
	}
	u := "http://127.0.0.1:" + strconv.Itoa(port)
	for {
		resp, err := http.Get(u + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return u, func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stream sends one streamed completion and reads it to [DONE].
func stream(c *http.Client, base, model string, tokens int) error {
	body := fmt.Sprintf(`{"model":%q,"prompt":"a short prompt","max_tokens":%d,"stream":true}`, model, tokens)
	resp, err := c.Post(base+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("%d: %s", resp.StatusCode, b)
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if sc.Text() == "data: [DONE]" {
			// Read to the end, so that the connection is reused.
			_, _ = io.Copy(io.Discard, resp.Body)
			return nil
		}
	}
	return fmt.Errorf("stream ended without [DONE]: %v", sc.Err())
}

// latencies runs conc workers, n requests in all, against base.
func latencies(c *http.Client, base, model string, conc, n, tokens int) ([]time.Duration, int) {
	var mu sync.Mutex
	var ds []time.Duration
	var errs int
	var next atomic.Int64
	var wg sync.WaitGroup
	for range conc {
		wg.Go(func() {
			for next.Add(1) <= int64(n) {
				start := time.Now()
				err := stream(c, base, model, tokens)
				d := time.Since(start)
				mu.Lock()
				if err != nil {
					errs++
					if errs <= 3 {
						log.Printf("stream %d to %s failed: %v", errs, base, err)
					}
				} else {
					ds = append(ds, d)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	slices.Sort(ds)
	return ds, errs
}

func pct(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	return ds[min(len(ds)-1, int(float64(len(ds))*p))]
}

func raiseFDs(want uint64) {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return
	}
	if l.Cur >= want {
		return
	}
	l.Cur = min(want, l.Max)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		log.Printf("raise the open-file limit to %d: %v", l.Cur, err)
	}
}

// mem is the Go heap and stacks in use after a collection, and the
// goroutines.
type mem struct{ heap, stacks, goroutines int64 }

func memNow() mem {
	// Twice: buffers in sync.Pools survive one collection.
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return mem{int64(m.HeapAlloc), int64(m.StackInuse), int64(runtime.NumGoroutine())}
}

func (m mem) minus(o mem) mem {
	return mem{m.heap - o.heap, m.stacks - o.stacks, m.goroutines - o.goroutines}
}

// idle opens n streams on base whose first token is far off, and returns
// the memory they hold once open (the engine has not sent even its
// headers, so "open" is after a pause); stop ends them.
func idle(base, model string, n int) (mem, func()) {
	ctx, cancel := context.WithCancel(context.Background())
	c := client(n)
	var done sync.WaitGroup
	before := memNow()
	for range n {
		done.Go(func() {
			body := fmt.Sprintf(`{"model":%q,"prompt":"x","max_tokens":2,"stream":true}`, model)
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/completions", strings.NewReader(body))
			resp, err := c.Do(req)
			if err != nil {
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		})
	}
	time.Sleep(3*time.Second + time.Duration(n)*time.Millisecond)
	held := memNow().minus(before)
	return held, func() {
		cancel()
		done.Wait()
		c.CloseIdleConnections()
	}
}

func main() {
	requests := flag.Int("requests", 2000, "streams per point (per target and concurrency)")
	tokens := flag.Int("tokens", 16, "tokens per stream")
	bin := flag.String("bin", "bin/gpuplane", "the gpuplane binary, for the engine of the many-streams run")
	many := flag.Int("many", 10000, "concurrent streams of the error-count run")
	idleN := flag.Int("idle", 2000, "idle streams of the memory run")
	conc := flag.String("concurrency", "1,64,512", "concurrent streams of the overhead points")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the overhead points here")
	memprofile := flag.String("memprofile", "", "write a heap profile here while the idle streams are open through the gateway")
	flag.Parse()
	if *memprofile != "" {
		runtime.MemProfileRate = 1024
	}
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			log.Fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			log.Fatal(err)
		}
	}
	debug.SetGCPercent(100)
	raiseFDs(uint64(*many)*2 + 1000)
	ctx := context.Background()

	// 1. Overhead: an engine that answers at once, so the path is what is
	// measured.
	fast := engine(ctx, "fast", 0)
	gw := startGateway(ctx, "fast", fast)
	target, _ := url.Parse(fast)
	// The proxy gets the gateway's engine transport: same pooling.
	proxy := serve(&httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(target) }, FlushInterval: -1,
		Transport: &http.Transport{MaxIdleConnsPerHost: 1024, IdleConnTimeout: 90 * time.Second}})
	fmt.Printf("GOMAXPROCS=%d, %d streams of %d tokens per point; engine %s, proxy %s, gateway %s\n\n", runtime.GOMAXPROCS(0), *requests, *tokens, fast, proxy, gw)
	fmt.Println("| concurrent streams | direct p50 | proxy p50 | gateway p50 | proxy added p50 | gateway added p50 | gateway/proxy added | direct p99 | proxy p99 | gateway p99 | errors |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|---|")
	for _, cs := range strings.FieldsFunc(*conc, func(r rune) bool { return r == ',' }) {
		conc, err := strconv.Atoi(strings.TrimSpace(cs))
		if err != nil || conc <= 0 {
			log.Fatalf("-concurrency: %q is not a positive number", cs)
		}
		c := client(conc)
		n := max(*requests, conc*2)
		// Warm the connections of each path.
		for _, b := range []string{fast, proxy, gw} {
			latencies(c, b, "fast", conc, conc, *tokens)
		}
		var d, p, g []time.Duration
		errs := 0
		// Three rounds, the paths interleaved, against drift in the load.
		for range 3 {
			x, e1 := latencies(c, fast, "fast", conc, n/3, *tokens)
			y, e2 := latencies(c, proxy, "fast", conc, n/3, *tokens)
			z, e3 := latencies(c, gw, "fast", conc, n/3, *tokens)
			d, p, g = append(d, x...), append(p, y...), append(g, z...)
			errs += e1 + e2 + e3
		}
		slices.Sort(d)
		slices.Sort(p)
		slices.Sort(g)
		pa, ga := pct(p, .5)-pct(d, .5), pct(g, .5)-pct(d, .5)
		ratio := "-"
		if pa > 0 {
			ratio = fmt.Sprintf("%.2f", float64(ga)/float64(pa))
		}
		fmt.Printf("| %d | %v | %v | %v | %v | %v | %s | %v | %v | %v | %d |\n", conc,
			r(pct(d, .5)), r(pct(p, .5)), r(pct(g, .5)), r(pa), r(ga), ratio, r(pct(d, .99)), r(pct(p, .99)), r(pct(g, .99)), errs)
		c.CloseIdleConnections()
	}

	pprof.StopCPUProfile()
	if *many > 0 {
		manyStreams(ctx, *bin, *many)
	}
	if *idleN == 0 {
		return
	}
	// 3. Idle streams: the engine's first token is 100 s away. The engine
	// runs in its own process, so that this one holds the clients (and,
	// through the gateway, the gateway): the difference is the gateway's.
	idleEngine, stopIdle := engineProcess(*bin, "idle", 0.01)
	defer stopIdle()
	gwIdle := startGateway(ctx, "idle", idleEngine)
	directHeld, stop := idle(idleEngine, "idle", *idleN)
	stop()
	if *memprofile != "" {
		runtime.GC()
		f, err := os.Create(*memprofile + ".base")
		if err != nil {
			log.Fatal(err)
		}
		if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
			log.Fatal(err)
		}
		f.Close()
	}
	gwHeld, stop := idle(gwIdle, "idle", *idleN)
	if *memprofile != "" {
		runtime.GC()
		f, err := os.Create(*memprofile)
		if err != nil {
			log.Fatal(err)
		}
		if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
			log.Fatal(err)
		}
		f.Close()
	}
	stop()
	stopIdle()
	// What net/http's server alone holds per connection: a handler that
	// reads the body and waits.
	release := make(chan struct{})
	bare := serve(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	bareHeld, stop := idle(bare, "idle", *idleN)
	close(release)
	stop()
	b := bareHeld.minus(directHeld)
	fmt.Printf("\n%d requests waiting in a bare net/http handler: %.1f KiB per connection (heap %.1f KiB, stacks %.1f KiB, %.2f goroutines)",
		*idleN, float64(b.heap+b.stacks)/float64(*idleN)/1024, float64(b.heap)/float64(*idleN)/1024, float64(b.stacks)/float64(*idleN)/1024, float64(b.goroutines)/float64(*idleN))
	d := gwHeld.minus(directHeld)
	n := float64(*idleN)
	fmt.Printf("\n%d idle streams: heap+stacks %.1f MiB opened directly, %.1f MiB through the gateway: %.1f KiB per stream in the gateway (heap %.1f KiB, stacks %.1f KiB, %.2f goroutines)\n",
		*idleN, float64(directHeld.heap+directHeld.stacks)/(1<<20), float64(gwHeld.heap+gwHeld.stacks)/(1<<20),
		float64(d.heap+d.stacks)/n/1024, float64(d.heap)/n/1024, float64(d.stacks)/n/1024, float64(d.goroutines)/n)
	os.Exit(0)
}

// manyStreams runs many concurrent streams through a gateway and counts
// the errors.
func manyStreams(ctx context.Context, bin string, many int) {
	// 2. Many concurrent streams: a slow engine, in a process of its own,
	// keeps each open ~3 s; the clients speak HTTP/2 to the gateway, so
	// that this process holds one socket per stream (to the engine), not
	// three.
	slow, stopSlow := engineProcess(bin, "slow", 1)
	gwSlow := startGatewayOn(ctx, "slow", slow, serveH2C)
	c := h2cClient()
	start := time.Now()
	_, errs := latencies(c, gwSlow, "slow", many, many, 3)
	fmt.Printf("\n%d concurrent streams of 3 tokens at 1 token/s through the gateway: %d errors, %v for all\n", many, errs, time.Since(start).Round(time.Millisecond))
	c.CloseIdleConnections()
	stopSlow()
}

func r(d time.Duration) time.Duration {
	switch {
	case d > 10*time.Millisecond:
		return d.Round(100 * time.Microsecond)
	case d > time.Millisecond:
		return d.Round(10 * time.Microsecond)
	}
	return d.Round(time.Microsecond)
}
