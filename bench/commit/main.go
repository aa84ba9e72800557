// Command commit measures what a write costs through the whole stack: a real
// `gpuplane agent --dev` process, the Connect client over h2c, the handler's
// dry-run check, the Raft append with fsync, the state machine and the
// response. It first measures the fsync latency of the disk that holds the
// data dir, the floor no commit can beat, and reports how close the commit
// latency comes to it.
//
//	go run ./bench/commit -bin bin/gpuplane -duration 10s -clients 1,64
//
// It is a benchmark harness: it starts and kills a process, reads the clock
// and writes to a temporary dir, which it removes at the end.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"connectrpc.com/connect"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
	"github.com/gpuplane/gpuplane/proto/gpuplane/v1/gpuplanev1connect"
	"github.com/gpuplane/gpuplane/rpc"
)

// fsyncBlock is the size of one fsync probe write, about one batch of log
// entries.
const fsyncBlock = 4 << 10

// readySeeds are the accelerators created before the read benchmark, so that
// ListAccelerators returns something but measures the read path rather than
// serialisation of a large state.
const readySeeds = 16

type options struct {
	bin          string
	duration     time.Duration
	readDuration time.Duration
	clients      []int
	fsyncCount   int
	fsyncMax     time.Duration
	parent       string
	json         bool
}

func main() {
	var o options
	var clients string
	flag.StringVar(&o.bin, "bin", "bin/gpuplane", "the gpuplane binary to run as the agent")
	flag.DurationVar(&o.duration, "duration", 10*time.Second, "how long each write phase runs")
	flag.DurationVar(&o.readDuration, "read-duration", 3*time.Second, "how long the read phase runs")
	flag.StringVar(&clients, "clients", "1,64", "concurrent clients per write phase, comma-separated")
	flag.IntVar(&o.fsyncCount, "fsync-count", 500, "fsync probes (stops earlier at -fsync-max)")
	flag.DurationVar(&o.fsyncMax, "fsync-max", 3*time.Second, "longest the fsync probe runs")
	flag.StringVar(&o.parent, "data-dir-parent", "", "where to create the data dir (default: the system temp dir)")
	flag.BoolVar(&o.json, "json", false, "print the results as JSON instead of a table")
	flag.Parse()
	for _, s := range strings.Split(clients, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			fmt.Fprintf(os.Stderr, "bench/commit: -clients: %q is not a positive number\n", s)
			os.Exit(2)
		}
		o.clients = append(o.clients, n)
	}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "bench/commit:", err)
		os.Exit(1)
	}
}

// Stats summarises one phase's call latencies.
type Stats struct {
	Name      string  `json:"name"`
	Clients   int     `json:"clients,omitempty"`
	Calls     int     `json:"calls"`
	Errors    int     `json:"errors"`
	FirstErr  string  `json:"first_error,omitempty"`
	Seconds   float64 `json:"seconds"`
	PerSecond float64 `json:"per_second"`
	P50Ms     float64 `json:"p50_ms"`
	P99Ms     float64 `json:"p99_ms"`
	MaxMs     float64 `json:"max_ms"`
	// VsFsync is the p50 latency divided by the fsync p50.
	VsFsync float64 `json:"p50_vs_fsync_p50,omitempty"`
}

// Report is everything one run measured.
type Report struct {
	DataDir      string  `json:"data_dir"`
	Fsync        Stats   `json:"fsync"`
	Writes       []Stats `json:"writes"`
	Reads        Stats   `json:"reads"`
	Accelerators int     `json:"accelerators_listed"`
}

func run(o options) error {
	bin, err := filepath.Abs(o.bin)
	if err != nil {
		return err
	}
	if _, err := os.Stat(bin); err != nil {
		return fmt.Errorf("-bin: %w (run `make build` first)", err)
	}
	tmp, err := os.MkdirTemp(o.parent, "gpuplane-bench-")
	if err != nil {
		return fmt.Errorf("create data dir: %w", err)
	}
	defer os.RemoveAll(tmp)

	rep := Report{DataDir: tmp}
	if rep.Fsync, err = measureFsync(tmp, o.fsyncCount, o.fsyncMax); err != nil {
		return err
	}

	ag, err := startAgent(bin, filepath.Join(tmp, "data"), filepath.Join(tmp, "agent.log"))
	if err != nil {
		return err
	}
	defer ag.kill()
	if err := ag.waitReady(60 * time.Second); err != nil {
		return err
	}
	httpc := rpc.HTTPClient()
	accels := gpuplanev1connect.NewAcceleratorServiceClient(httpc, ag.url)

	ctx := context.Background()
	for i, n := range o.clients {
		st := measure(ctx, fmt.Sprintf("CreateAccelerator, %d clients", n), n, o.duration, func(ctx context.Context, client, seq int) error {
			_, err := accels.CreateAccelerator(ctx, connect.NewRequest(&pb.CreateAcceleratorRequest{
				Name: fmt.Sprintf("w%d-c%d-%d", i, client, seq),
				Spec: &pb.AcceleratorSpec{Device: "l4"},
			}))
			return err
		})
		st.VsFsync = st.P50Ms / rep.Fsync.P50Ms
		rep.Writes = append(rep.Writes, st)
	}

	// Reads run on a fresh agent with a small state: a listing of tens of
	// thousands of accelerators would measure serialisation, not the read path.
	ag.kill()
	ag, err = startAgent(bin, filepath.Join(tmp, "data-read"), filepath.Join(tmp, "agent-read.log"))
	if err != nil {
		return err
	}
	defer ag.kill()
	if err := ag.waitReady(60 * time.Second); err != nil {
		return err
	}
	accels = gpuplanev1connect.NewAcceleratorServiceClient(httpc, ag.url)
	for i := range readySeeds {
		if _, err := accels.CreateAccelerator(ctx, connect.NewRequest(&pb.CreateAcceleratorRequest{
			Name: fmt.Sprintf("seed-%d", i), Spec: &pb.AcceleratorSpec{Device: "l4"},
		})); err != nil {
			return fmt.Errorf("seed accelerators: %w", err)
		}
	}
	var listed sync.Map
	rep.Reads = measure(ctx, "ListAccelerators (linearizable), 64 clients", 64, o.readDuration, func(ctx context.Context, client, _ int) error {
		resp, err := accels.ListAccelerators(ctx, connect.NewRequest(&pb.ListAcceleratorsRequest{}))
		if err == nil {
			listed.Store(client, len(resp.Msg.Accelerators))
		}
		return err
	})
	listed.Range(func(_, v any) bool { rep.Accelerators = max(rep.Accelerators, v.(int)); return true })
	ag.kill()

	if o.json {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	printTable(os.Stdout, rep)
	for _, st := range append(slices.Clone(rep.Writes), rep.Reads) {
		if st.Errors > 0 {
			return fmt.Errorf("%s: %d of %d calls failed, first: %s", st.Name, st.Errors, st.Calls, st.FirstErr)
		}
	}
	return nil
}

// measureFsync appends fsyncBlock bytes and fsyncs, count times or until
// limit, in dir: the floor under every commit, since the Raft log fsyncs each
// batch before it is acknowledged. Go's File.Sync is fsync(2); on ext4 and xfs
// an append's fsync costs what fdatasync would, since the size changes.
func measureFsync(dir string, count int, limit time.Duration) (Stats, error) {
	f, err := os.CreateTemp(dir, "fsync-probe-")
	if err != nil {
		return Stats{}, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	buf := make([]byte, fsyncBlock)
	for i := range buf {
		buf[i] = byte(i)
	}
	lat := make([]time.Duration, 0, count)
	start := time.Now()
	for len(lat) < count && time.Since(start) < limit {
		t := time.Now()
		if _, err := f.Write(buf); err != nil {
			return Stats{}, fmt.Errorf("fsync probe: %w", err)
		}
		if err := f.Sync(); err != nil {
			return Stats{}, fmt.Errorf("fsync probe: %w", err)
		}
		lat = append(lat, time.Since(t))
	}
	return summarise("fsync, 4 KiB append", 1, lat, 0, "", time.Since(start)), nil
}

// measure runs clients goroutines that each call fn back to back for d and
// records every call's latency.
func measure(ctx context.Context, name string, clients int, d time.Duration, fn func(ctx context.Context, client, seq int) error) Stats {
	type result struct {
		lat      []time.Duration
		errs     int
		firstErr error
	}
	results := make([]result, clients)
	var wg sync.WaitGroup
	start := time.Now()
	stop := start.Add(d)
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := &results[c]
			for seq := 0; time.Now().Before(stop); seq++ {
				callCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
				t := time.Now()
				err := fn(callCtx, c, seq)
				el := time.Since(t)
				cancel()
				if err != nil {
					r.errs++
					if r.firstErr == nil {
						r.firstErr = err
					}
					continue
				}
				r.lat = append(r.lat, el)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	var lat []time.Duration
	errs, firstErr := 0, ""
	for _, r := range results {
		lat = append(lat, r.lat...)
		errs += r.errs
		if r.firstErr != nil && firstErr == "" {
			firstErr = r.firstErr.Error()
		}
	}
	return summarise(name, clients, lat, errs, firstErr, elapsed)
}

func summarise(name string, clients int, lat []time.Duration, errs int, firstErr string, elapsed time.Duration) Stats {
	slices.Sort(lat)
	st := Stats{Name: name, Clients: clients, Calls: len(lat) + errs, Errors: errs, FirstErr: firstErr,
		Seconds: elapsed.Seconds(), PerSecond: float64(len(lat)) / elapsed.Seconds()}
	if len(lat) > 0 {
		st.P50Ms = ms(percentile(lat, 0.50))
		st.P99Ms = ms(percentile(lat, 0.99))
		st.MaxMs = ms(lat[len(lat)-1])
	}
	return st
}

// percentile takes the nearest-rank percentile of sorted latencies.
func percentile(sorted []time.Duration, p float64) time.Duration {
	i := int(float64(len(sorted))*p+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func printTable(w io.Writer, rep Report) {
	fmt.Fprintf(w, "data dir: %s\n\n", rep.DataDir)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PHASE\tCLIENTS\tCALLS\tERRORS\tPER SECOND\tP50\tP99\tMAX\tP50/FSYNC P50")
	row := func(st Stats, ratio string) {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%.0f\t%.2fms\t%.2fms\t%.2fms\t%s\n",
			st.Name, st.Clients, st.Calls, st.Errors, st.PerSecond, st.P50Ms, st.P99Ms, st.MaxMs, ratio)
	}
	row(rep.Fsync, "1.00x")
	for _, st := range rep.Writes {
		row(st, fmt.Sprintf("%.2fx", st.VsFsync))
	}
	row(rep.Reads, "-")
	tw.Flush()
	fmt.Fprintf(w, "\nfsync p50 %.2fms p99 %.2fms: the floor under each commit (one fsync per Raft batch).\n",
		rep.Fsync.P50Ms, rep.Fsync.P99Ms)
	for _, st := range rep.Writes {
		fmt.Fprintf(w, "%d client(s): %.0f commits/s, p50 %.2fms, p99 %.2fms, %.2fx the fsync p50.\n",
			st.Clients, st.PerSecond, st.P50Ms, st.P99Ms, st.VsFsync)
	}
	fmt.Fprintf(w, "reads: %.0f linearizable ListAccelerators/s over %d accelerators, p50 %.2fms, p99 %.2fms.\n",
		rep.Reads.PerSecond, rep.Accelerators, rep.Reads.P50Ms, rep.Reads.P99Ms)
}

// agentProc is a running `gpuplane agent --dev` process.
type agentProc struct {
	cmd  *exec.Cmd
	url  string
	log  string
	done chan struct{}
}

func startAgent(bin, dataDir, logPath string) (*agentProc, error) {
	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := exec.Command(bin, "agent", "--dev", "--data-dir", dataDir,
		"--api-port", strconv.Itoa(ports[0]), "--raft-port", strconv.Itoa(ports[1]),
		"--gossip-port", strconv.Itoa(ports[2]), "--gateway-port", "0")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start agent: %w", err)
	}
	a := &agentProc{cmd: cmd, url: "http://127.0.0.1:" + strconv.Itoa(ports[0]), log: logPath, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(a.done) }()
	return a, nil
}

// waitReady waits for /healthz and for the node to be registered.
func (a *agentProc) waitReady(timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	httpc := &http.Client{Timeout: 2 * time.Second}
	nodes := gpuplanev1connect.NewNodeServiceClient(rpc.HTTPClient(), a.url)
	for {
		select {
		case <-a.done:
			return fmt.Errorf("agent exited before it was ready: %s", a.tail())
		case <-ctx.Done():
			return fmt.Errorf("agent not ready after %s: %s", timeout, a.tail())
		case <-time.After(50 * time.Millisecond):
		}
		resp, err := httpc.Get(a.url + "/healthz")
		if err != nil {
			continue
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			continue
		}
		callCtx, callCancel := context.WithTimeout(ctx, 5*time.Second)
		list, err := nodes.ListNodes(callCtx, connect.NewRequest(&pb.ListNodesRequest{}))
		callCancel()
		if err == nil && len(list.Msg.Nodes) > 0 {
			return nil
		}
	}
}

// kill stops the agent with SIGKILL (idempotent): the benchmark needs no
// clean shutdown, and the data dir is removed afterwards.
func (a *agentProc) kill() {
	if a.cmd.Process == nil {
		return
	}
	if err := a.cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		fmt.Fprintln(os.Stderr, "bench/commit: kill agent:", err)
	}
	<-a.done
}

func (a *agentProc) tail() string {
	b, _ := os.ReadFile(a.log)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return strings.TrimSpace(string(b))
}

// freePorts asks the kernel for n distinct free loopback ports. They are
// released before the agent binds them, which is racy but rarely loses.
func freePorts(n int) ([]int, error) {
	var ports []int
	var lns []net.Listener
	defer func() {
		for _, l := range lns {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("find a free port: %w", err)
		}
		lns = append(lns, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
