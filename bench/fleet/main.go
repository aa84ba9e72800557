// Command fleet loads three real gpuplane servers with a fleet of hollow
// client nodes (`gpuplane agent --hollow N`), as kubemark loads
// Kubernetes with hollow kubelets and nomad-nodesim loads Nomad, and
// measures what the control plane does at that size:
//
//   - commit throughput and p50/p99 at -clients concurrent writers (one log
//     entry per call, spread over the three servers) with no fleet, then
//     with the fleet's event streams attached;
//   - how long the fleet takes to register, and the placement of
//     -replicas-per-node × nodes replicas until all report Running;
//   - a new node's inventory seen by every server (each server's own
//     state, read stale), and a changed inventory (the node restarted with
//     other cards) seen by every server;
//   - the first fleet process, which holds -kill nodes (10% by default),
//     killed (kill -9): the time until every one of its nodes is down in the log,
//     and then until every replica runs again on a live node, with no card
//     holding two replicas of the dedicated accelerator;
//   - the servers' CPU and RSS, and the leader's reconcile round time
//     (/metrics), and `audit verify` on every server's data dir at the end.
//
// The servers are three `gpuplane agent --server` processes; the fleet is
// -procs `gpuplane agent --hollow` processes, all on loopback, starting
// -rate nodes a second between them (--hollow-rate).
package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
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
	"syscall"
	"time"

	"connectrpc.com/connect"

	"github.com/gpuplane/gpuplane/cluster"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
	"github.com/gpuplane/gpuplane/proto/gpuplane/v1/gpuplanev1connect"
	"github.com/gpuplane/gpuplane/rpc"
)

var (
	bin     string
	tmp     string
	httpc   = rpc.HTTPClient()
	verbose bool
	// fleetEnv is added to the hollow processes' environment.
	fleetEnv string
)

func main() {
	nodes := flag.Int("nodes", 1000, "hollow client nodes")
	procs := flag.Int("procs", 4, "fleet processes the nodes are spread over; the failure test kills the first")
	kill := flag.Int("kill", 0, "nodes in the first fleet process, which the failure test kills (default: an equal share, 1/procs of the nodes)")
	rate := flag.Float64("rate", 3, "hollow nodes started per second across the fleet (--hollow-rate of each process: rate/procs)")
	perNode := flag.Float64("replicas-per-node", 1, "replicas deployed per hollow node (dedicated h100, one card each)")
	clients := flag.Int("clients", 64, "concurrent writers for the commit runs")
	duration := flag.Duration("duration", 5*time.Second, "length of each commit run")
	idle := flag.Duration("idle", 20*time.Second, "how long the settled fleet's CPU is measured")
	flag.StringVar(&bin, "bin", "", "gpuplane binary (default: go build ./cmd/gpuplane into a temp dir)")
	flag.BoolVar(&verbose, "v", false, "print progress")
	keep := flag.Bool("keep", false, "keep the temp dir (servers' and fleet's logs and data)")
	flag.StringVar(&fleetEnv, "fleet-env", "GOMAXPROCS=1 GOGC=400", "extra environment for the hollow processes only, space-separated NAME=VALUE (one core each and less frequent GC: a process of hundreds of members spends less on scheduling and collection)")
	flag.Parse()
	var err error
	if tmp, err = os.MkdirTemp("", "gpuplane-fleet-"); err != nil {
		fail(err)
	}
	if !*keep {
		defer os.RemoveAll(tmp)
	} else {
		fmt.Println("temp dir:", tmp)
	}
	if bin == "" {
		bin = filepath.Join(tmp, "gpuplane")
		b := exec.Command("go", "build", "-o", bin, "./cmd/gpuplane")
		b.Stdout, b.Stderr = os.Stderr, os.Stderr
		if err := b.Run(); err != nil {
			fail(err)
		}
	}
	if *procs < 1 || *nodes < *procs || *kill < 0 || *kill >= *nodes || (*kill > 0 && *procs < 2) || *rate < 0 {
		fail(errors.New("want -nodes >= -procs >= 1, -rate >= 0, and -kill below -nodes with at least two -procs"))
	}
	if err := run(*nodes, *procs, *kill, *rate, *perNode, *clients, *duration, *idle); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "bench fleet:", err)
	os.Exit(1)
}

func progress(format string, args ...any) {
	if verbose {
		fmt.Fprintf(os.Stderr, time.Now().Format("15:04:05.000 ")+format+"\n", args...)
	}
}

// proc is one gpuplane process.
type proc struct {
	name string
	args []string
	cmd  *exec.Cmd
	done chan struct{}
	// api and gossip are a server's (or a one-node process's) ports.
	api, gossip int
}

func (p *proc) start() error {
	f, err := os.OpenFile(filepath.Join(tmp, p.name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	p.cmd = exec.Command(bin, p.args...)
	p.cmd.Stdout, p.cmd.Stderr = f, f
	if slices.Contains(p.args, "--hollow") && fleetEnv != "" {
		p.cmd.Env = append(os.Environ(), strings.Fields(fleetEnv)...)
	}
	// The servers and the fleet die with the bench, however it ends.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		return err
	}
	p.done = make(chan struct{})
	go func(c *exec.Cmd, done chan struct{}) { c.Wait(); close(done) }(p.cmd, p.done)
	return nil
}

// kill is kill -9; stop is SIGTERM (a clean stop), then kill -9 after 20s.
func (p *proc) kill() {
	if p.cmd != nil {
		p.cmd.Process.Kill()
		<-p.done
		p.cmd = nil
	}
}

func (p *proc) stop() {
	if p.cmd != nil {
		p.cmd.Process.Signal(os.Interrupt)
		select {
		case <-p.done:
		case <-time.After(20 * time.Second):
		}
		p.kill()
	}
}

func (p *proc) pid() int {
	if p.cmd == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

func (p *proc) url() string { return "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(p.api)) }

func freePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fail(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func run(nodes, procs, kill int, rate, perNode float64, clients int, d, idle time.Duration) error {
	load := loadavg()
	fmt.Printf("fleet: %d hollow nodes × 8 h100 in %d processes, started %g a second, 3 servers; load average at start %s\n", nodes, procs, rate, load)
	servers, err := startServers()
	defer func() {
		for _, s := range servers {
			s.stop()
		}
	}()
	if err != nil {
		return err
	}
	var gossip []string
	for _, s := range servers {
		gossip = append(gossip, net.JoinHostPort("127.0.0.1", strconv.Itoa(s.gossip)))
	}
	cpu0 := cpuOf(servers)

	base, err := commitRun(servers, clients, d)
	if err != nil {
		return fmt.Errorf("commit without the fleet: %w", err)
	}
	fmt.Printf("commit, %d clients, no fleet:          %7.0f writes/s  p50 %6.1f ms  p99 %6.1f ms  (%d errors)\n", clients, base.rate, base.p50, base.p99, base.errors)

	// The fleet.
	var fleet []*proc
	defer func() {
		var wg sync.WaitGroup
		for _, p := range fleet {
			wg.Go(p.stop)
		}
		wg.Wait()
	}()
	began := time.Now()
	// The first process holds the nodes the failure test kills; the
	// others share the rest.
	sizes := make([]int, procs)
	if kill == 0 {
		kill = nodes / procs
	}
	sizes[0] = kill
	for i := 1; i < procs; i++ {
		rest, others := nodes-kill, procs-1
		sizes[i] = rest / others
		if i <= rest%others {
			sizes[i]++
		}
	}
	for i, n := range sizes {
		name := fmt.Sprintf("f%02d", i)
		p := &proc{name: name, args: []string{"agent", "--hollow", strconv.Itoa(n), "--node-name", name,
			"--hollow-rate", strconv.FormatFloat(rate*float64(n)/float64(nodes), 'g', 4, 64),
			"--data-dir", filepath.Join(tmp, name), "--bind", "127.0.0.1", "--join", strings.Join(gossip, ","), "--log-level", "error"}}
		if err := p.start(); err != nil {
			return err
		}
		fleet = append(fleet, p)
	}
	if err := waitNodes(servers[0], 30*time.Minute, func(ns []*pb.Node) error {
		return countAlive(ns, "f", nodes)
	}); err != nil {
		return fmt.Errorf("fleet registration: %w", err)
	}
	fmt.Printf("fleet registered: all %d nodes alive in the log after %v\n", nodes, time.Since(began).Round(time.Millisecond))
	fmt.Printf("  fleet RSS %s (%.1f MiB per hollow node)\n", mib(rssOf(fleet)), float64(rssOf(fleet))/float64(nodes)/(1<<20))

	// Placement.
	replicas := max(1, int(float64(nodes)*perNode))
	began = time.Now()
	if err := cli(servers[0], "accelerators", "create", "big", "--device", "h100"); err != nil {
		return err
	}
	if err := cli(servers[0], "models", "deploy", "m", "--accelerator", "big", "--model", "/m/x", "--engine", "sim",
		"--replicas", strconv.Itoa(replicas)); err != nil {
		return err
	}
	if err := waitReplicas(servers[0], replicas, nil, 30*time.Minute); err != nil {
		return fmt.Errorf("placement: %w", err)
	}
	fmt.Printf("placement: %d replicas Running on hollow nodes %v after the deploy\n", replicas, time.Since(began).Round(time.Millisecond))

	// What a settled fleet costs: CPU over a quiet window, which unlike the
	// times above does not depend on how loaded the machine is.
	fcpu0, scpu0, quiet0 := cpuOf(fleet), cpuOf(servers), time.Now()
	time.Sleep(idle)
	fcpu1, scpu1, quiet := cpuOf(fleet), cpuOf(servers), time.Since(quiet0)
	var fleetCPU, serverCPU time.Duration
	for i := range fcpu1 {
		fleetCPU += fcpu1[i] - fcpu0[i]
	}
	for i := range scpu1 {
		serverCPU += scpu1[i] - scpu0[i]
	}
	fmt.Printf("settled fleet over %v: fleet CPU %.2f s/min per hollow node (%.2f cores in all), servers %.2f cores in all; load average %s\n",
		quiet.Round(time.Second), fleetCPU.Seconds()/quiet.Minutes()/float64(nodes), fleetCPU.Seconds()/quiet.Seconds(), serverCPU.Seconds()/quiet.Seconds(), loadavg())

	// A new node, and a changed inventory.
	newNode := &proc{name: "new", api: freePort(), gossip: freePort()}
	newArgs := func(gpus string) []string {
		return []string{"agent", "--hollow", "1", "--node-name", "new", "--data-dir", filepath.Join(tmp, "new"),
			"--bind", "127.0.0.1", "--api-port", strconv.Itoa(newNode.api), "--gossip-port", strconv.Itoa(newNode.gossip),
			"--join", strings.Join(gossip, ","), "--sim-gpus", gpus, "--log-level", "error"}
	}
	newNode.args = newArgs("h100=8")
	began = time.Now()
	if err := newNode.start(); err != nil {
		return err
	}
	defer newNode.stop()
	if err := waitAllServers(servers, cardsOf("new-0000", 8)); err != nil {
		return fmt.Errorf("new node: %w", err)
	}
	fmt.Printf("new node's inventory (8 cards) in every server's state: %v after its process started\n", time.Since(began).Round(time.Millisecond))
	newNode.kill()
	newNode.args = newArgs("h100=4")
	began = time.Now()
	if err := newNode.start(); err != nil {
		return err
	}
	if err := waitAllServers(servers, cardsOf("new-0000", 4)); err != nil {
		return fmt.Errorf("changed inventory: %w", err)
	}
	fmt.Printf("changed inventory (restart with 4 cards) in every server's state: %v after its process restarted\n", time.Since(began).Round(time.Millisecond))

	// Commit throughput with the fleet's streams attached.
	with, err := commitRun(servers, clients, d)
	if err != nil {
		return fmt.Errorf("commit with the fleet: %w", err)
	}
	fmt.Printf("commit, %d clients, %d event streams: %7.0f writes/s  p50 %6.1f ms  p99 %6.1f ms  (%d errors)  = %.0f%% of no fleet\n",
		clients, nodes+1, with.rate, with.p50, with.p99, with.errors, 100*with.rate/base.rate)

	// Failure: kill one fleet process.
	victim := fleet[0]
	rs, err := listReplicas(servers[0])
	if err != nil {
		return err
	}
	dead := map[string]bool{}
	onDead := 0
	for i := range sizes[0] {
		dead[fmt.Sprintf("%s-%04d", victim.name, i)] = true
	}
	for _, r := range rs {
		if dead[r.GetNode()] {
			onDead++
		}
	}
	began = time.Now()
	victim.kill()
	if err := waitNodes(servers[0], 5*time.Minute, func(ns []*pb.Node) error {
		down := 0
		for _, n := range ns {
			if dead[n.GetName()] && n.GetStatus() == pb.NodeStatus_NODE_STATUS_DOWN {
				down++
			}
		}
		if down != len(dead) {
			return fmt.Errorf("%d of %d down", down, len(dead))
		}
		return nil
	}); err != nil {
		return fmt.Errorf("failure detection: %w", err)
	}
	downAfter := time.Since(began)
	fmt.Printf("%d nodes killed at once (%d replicas on them): all down in the log after %v\n", len(dead), onDead, downAfter.Round(time.Millisecond))
	mark := time.Now()
	if err := waitReplicas(servers[0], replicas, dead, 10*time.Minute); err != nil {
		return fmt.Errorf("re-placement: %w", err)
	}
	fmt.Printf("  their replicas Running on live nodes %v after that (no card holds two replicas)\n", time.Since(mark).Round(time.Millisecond))

	// Servers' cost.
	cpu1 := cpuOf(servers)
	for i, s := range servers {
		fmt.Printf("server %s: CPU %v over the run, RSS %s (peak %s)\n", s.name, (cpu1[i] - cpu0[i]).Round(time.Millisecond), mib(rssKiB(s.pid(), "VmRSS")*1024), mib(rssKiB(s.pid(), "VmHWM")*1024))
	}
	for _, s := range servers {
		m := scrape(s)
		if m["gpuplane_raft_leader"] == "1" {
			last, _ := strconv.ParseFloat(m["gpuplane_leader_reconcile_last_seconds"], 64)
			longest, _ := strconv.ParseFloat(m["gpuplane_leader_reconcile_max_seconds"], 64)
			fmt.Printf("leader %s: %s reconcile rounds, last %.1f ms, longest %.1f ms (writes included)\n",
				s.name, m["gpuplane_leader_reconcile_rounds_total"], 1000*last, 1000*longest)
		}
	}
	fmt.Printf("load average at end %s\n", loadavg())

	// Audit: stop everything, verify each server's log offline.
	var wg sync.WaitGroup
	for _, p := range append(fleet, newNode) {
		wg.Go(p.stop)
	}
	wg.Wait()
	for _, s := range servers {
		s.stop()
	}
	for _, s := range servers {
		out, err := exec.Command(bin, "audit", "verify", "--data-dir", filepath.Join(tmp, s.name)).CombinedOutput()
		last := strings.TrimSpace(string(out))
		if i := strings.LastIndexByte(last, '\n'); i >= 0 {
			last = last[i+1:]
		}
		if err != nil {
			return fmt.Errorf("audit verify %s: %v: %s", s.name, err, out)
		}
		fmt.Printf("audit verify %s: ok (%s)\n", s.name, last)
	}
	return nil
}

func startServers() ([]*proc, error) {
	var servers []*proc
	var join []string
	for i := range 3 {
		s := &proc{name: fmt.Sprintf("s%d", i+1), api: freePort(), gossip: freePort()}
		join = append(join, net.JoinHostPort("127.0.0.1", strconv.Itoa(s.gossip)))
		servers = append(servers, s)
	}
	for _, s := range servers {
		s.args = []string{"agent", "--server", "--bootstrap-expect", "3", "--join", strings.Join(join, ","),
			"--data-dir", filepath.Join(tmp, s.name), "--node-name", s.name, "--bind", "127.0.0.1",
			"--api-port", strconv.Itoa(s.api), "--raft-port", strconv.Itoa(freePort()), "--gossip-port", strconv.Itoa(s.gossip),
			"--gateway-port", "0", "--log-level", "error", "--enforce", "none"}
		if err := s.start(); err != nil {
			return servers, err
		}
	}
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		ready := 0
		for _, s := range servers {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			resp, err := gpuplanev1connect.NewClusterServiceClient(httpc, s.url()).Status(ctx, connect.NewRequest(&pb.StatusRequest{}))
			cancel()
			// Followers name the leader; the leader lists the voters.
			if err == nil && resp.Msg.GetLeader() != "" && (resp.Msg.GetLeader() != s.name || len(resp.Msg.GetServers()) == 3) {
				ready++
			}
		}
		if ready == 3 {
			// Wait for the servers' own registrations.
			return servers, waitNodes(servers[0], time.Minute, func(ns []*pb.Node) error { return countAlive(ns, "s", 3) })
		}
		time.Sleep(200 * time.Millisecond)
	}
	return servers, errors.New("servers did not form a cluster within 2m")
}

func countAlive(ns []*pb.Node, prefix string, want int) error {
	alive := 0
	for _, n := range ns {
		if strings.HasPrefix(n.GetName(), prefix) && n.GetStatus() == pb.NodeStatus_NODE_STATUS_ALIVE {
			alive++
		}
	}
	progress("%d of %d %s* nodes alive", alive, want, prefix)
	if alive < want {
		return fmt.Errorf("%d of %d alive", alive, want)
	}
	return nil
}

func listNodes(s *proc) ([]*pb.Node, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := gpuplanev1connect.NewNodeServiceClient(httpc, s.url()).ListNodes(ctx, connect.NewRequest(&pb.ListNodesRequest{Stale: true}))
	if err != nil {
		return nil, err
	}
	return resp.Msg.GetNodes(), nil
}

func listReplicas(s *proc) ([]*pb.Replica, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := gpuplanev1connect.NewModelServiceClient(httpc, s.url()).ListReplicas(ctx, connect.NewRequest(&pb.ListReplicasRequest{Stale: true}))
	if err != nil {
		return nil, err
	}
	return resp.Msg.GetReplicas(), nil
}

// poll is how often the bench reads a server's state while it waits.
const poll = 100 * time.Millisecond

func waitNodes(s *proc, within time.Duration, ok func([]*pb.Node) error) error {
	deadline := time.Now().Add(within)
	var last error
	for time.Now().Before(deadline) {
		ns, err := listNodes(s)
		if err == nil {
			if last = ok(ns); last == nil {
				return nil
			}
		} else {
			last = err
		}
		time.Sleep(poll)
	}
	return fmt.Errorf("not within %v: %v", within, last)
}

func cardsOf(name string, cards int) func([]*pb.Node) error {
	return func(ns []*pb.Node) error {
		for _, n := range ns {
			if n.GetName() == name {
				if len(n.GetCards()) == cards && n.GetStatus() == pb.NodeStatus_NODE_STATUS_ALIVE {
					return nil
				}
				return fmt.Errorf("%s has %d cards, %s", name, len(n.GetCards()), n.GetStatus())
			}
		}
		return fmt.Errorf("%s not registered", name)
	}
}

// waitAllServers waits until every server's own state satisfies ok.
func waitAllServers(servers []*proc, ok func([]*pb.Node) error) error {
	var wg sync.WaitGroup
	errs := make([]error, len(servers))
	for i, s := range servers {
		wg.Go(func() { errs[i] = waitNodes(s, 2*time.Minute, ok) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// waitReplicas waits until want replicas run on hollow nodes not in dead,
// failing at once if a card ever holds two.
func waitReplicas(s *proc, want int, dead map[string]bool, within time.Duration) error {
	deadline := time.Now().Add(within)
	var last error
	for time.Now().Before(deadline) {
		rs, err := listReplicas(s)
		if err != nil {
			last = err
			time.Sleep(poll)
			continue
		}
		used := map[string]string{}
		running := 0
		for _, r := range rs {
			id := fmt.Sprintf("%s/%d", r.GetModel(), r.GetIndex())
			for _, c := range r.GetCards() {
				card := fmt.Sprintf("%s/%d", r.GetNode(), c)
				if other, ok := used[card]; ok {
					return fmt.Errorf("card %s holds both %s and %s", card, other, id)
				}
				used[card] = id
			}
			if r.GetState() == pb.ReplicaState_REPLICA_STATE_RUNNING && !dead[r.GetNode()] {
				running++
			}
		}
		progress("%d of %d replicas running", running, want)
		if running == want && len(rs) == want {
			return nil
		}
		last = fmt.Errorf("%d of %d replicas running on live nodes", running, want)
		time.Sleep(poll)
	}
	return fmt.Errorf("not within %v: %v", within, last)
}

func cli(s *proc, args ...string) error {
	out, err := exec.Command(bin, append([]string{"--addr", s.url()}, args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("gpuplane %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

type stats struct {
	rate, p50, p99 float64
	errors         int
}

// commitRun writes one CreateAccelerator entry per call from each of
// clients writers, spread over the servers, for d.
func commitRun(servers []*proc, clients int, d time.Duration) (stats, error) {
	hc := rpc.HTTPClient()
	var cs []gpuplanev1connect.ClusterServiceClient
	for _, s := range servers {
		cs = append(cs, gpuplanev1connect.NewClusterServiceClient(hc, s.url()))
	}
	run := time.Now().UnixNano()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var mu sync.Mutex
	var lat []time.Duration
	var errs int
	var firstErr error
	var wg sync.WaitGroup
	start := time.Now()
	for c := range clients {
		wg.Go(func() {
			var mine []time.Duration
			for seq := 0; ctx.Err() == nil; seq++ {
				env := &pb.Envelope{RequestId: cluster.NewRequestID(), Actor: "bench", Command: &pb.Envelope_CreateAccelerator{
					CreateAccelerator: &pb.CreateAccelerator{Name: fmt.Sprintf("w%x-%d-%d", run, c, seq), Spec: &pb.AcceleratorSpec{Device: "l4"}}}}
				t := time.Now()
				wctx, wcancel := context.WithTimeout(context.Background(), 30*time.Second)
				resp, err := cs[c%len(cs)].Apply(wctx, connect.NewRequest(&pb.ApplyRequest{Envelope: env}))
				wcancel()
				if err == nil && resp.Msg.GetResult().GetCode() != pb.Code_CODE_OK {
					err = errors.New(resp.Msg.GetResult().GetMessage())
				}
				if err != nil {
					mu.Lock()
					errs++
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					continue
				}
				mine = append(mine, time.Since(t))
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if len(lat) == 0 {
		return stats{}, fmt.Errorf("no write succeeded: %v", firstErr)
	}
	slices.Sort(lat)
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	return stats{rate: float64(len(lat)) / elapsed.Seconds(), p50: ms(lat[len(lat)/2]), p99: ms(lat[len(lat)*99/100]), errors: errs}, nil
}

// cpuOf is each process's CPU time (user and system) so far, from /proc.
func cpuOf(ps []*proc) []time.Duration {
	out := make([]time.Duration, len(ps))
	for i, p := range ps {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.pid()))
		if err != nil {
			continue
		}
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if len(f) < 13 {
			continue
		}
		u, _ := strconv.ParseInt(f[11], 10, 64)
		s, _ := strconv.ParseInt(f[12], 10, 64)
		out[i] = time.Duration(u+s) * 10 * time.Millisecond
	}
	return out
}

// rssKiB reads a VmRSS/VmHWM line of /proc/PID/status.
func rssKiB(pid int, field string) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	return 0
}

func rssOf(ps []*proc) int64 {
	var total int64
	for _, p := range ps {
		total += rssKiB(p.pid(), "VmRSS") * 1024
	}
	return total
}

func mib(b int64) string { return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20)) }

// scrape reads a server's /metrics into name → value (unlabelled series).
func scrape(s *proc) map[string]string {
	out := map[string]string{}
	resp, err := http.Get(s.url() + "/metrics")
	if err != nil {
		return out
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		if name, v, ok := strings.Cut(line, " "); ok && !strings.Contains(name, "{") {
			out[name] = v
		}
	}
	return out
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}
