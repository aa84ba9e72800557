// Command gateway measures the HTTP gateway (node/gateway) on loopback
// against a real sim engine served in this process (`make
// bench-gateway-http`):
//
//  1. the latency a streamed completion adds at 1, 64 and 512 concurrent
//     streams, through the gateway and, in the same run, through a plain
//     httputil.ReverseProxy, both against calling the engine directly;
//  2. 10,000 concurrent h2c streams through a gateway in a process of its
//     own (this binary, -serve) to an engine process, counting errors;
//  3. the memory of idle streams (opened, no token yet), HTTP/1.1 and h2c
//     clients, in a gateway process of its own (this binary, -serve),
//     beside a bare net/http handler's: what the process holds more with
//     the streams open is what they cost it.
//
// The gateway's view of the cluster is a fixed one-replica table (no Raft,
// no agent): what is measured is the HTTP path and the card's scheduler.
package main

import (
	"bufio"
	"context"
	"encoding/json"
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

	"github.com/gpuplane/gpuplane/internal/engines"
	"github.com/gpuplane/gpuplane/node/gateway"
	"github.com/gpuplane/gpuplane/node/gateway/queue"
	"github.com/gpuplane/gpuplane/node/sim"
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
			Replicas: []gateway.Replica{{Deployment: model, Node: "bench", Endpoint: engineURL, Kind: engines.Sim, Running: true, Resident: true}}}}},
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
type mem struct{ Heap, Stacks, Goroutines int64 }

func memNow() mem {
	// Twice: buffers in sync.Pools survive one collection (and a stack
	// shrinks by half at most per collection).
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return mem{int64(m.HeapAlloc), int64(m.StackInuse), int64(runtime.NumGoroutine())}
}

func (m mem) minus(o mem) mem {
	return mem{m.Heap - o.Heap, m.Stacks - o.Stacks, m.Goroutines - o.Goroutines}
}

// memPath answers a server process's memory (memNow), and writes a heap
// profile to the file named by ?profile= first.
const memPath = "/bench/mem"

func withMem(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != memPath {
			h.ServeHTTP(w, r)
			return
		}
		if p := r.URL.Query().Get("profile"); p != "" {
			runtime.GC()
			f, err := os.Create(p)
			if err == nil {
				err = pprof.Lookup("heap").WriteTo(f, 0)
				f.Close()
			}
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
		}
		_ = json.NewEncoder(w).Encode(memNow())
	})
}

// server is a server process of the idle-stream run: the bench binary
// itself run with -serve, its memory read at memPath.
type server struct {
	url  string
	cmd  *exec.Cmd
	memc *http.Client
}

// startServer runs this binary with -serve what (gateway ENGINE_URL, or
// bare) and returns its URL once it answers.
func startServer(what ...string) *server {
	self, err := os.Executable()
	if err != nil {
		log.Fatal(err)
	}
	args := []string{"-serve", strings.Join(what, " ")}
	if runtime.MemProfileRate == 1024 {
		args = append(args, "-memprofile", "child")
	}
	cmd := exec.Command(self, args...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		log.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		log.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		log.Fatalf("server %v: %v", what, err)
	}
	return &server{url: strings.TrimSpace(line), cmd: cmd, memc: client(1)}
}

func (s *server) mem(profile string) mem {
	u := s.url + memPath
	if profile != "" {
		u += "?profile=" + url.QueryEscape(profile)
	}
	resp, err := s.memc.Get(u)
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	var m mem
	if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
		log.Fatal(err)
	}
	return m
}

func (s *server) stop() {
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
}

// serveChild is the server process of the idle-stream run: a gateway in
// front of the engine at what's URL, or a bare net/http handler that reads
// the body and waits; both speak HTTP/1.1 and h2c on one port.
func serveChild(what string) {
	ctx := context.Background()
	var h http.Handler
	switch kind, arg, _ := strings.Cut(what, " "); kind {
	case "gateway":
		model, engineURL, ok := strings.Cut(arg, " ")
		if !ok {
			log.Fatalf("-serve %q: gateway MODEL ENGINE_URL", what)
		}
		// startGatewayOn serves, then checks that the replica is placed.
		u := startGatewayOn(ctx, model, engineURL, func(h http.Handler) string { return serveH2C(withMem(h)) })
		fmt.Println(u)
		select {}
	case "bare":
		h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			<-r.Context().Done()
		})
	default:
		log.Fatalf("-serve %q: gateway MODEL ENGINE_URL, or bare", what)
	}
	fmt.Println(serveH2C(withMem(h)))
	select {}
}

// idle opens n streams on s with c whose first token is far off, and
// returns the memory s holds for them once open (the engine has not sent
// even its headers, so "open" is after a pause); stop ends them.
func idle(s *server, c *http.Client, n int, profile string) (mem, func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var done sync.WaitGroup
	before := s.mem("")
	var errs atomic.Int64
	for range n {
		done.Go(func() {
			body := `{"model":"idle","prompt":"x","max_tokens":2,"stream":true}`
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.url+"/v1/completions", strings.NewReader(body))
			resp, err := c.Do(req)
			if err != nil {
				if ctx.Err() == nil {
					errs.Add(1)
				}
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		})
	}
	time.Sleep(3*time.Second + time.Duration(n)*time.Millisecond)
	held := s.mem(profile).minus(before)
	if e := errs.Load(); e > 0 {
		log.Printf("%d of %d idle streams failed to open", e, n)
	}
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
	memprofile := flag.String("memprofile", "", "write heap profiles of the gateway's process to FILE.http1.1[.base] and FILE.h2c[.base]: before and while the idle streams are open")
	serveWhat := flag.String("serve", "", "run as a server process of the many-streams or idle run (internal)")
	flag.Parse()
	if *serveWhat != "" {
		if *memprofile != "" {
			runtime.MemProfileRate = 1024
		}
		serveChild(*serveWhat)
	}
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
	// 3. Idle streams: the engine's first token is 100 s away. The
	// gateway runs in a process of its own (this binary, -serve), the
	// engine in another: what the gateway's process holds more with the
	// streams open is what they cost it. Clients speak HTTP/1.1 (a
	// connection per stream) or h2c (many streams per connection).
	idleEngine, stopIdle := engineProcess(*bin, "idle", 0.01)
	defer stopIdle()
	n := float64(*idleN)
	row := func(what string, d mem) {
		fmt.Printf("| %s | %.1f KiB | %.1f KiB | %.1f KiB | %.2f |\n", what,
			float64(d.Heap+d.Stacks)/n/1024, float64(d.Heap)/n/1024, float64(d.Stacks)/n/1024, float64(d.Goroutines)/n)
	}
	fmt.Printf("\n%d idle streams (first token 100 s away), memory held per stream by the server's process (Go heap live after two collections, stacks):\n\n", *idleN)
	fmt.Println("| server, clients | per stream | heap | stacks | goroutines |")
	fmt.Println("|---|---|---|---|---|")
	for _, proto := range []struct {
		name string
		c    func() *http.Client
	}{{"HTTP/1.1", func() *http.Client { return client(*idleN) }}, {"h2c", h2cClient}} {
		gw := startServer("gateway", "idle", idleEngine)
		profile := ""
		if *memprofile != "" {
			profile = *memprofile + "." + strings.ReplaceAll(strings.ToLower(proto.name), "/", "")
			gw.mem(profile + ".base")
		}
		held, stop := idle(gw, proto.c(), *idleN, profile)
		stop()
		gw.stop()
		row("gateway, "+proto.name, held)
		// What net/http's server alone holds per request: a handler that
		// reads the body and waits.
		bare := startServer("bare")
		held, stop = idle(bare, proto.c(), *idleN, "")
		stop()
		bare.stop()
		row("bare net/http handler, "+proto.name, held)
	}
	stopIdle()
	os.Exit(0)
}

// manyStreams runs many concurrent streams through a gateway and counts
// the errors.
func manyStreams(ctx context.Context, bin string, many int) {
	// 2. Many concurrent streams: a slow engine, in a process of its own,
	// keeps each open ~3 s; the clients speak HTTP/2 to the gateway, so
	// that this process holds one socket per stream (to the engine), not
	// three.
	// The gateway runs in a process of its own too (-serve), as an
	// agent's does: in this one, the clients' sockets and the gateway's
	// would share one open-file limit.
	slow, stopSlow := engineProcess(bin, "slow", 1)
	gwSlow := startServer("gateway", "slow", slow)
	c := h2cClient()
	start := time.Now()
	_, errs := latencies(c, gwSlow.url, "slow", many, many, 3)
	fmt.Printf("\n%d concurrent streams of 3 tokens at 1 token/s through the gateway: %d errors, %v for all\n", many, errs, time.Since(start).Round(time.Millisecond))
	c.CloseIdleConnections()
	gwSlow.stop()
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
