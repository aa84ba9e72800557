// Command cluster measures what the multi-node cluster promises:
//
//   - failover: a three-server cluster loses its leader (kill -9 of its
//     process; with -inproc its Raft stops with no leadership transfer and
//     no leave); the time from then to the first write that succeeds
//     through a surviving server, median of several trials (the old leader
//     restarts on its data dir between trials);
//   - gossip convergence: N in-process memberlist nodes (64 by default) and
//     a new node joining one of them; the time until all N see the new
//     node's inventory digest, and until all see a changed digest;
//   - commit throughput: concurrent writers (1, 64, 256) sending one log
//     entry per call (ClusterService.Apply over Connect, spread over the
//     three servers, followers forwarding to the leader) for a fixed time,
//     once with clients over HTTP/1.1 (as the gpuplane CLI's client, and
//     this bench's etcd clients, speak) and once over h2c (HTTP/2 without
//     TLS, as nodes speak to each other); -client-http picks one;
//   - the same put workload against a three-member etcd on this machine,
//     through etcd's own Go client (go.etcd.io/etcd/client/v3, gRPC), one
//     client per member, the bench's clients spread over them, when an
//     etcd binary is on PATH, with the ratio. Without etcd that part is
//     skipped. (It used etcd's JSON gateway before, which made etcd look
//     about 1.7x slower than its users see it.)
//
// This command is a module of its own (bench/cluster/go.mod), so that
// etcd's client and its dependencies stay out of gpuplane's go.mod.
//
// The three gpuplane servers are three `gpuplane agent --server
// --bootstrap-expect 3 --join ...` processes (built from ./cmd/gpuplane, or
// -bin), as etcd's members are three processes; -inproc runs them inside
// this process instead (the old mode). Everything runs on loopback in one
// run, and each client count is measured on gpuplane and right after on
// etcd, so the numbers compare under the same machine load.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/gpuplane/gpuplane/cluster"
	"github.com/gpuplane/gpuplane/cmd/gpuplane/agent"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
	"github.com/gpuplane/gpuplane/proto/gpuplane/v1/gpuplanev1connect"
	"github.com/gpuplane/gpuplane/rpc"
)

func main() {
	trials := flag.Int("trials", 5, "failover trials")
	gossipN := flag.Int("gossip-nodes", 64, "memberlist nodes for the convergence benchmark")
	clients := flag.String("clients", "1,64,256", "concurrent writers, comma-separated")
	duration := flag.Duration("duration", 5*time.Second, "how long each throughput run lasts")
	flag.DurationVar(&slice, "slice", time.Second, "gpuplane and etcd take turns of this long until each has run -duration (0: one turn each)")
	etcdBin := flag.String("etcd", "etcd", "etcd binary for the comparison (skipped when not found)")
	flag.DurationVar(&idle, "idle", 0, "first leave the three servers idle this long and count term changes (spurious elections)")
	flag.StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile of this process during the throughput runs (the servers too with -inproc; etcd's clients are in it as well)")
	flag.StringVar(&serverProfiles, "server-cpuprofile", "", "directory for CPU profiles of the three server processes, one per server and client count, fetched from their /debug/pprof/profile during each throughput run")
	flag.BoolVar(&inproc, "inproc", false, "run the three gpuplane servers inside this process (the old mode) instead of as three processes")
	flag.StringVar(&bin, "bin", "", "gpuplane binary for the server processes (default: go build ./cmd/gpuplane into a temp dir)")
	flag.Func("server-env", "NAME=VALUE added to the gpuplane server processes' environment (not etcd's), e.g. GOGC=200; repeatable", func(v string) error {
		if !strings.Contains(v, "=") {
			return fmt.Errorf("want NAME=VALUE, got %q", v)
		}
		serverEnv = append(serverEnv, v)
		return nil
	})
	flag.StringVar(&clientHTTP, "client-http", "both", "how gpuplane's bench clients speak to the servers: http1 (HTTP/1.1, as the gpuplane CLI and this bench's etcd clients do), h2c (HTTP/2 without TLS, as nodes do: rpc.HTTPClient), grpc (Connect's gRPC protocol over h2c), both (http1 and h2c, each measured, in turns) or all (the three)")
	flag.StringVar(&binB, "bin-b", "", "a second gpuplane binary: three more servers run it, and each client count is measured on both builds in turns (an A/B under one load)")
	flag.Func("server-env-b", "NAME=VALUE added to the -bin-b servers' environment (-bin-b defaults to -bin when only this is given); repeatable", func(v string) error {
		if !strings.Contains(v, "=") {
			return fmt.Errorf("want NAME=VALUE, got %q", v)
		}
		serverEnvB = append(serverEnvB, v)
		return nil
	})
	procs := flag.Int("procs", 0, "GOMAXPROCS of this process (default: NumCPU, or 3×NumCPU with -inproc)")
	flag.Parse()
	if _, ok := clientProtocols[clientHTTP]; !ok {
		fmt.Fprintf(os.Stderr, "bad -client-http %q: want http1, h2c, grpc, both or all\n", clientHTTP)
		os.Exit(2)
	}
	// With -inproc the three gpuplane servers share this process, while etcd
	// runs three processes with GOMAXPROCS=NumCPU each. On a loaded machine
	// the kernel shares CPU per thread, so with the default GOMAXPROCS
	// gpuplane would get a third of etcd's share and the comparison would
	// measure the scheduler: give this process as many Go threads as the
	// three etcds. By default the servers are three processes, like etcd's,
	// and this process only drives the clients of both.
	if *procs == 0 {
		*procs = runtime.NumCPU()
		if inproc {
			*procs *= 3
		}
	}
	runtime.GOMAXPROCS(*procs)
	var ns []int
	for _, s := range strings.Split(*clients, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			fmt.Fprintf(os.Stderr, "bad -clients %q\n", *clients)
			os.Exit(2)
		}
		ns = append(ns, n)
	}
	if err := run(*trials, *gossipN, ns, *duration, *etcdBin); err != nil {
		fmt.Fprintln(os.Stderr, "bench/cluster:", err)
		os.Exit(1)
	}
}

var (
	slice      time.Duration
	cpuProfile string
	idle       time.Duration
	inproc     bool
	bin        string
	serverEnv  []string // -server-env
	binB       string   // -bin-b
	serverEnvB []string // -server-env-b
	clientHTTP string   // -client-http

	serverProfiles string // -server-cpuprofile
)

func run(trials, gossipN int, clients []int, d time.Duration, etcdBin string) error {
	tmp, err := os.MkdirTemp("", "gpuplane-bench-cluster-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)

	if gossipN > 0 {
		fmt.Printf("gossip convergence, %d memberlist nodes on loopback\n", gossipN)
		if err := benchGossip(gossipN, 3); err != nil {
			return err
		}
	}

	if !inproc && bin == "" {
		bin = filepath.Join(tmp, "gpuplane")
		build := exec.Command("go", "build", "-o", bin, "./cmd/gpuplane")
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			return fmt.Errorf("go build ./cmd/gpuplane (run from the repository root, or pass -bin): %w", err)
		}
	}
	if inproc {
		bin = ""
	}
	servers, err := startServers(tmp, bin, serverEnv)
	defer func() {
		for _, s := range servers {
			s.stop()
		}
	}()
	if err != nil {
		return err
	}
	// -bin-b: a second cluster, measured in the same turns as the first.
	var serversB []*server
	if !inproc && (binB != "" || len(serverEnvB) > 0) {
		if binB == "" {
			binB = bin
		}
		dirB := filepath.Join(tmp, "b")
		if err := os.Mkdir(dirB, 0o755); err != nil {
			return err
		}
		serversB, err = startServers(dirB, binB, serverEnvB)
		defer func() {
			for _, s := range serversB {
				s.stop()
			}
		}()
		if err != nil {
			return err
		}
		fmt.Printf("A: %s %v; B: %s %v\n", bin, serverEnv, binB, serverEnvB)
	}
	mode := "three `gpuplane agent --server` processes"
	if inproc {
		mode = "three servers in this process (-inproc)"
	}
	fmt.Printf("\ngpuplane: %s\n", mode)

	if idle > 0 {
		if err := benchIdle(servers, idle); err != nil {
			return err
		}
	}

	if trials > 0 {
		fmt.Printf("\nfailover: leader stopped abruptly (kill -9 of its process; -inproc: Raft stopped), time to the first successful write through a survivor\n")
		if err := benchFailover(servers, trials); err != nil {
			return err
		}
	}

	// etcd (when installed) runs alongside, and each client count is
	// measured on gpuplane and then at once on etcd, so that both see the
	// same machine load (others' jobs come and go during a run).
	var etcd *etcdCluster
	if path, err := exec.LookPath(etcdBin); err != nil {
		fmt.Printf("\netcd comparison skipped: no %q on PATH (Debian: apt-get install etcd-server)\n", etcdBin)
	} else {
		if etcd, err = startEtcd(path, tmp); err != nil {
			return fmt.Errorf("etcd: %w", err)
		}
		defer etcd.stop()
	}
	fmt.Printf("\ncommit throughput, three servers, one entry per call, %v per run", d)
	if etcd != nil {
		fmt.Printf("; the same put workload against a three-member etcd (%s, native Go client, gRPC), the two taking turns of %v", etcd.version, slice)
	}
	fmt.Println()
	if cpuProfile != "" {
		f, err := os.Create(cpuProfile)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
	}
	protos := clientProtocols[clientHTTP]
	type variant struct {
		name    string
		servers []*server
	}
	variants := []variant{{"", servers}}
	if serversB != nil {
		variants = []variant{{"A ", servers}, {"B ", serversB}}
	}
	var names []string
	for _, v := range variants {
		for _, p := range protos {
			names = append(names, v.name+p)
		}
	}
	for _, n := range clients {
		var systems []*system
		for _, v := range variants {
			for _, p := range protos {
				systems = append(systems, &system{w: gpuplaneWriter(v.servers, p), pids: func() []int { return serverPids(v.servers) }})
			}
		}
		if etcd != nil {
			systems = append(systems, &system{w: etcd.writer(), pids: etcd.pids})
		}
		profiled := profileServers(servers, n, time.Duration(len(systems))*d)
		if err := interleave(n, d, slice, systems); err != nil {
			return err
		}
		if err := profiled(); err != nil {
			return err
		}
		var rates []float64
		for i, p := range names {
			st := systems[i].stats()
			fmt.Printf("  gpuplane %-10s  %4d clients  %8.0f writes/s  p50 %6.2fms  p99 %6.2fms  errors %d%s\n", p, n, st.rate, st.p50, st.p99, st.errors, st.cpu)
			rates = append(rates, st.rate)
		}
		if etcd == nil {
			continue
		}
		et := systems[len(names)].stats()
		ratios := make([]string, len(names))
		for i, p := range names {
			ratios[i] = fmt.Sprintf("%.2fx (%s)", rates[i]/et.rate, p)
		}
		fmt.Printf("  etcd                 %4d clients  %8.0f writes/s  p50 %6.2fms  p99 %6.2fms  errors %d%s   gpuplane/etcd %s\n",
			n, et.rate, et.p50, et.p99, et.errors, et.cpu, strings.Join(ratios, ", "))
	}
	if cpuProfile != "" {
		pprof.StopCPUProfile()
	}
	return nil
}

// --- gossip ---

func benchGossip(n, trials int) error {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	newNode := func(name, digest string) (*cluster.Gossip, error) {
		return cluster.NewGossip(cluster.GossipConfig{Name: name, Bind: "127.0.0.1:0",
			Meta: cluster.Meta{Role: cluster.RoleClient, API: name, Digest: digest}, Logger: quiet, LogLevel: slog.LevelError + 4})
	}
	var nodes []*cluster.Gossip
	defer func() {
		for _, g := range nodes {
			g.Shutdown()
		}
	}()
	for i := range n {
		g, err := newNode(fmt.Sprintf("g%d", i), "d0")
		if err != nil {
			return err
		}
		if i > 0 {
			if _, err := g.Join([]string{nodes[i/2].Addr()}); err != nil {
				return err
			}
		}
		nodes = append(nodes, g)
	}
	if err := waitAll(nodes, 60*time.Second, func(g *cluster.Gossip) bool { return len(g.Members()) >= n }); err != nil {
		return fmt.Errorf("gossip did not converge on %d members: %w", n, err)
	}
	var joins, updates []time.Duration
	for trial := range trials {
		name, digest := fmt.Sprintf("new%d", trial), fmt.Sprintf("inv%d", trial)
		g, err := newNode(name, digest)
		if err != nil {
			return err
		}
		start := time.Now()
		if _, err := g.Join([]string{nodes[trial%n].Addr()}); err != nil {
			return err
		}
		if err := waitAll(nodes, 30*time.Second, func(x *cluster.Gossip) bool {
			m, ok := x.Member(name)
			return ok && m.Meta.Digest == digest
		}); err != nil {
			return err
		}
		joins = append(joins, time.Since(start))
		// A changed inventory: the new digest reaches everyone.
		changed := digest + "-changed"
		start = time.Now()
		if err := g.SetMeta(func(m *cluster.Meta) { m.Digest = changed }); err != nil {
			return err
		}
		if err := waitAll(nodes, 30*time.Second, func(x *cluster.Gossip) bool {
			m, ok := x.Member(name)
			return ok && m.Meta.Digest == changed
		}); err != nil {
			return err
		}
		updates = append(updates, time.Since(start))
		g.Shutdown()
	}
	fmt.Printf("  new node's digest seen by all %d: median %v  (trials %v)\n", n, median(joins), joins)
	fmt.Printf("  changed digest seen by all %d:   median %v  (trials %v)\n", n, median(updates), updates)
	fmt.Printf("  failure detection promise (memberlist settings, %d nodes): %v\n", n, cluster.FailureDetectionTime(n))
	return nil
}

func waitAll(nodes []*cluster.Gossip, within time.Duration, ok func(*cluster.Gossip) bool) error {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if !slices.ContainsFunc(nodes, func(g *cluster.Gossip) bool { return !ok(g) }) {
			return nil
		}
		time.Sleep(2 * time.Millisecond)
	}
	return fmt.Errorf("not within %v", within)
}

// --- servers ---

// server is one of the three gpuplane servers: by default a separate
// `gpuplane agent --server` process (as etcd runs three processes), or,
// with -inproc, an agent inside this process.
type server struct {
	cfg  agent.Config
	a    *agent.Agent // in process
	bin  string       // the gpuplane binary, when a process
	log  string       // its stdout and stderr
	env  []string     // added to the process's environment
	cmd  *exec.Cmd
	done chan struct{}
}

func (s *server) url() string {
	return "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(s.cfg.APIPort))
}

// profileServers fetches a CPU profile of length d from each server process's
// /debug/pprof/profile (the servers run without ACLs) into
// -server-cpuprofile, named after the server and the client count; the
// function it returns waits for them. Without the flag, or with -inproc
// (whose servers are in -cpuprofile), it does nothing.
func profileServers(servers []*server, clients int, d time.Duration) func() error {
	if serverProfiles == "" || inproc {
		return func() error { return nil }
	}
	errs := make(chan error, len(servers))
	for _, s := range servers {
		path := filepath.Join(serverProfiles, fmt.Sprintf("%s-%dclients.pprof", s.cfg.NodeName, clients))
		url := fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", s.url(), int(d.Round(time.Second)/time.Second))
		go func() { errs <- fetchTo(url, path) }()
	}
	return func() error {
		var all []error
		for range servers {
			all = append(all, <-errs)
		}
		return errors.Join(all...)
	}
}

func fetchTo(url, path string) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func (s *server) running() bool { return s.a != nil || s.cmd != nil }

func (s *server) start() error {
	if s.bin == "" {
		a, err := agent.Start(context.Background(), s.cfg)
		s.a = a
		return err
	}
	c := s.cfg
	args := []string{"agent", "--server", "--bootstrap-expect", strconv.Itoa(c.BootstrapExpect), "--join", strings.Join(c.Join, ","),
		"--data-dir", c.DataDir, "--node-name", c.NodeName, "--bind", c.Bind,
		"--api-port", strconv.Itoa(c.APIPort), "--raft-port", strconv.Itoa(c.RaftPort), "--gossip-port", strconv.Itoa(c.GossipPort), "--gateway-port", "0",
		"--sim-gpus", c.SimGPUs, "--log-level", "error"}
	f, err := os.OpenFile(s.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(s.bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), s.env...)
	if err := cmd.Start(); err != nil {
		f.Close()
		return err
	}
	f.Close()
	s.cmd, s.done = cmd, make(chan struct{})
	go func(done chan struct{}) { cmd.Wait(); close(done) }(s.done)
	return nil
}

// stop ends the server abruptly: kill -9 for a process; for an agent in
// process its API goes first, then its Raft, with no leave.
func (s *server) stop() {
	if s.a != nil {
		s.a.Close()
		s.a = nil
	}
	if s.cmd != nil {
		s.cmd.Process.Kill()
		<-s.done
		s.cmd = nil
	}
}

var statusClient = rpc.HTTPClient()

// status is the server's own view of the cluster; nil when it does not answer.
func (s *server) status() *pb.StatusResponse {
	if s.a != nil {
		return s.a.Cluster().Status()
	}
	if s.cmd == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	resp, err := gpuplanev1connect.NewClusterServiceClient(statusClient, s.url()).Status(ctx, connect.NewRequest(&pb.StatusRequest{}))
	if err != nil {
		return nil
	}
	return resp.Msg
}

func (s *server) isLeader() bool {
	st := s.status()
	return st != nil && st.GetLeader() == s.cfg.NodeName && st.GetRaftState() != "" && strings.EqualFold(st.GetRaftState(), "leader")
}

func startServers(tmp, bin string, env []string) ([]*server, error) {
	var servers []*server
	var join []string
	for i := range 3 {
		ports, err := freePorts(3)
		if err != nil {
			return nil, err
		}
		name := fmt.Sprintf("s%d", i+1)
		s := &server{bin: bin, env: env, log: filepath.Join(tmp, name+".log"), cfg: agent.Config{
			Server: true, BootstrapExpect: 3, NodeName: name, DataDir: filepath.Join(tmp, name),
			Bind: "127.0.0.1", APIPort: ports[0], RaftPort: ports[1], GossipPort: ports[2], SimGPUs: "l4=1",
		}}
		join = append(join, net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[2])))
		servers = append(servers, s)
	}
	for _, s := range servers {
		s.cfg.Join = join
		if err := s.start(); err != nil {
			return nil, err
		}
	}
	if err := waitConverged(servers, 60*time.Second); err != nil {
		for _, s := range servers {
			if b, _ := os.ReadFile(s.log); len(b) > 0 {
				fmt.Fprintf(os.Stderr, "--- %s log ---\n%s\n", s.cfg.NodeName, b[max(0, len(b)-4000):])
			}
		}
		return servers, err
	}
	return servers, nil
}

// waitConverged waits until every running server follows one leader that
// counts three voters, and has applied its commit index.
func waitConverged(servers []*server, within time.Duration) error {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		sts := map[*server]*pb.StatusResponse{}
		var lead *server
		for _, s := range servers {
			if !s.running() {
				continue
			}
			st := s.status()
			sts[s] = st
			if st != nil && st.GetLeader() == s.cfg.NodeName && strings.EqualFold(st.GetRaftState(), "leader") {
				lead = s
			}
		}
		ok := lead != nil
		if ok {
			voters := 0
			for _, v := range sts[lead].GetServers() {
				if strings.EqualFold(v.GetSuffrage(), "voter") {
					voters++
				}
			}
			ok = voters == len(servers)
		}
		for _, s := range servers {
			if !s.running() || !ok {
				continue
			}
			st := sts[s]
			ok = st != nil && st.GetLeader() == lead.cfg.NodeName && st.GetAppliedIndex() >= sts[lead].GetCommitIndex()-1
		}
		if ok {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return errors.New("servers did not converge")
}

func benchFailover(servers []*server, trials int) error {
	httpc := rpc.HTTPClient()
	var took []time.Duration
	for trial := range trials {
		if err := waitConverged(servers, 30*time.Second); err != nil {
			return err
		}
		var leader, survivor *server
		for _, s := range servers {
			if s.isLeader() {
				leader = s
			} else if survivor == nil {
				survivor = s
			}
		}
		c := gpuplanev1connect.NewClusterServiceClient(httpc, survivor.url())
		// The outage starts when the leader's Raft stops, the last step of
		// stop (the API goes first, while Raft still leads): as with kill -9,
		// the followers then hear nothing more.
		leader.stop()
		start := time.Now()
		for seq := 0; ; seq++ {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_, err := c.Apply(ctx, connect.NewRequest(&pb.ApplyRequest{Envelope: createEnv(fmt.Sprintf("failover-%d-%d", trial, seq))}))
			cancel()
			if err == nil {
				break
			}
			if time.Since(start) > 30*time.Second {
				return fmt.Errorf("no write within 30s of the leader stopping: %w", err)
			}
			time.Sleep(5 * time.Millisecond)
		}
		took = append(took, time.Since(start))
		if err := leader.start(); err != nil {
			return err
		}
	}
	fmt.Printf("  median %v  (trials %v)\n", median(took), took)
	return nil
}

// benchIdle leaves the servers idle for d and reports how often the term
// changed: with no failure, any change is a spurious election (heartbeats
// missed because the machine is loaded).
func benchIdle(servers []*server, d time.Duration) error {
	term := func() (max uint64) {
		for _, s := range servers {
			max = mathMax(max, s.status().GetTerm())
		}
		return max
	}
	leaders := map[string]bool{}
	start, t0 := term(), time.Now()
	for time.Since(t0) < d {
		for _, s := range servers {
			if s.isLeader() {
				leaders[s.cfg.NodeName] = true
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	fmt.Printf("\nidle %v: term %d -> %d (%d changes), leaders seen %d\n", d, start, term(), term()-start, len(leaders))
	return nil
}

func mathMax(a, b uint64) uint64 { return max(a, b) }

func createEnv(name string) *pb.Envelope {
	return &pb.Envelope{RequestId: cluster.NewRequestID(), Actor: "bench", Command: &pb.Envelope_CreateAccelerator{
		CreateAccelerator: &pb.CreateAccelerator{Name: name, Spec: &pb.AcceleratorSpec{Device: "l4"}}}}
}

// writer performs one write for client i.
type writer func(ctx context.Context, client, seq int) error

var run0 atomic.Int64

// clientProtocols are the -client-http choices, as gpuplaneWriter takes them.
var clientProtocols = map[string][]string{"http1": {"HTTP/1.1"}, "h2c": {"h2c"}, "grpc": {"grpc"}, "both": {"HTTP/1.1", "h2c"}, "all": {"HTTP/1.1", "h2c", "grpc"}}

// gpuplaneWriter writes through Connect clients that speak proto
// ("HTTP/1.1", "h2c", or "grpc": Connect's gRPC protocol over h2c) to the
// servers.
func gpuplaneWriter(servers []*server, proto string) writer {
	httpc := rpc.HTTPClient()
	if proto == "HTTP/1.1" {
		// As the CLI's client (and etcd's here): one connection per call
		// in flight.
		httpc = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 512}}
	}
	var opts []connect.ClientOption
	if proto == "grpc" {
		opts = append(opts, connect.WithGRPC())
	}
	var cs []gpuplanev1connect.ClusterServiceClient
	for _, s := range servers {
		cs = append(cs, gpuplanev1connect.NewClusterServiceClient(httpc, s.url(), opts...))
	}
	r := run0.Add(1)
	return func(ctx context.Context, client, seq int) error {
		resp, err := cs[client%len(cs)].Apply(ctx, connect.NewRequest(&pb.ApplyRequest{Envelope: createEnv(fmt.Sprintf("w%d-%d-%d", r, client, seq))}))
		if err == nil && resp.Msg.GetResult().GetCode() != pb.Code_CODE_OK {
			err = errors.New(resp.Msg.GetResult().GetMessage())
		}
		return err
	}
}

type stats struct {
	rate, p50, p99 float64
	errors         int
	cpu            string // CPU per write, servers and clients
}

// system is one side of the comparison and what its runs added up to.
type system struct {
	w    writer
	pids func() []int // its server processes

	lat               []time.Duration
	seq               []int // each writer's next sequence number
	errs, slices      int
	firstErr          error
	elapsed, srv, cli time.Duration
}

// interleave runs each system for d with n clients, in turns of slice
// (the whole of d at once when slice is 0), so that every system sees the
// machine's load as it comes and goes during the run, not one system the
// quiet minute and the next the busy one.
func interleave(n int, d, slice time.Duration, systems []*system) error {
	if slice <= 0 || slice > d {
		slice = d
	}
	for done := time.Duration(0); done < d; done += slice {
		for _, s := range systems {
			s.run(n, min(slice, d-done))
		}
	}
	for _, s := range systems {
		if len(s.lat) == 0 {
			return fmt.Errorf("no write succeeded: %v", s.firstErr)
		}
	}
	return nil
}

// run adds one turn of d with n concurrent writers, each writing one entry
// per call until d is over (the calls in flight then finish, and count).
func (s *system) run(clients int, d time.Duration) {
	srv0, cli0 := cpuOf(s.pids()), cpuOf([]int{os.Getpid()})
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var mu sync.Mutex
	var wg sync.WaitGroup
	s.slices++
	if len(s.seq) < clients {
		s.seq = make([]int, clients)
	}
	start := time.Now()
	for c := range clients {
		wg.Go(func() {
			var mine []time.Duration
			for ; ctx.Err() == nil; s.seq[c]++ {
				seq := s.seq[c]
				t := time.Now()
				err := s.w(context.Background(), c, seq)
				if err != nil {
					mu.Lock()
					s.errs++
					if s.firstErr == nil {
						s.firstErr = err
					}
					mu.Unlock()
					continue
				}
				mine = append(mine, time.Since(t))
			}
			mu.Lock()
			s.lat = append(s.lat, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	s.elapsed += time.Since(start)
	s.srv += cpuOf(s.pids()) - srv0
	s.cli += cpuOf([]int{os.Getpid()}) - cli0
}

func (s *system) stats() stats {
	slices.Sort(s.lat)
	n := len(s.lat)
	return stats{
		rate: float64(n) / s.elapsed.Seconds(),
		p50:  msOf(s.lat[n/2]), p99: msOf(s.lat[n*99/100]), errors: s.errs,
		cpu: cpuPerWrite(s.srv, s.cli, n),
	}
}

// serverPids are the gpuplane server processes (none with -inproc).
func serverPids(servers []*server) []int {
	var pids []int
	for _, s := range servers {
		if s.cmd != nil && s.cmd.Process != nil {
			pids = append(pids, s.cmd.Process.Pid)
		}
	}
	return pids
}

// cpuOf is the CPU time (user and system) the processes have used so far,
// from /proc (Linux); 0 where it cannot be read.
func cpuOf(pids []int) time.Duration {
	var total time.Duration
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		// Fields after the command name, which is in parentheses: utime and
		// stime are the 12th and 13th, in clock ticks (100 per second).
		rest := string(b[bytes.LastIndexByte(b, ')')+1:])
		f := strings.Fields(rest)
		if len(f) < 13 {
			continue
		}
		u, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		total += time.Duration(u+st) * 10 * time.Millisecond
	}
	return total
}

// cpuPerWrite is the servers' and this process's (the clients') CPU per
// successful write: the machine's real cost of a write, which on a loaded
// machine tells more than rates that move with others' load. With -inproc
// the servers are in this process and counted as clients.
func cpuPerWrite(servers, clients time.Duration, writes int) string {
	if writes == 0 {
		return ""
	}
	per := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(writes) }
	return fmt.Sprintf("  CPU/write servers %4.0fµs clients %4.0fµs", per(servers), per(clients))
}

// --- etcd ---

// etcdCluster is a three-member etcd on loopback, written to with etcd's
// own Go client (go.etcd.io/etcd/client/v3: gRPC over one HTTP/2
// connection per member, as etcd's users run it), one client per member.
type etcdCluster struct {
	procs   []*exec.Cmd
	clients []*clientv3.Client
	version string
}

func startEtcd(bin, tmp string) (*etcdCluster, error) {
	out, _ := exec.Command(bin, "--version").Output()
	e := &etcdCluster{version: strings.Fields(string(out) + " etcd ?")[2]}
	var peers []string
	var ports [][]int
	for i := range 3 {
		p, err := freePorts(2)
		if err != nil {
			return nil, err
		}
		ports = append(ports, p)
		peers = append(peers, fmt.Sprintf("e%d=http://127.0.0.1:%d", i, p[1]))
	}
	for i, p := range ports {
		client := fmt.Sprintf("http://127.0.0.1:%d", p[0])
		peer := fmt.Sprintf("http://127.0.0.1:%d", p[1])
		cmd := exec.Command(bin, "--name", fmt.Sprintf("e%d", i), "--data-dir", filepath.Join(tmp, fmt.Sprintf("etcd%d", i)),
			"--listen-client-urls", client, "--advertise-client-urls", client,
			"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
			"--initial-cluster", strings.Join(peers, ","), "--initial-cluster-state", "new",
			"--initial-cluster-token", "gpuplane-bench", "--log-level", "error")
		cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
		if err := cmd.Start(); err != nil {
			e.stop()
			return nil, err
		}
		e.procs = append(e.procs, cmd)
		c, err := clientv3.New(clientv3.Config{Endpoints: []string{client}, DialTimeout: 5 * time.Second,
			Logger: zap.NewNop()})
		if err != nil {
			e.stop()
			return nil, err
		}
		e.clients = append(e.clients, c)
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, c := range e.clients {
		for {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_, err := c.Put(ctx, "ready", "1")
			cancel()
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				e.stop()
				return nil, fmt.Errorf("not ready: %w", err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return e, nil
}

// writer puts keys about the size of a gpuplane accelerator entry, each
// bench client through its member's etcd client.
func (e *etcdCluster) writer() writer {
	r := run0.Add(1)
	value := strings.Repeat("x", 96)
	return func(ctx context.Context, client, seq int) error {
		_, err := e.clients[client%len(e.clients)].Put(ctx, fmt.Sprintf("/bench/w%d-%d-%d", r, client, seq), value)
		return err
	}
}

func (e *etcdCluster) pids() []int {
	var pids []int
	for _, p := range e.procs {
		if p.Process != nil {
			pids = append(pids, p.Process.Pid)
		}
	}
	return pids
}

func (e *etcdCluster) stop() {
	for _, c := range e.clients {
		c.Close()
	}
	for _, p := range e.procs {
		if p.Process != nil {
			p.Process.Kill()
			p.Wait()
		}
	}
}

// --- helpers ---

func freePorts(n int) ([]int, error) {
	var out []int
	for len(out) < n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		u, uerr := net.ListenPacket("udp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		l.Close()
		if uerr != nil {
			continue
		}
		u.Close()
		if !slices.Contains(out, port) {
			out = append(out, port)
		}
	}
	return out, nil
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

func msOf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
