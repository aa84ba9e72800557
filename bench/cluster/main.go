// Command cluster measures what the multi-node cluster promises:
//
//   - failover: a three-server cluster loses its leader (stopped abruptly,
//     in process: no leadership transfer, no leave; the followers simply
//     hear nothing more, as after kill -9); the time from its Raft stopping
//     to the first write that succeeds through a surviving server, median
//     of several trials (the old leader restarts between trials);
//   - gossip convergence: N in-process memberlist nodes (64 by default) and
//     a new node joining one of them; the time until all N see the new
//     node's inventory digest, and until all see a changed digest;
//   - commit throughput: concurrent writers (1, 64, 256) sending one log
//     entry per call (ClusterService.Apply over Connect/h2c, spread over the
//     three servers, followers forwarding to the leader) for a fixed time;
//   - the same put workload against a three-member etcd on this machine
//     (etcd's JSON gateway, /v3/kv/put, spread over its members), when an
//     etcd binary is on PATH, with the ratio. Without etcd that part is
//     skipped.
//
// Everything runs on loopback in one run, so the numbers compare.
package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
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
	etcdBin := flag.String("etcd", "etcd", "etcd binary for the comparison (skipped when not found)")
	flag.DurationVar(&idle, "idle", 0, "first leave the three servers idle this long and count term changes (spurious elections)")
	flag.StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile of the gpuplane throughput runs to this file")
	procs := flag.Int("procs", 3*runtime.NumCPU(), "GOMAXPROCS of this process, which runs all three servers")
	flag.Parse()
	// The three gpuplane servers share this process, while etcd runs three
	// processes with GOMAXPROCS=NumCPU each. On a loaded machine the kernel
	// shares CPU per thread, so with the default GOMAXPROCS gpuplane would
	// get a third of etcd's share and the comparison would measure the
	// scheduler: give this process as many Go threads as the three etcds.
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
	cpuProfile string
	idle       time.Duration
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

	servers, err := startServers(tmp)
	if err != nil {
		return err
	}
	defer func() {
		for _, s := range servers {
			s.stop()
		}
	}()

	if idle > 0 {
		if err := benchIdle(servers, idle); err != nil {
			return err
		}
	}

	if trials > 0 {
		fmt.Printf("\nfailover: leader stopped abruptly, time to the first successful write through a survivor\n")
		if err := benchFailover(servers, trials); err != nil {
			return err
		}
	}

	fmt.Printf("\ncommit throughput, three servers, one entry per call, %v per run\n", d)
	gp := map[int]float64{}
	if cpuProfile != "" {
		f, err := os.Create(cpuProfile)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
	}
	for _, n := range clients {
		st, err := throughput(n, d, gpuplaneWriter(servers))
		if err != nil {
			return err
		}
		gp[n] = st.rate
		fmt.Printf("  gpuplane  %4d clients  %8.0f writes/s  p50 %6.2fms  p99 %6.2fms  errors %d\n", n, st.rate, st.p50, st.p99, st.errors)
	}
	if cpuProfile != "" {
		pprof.StopCPUProfile()
	}

	path, err := exec.LookPath(etcdBin)
	if err != nil {
		fmt.Printf("\netcd comparison skipped: no %q on PATH (Debian: apt-get install etcd-server)\n", etcdBin)
		return nil
	}
	etcd, err := startEtcd(path, tmp)
	if err != nil {
		return fmt.Errorf("etcd: %w", err)
	}
	defer etcd.stop()
	fmt.Printf("\nthe same workload against a three-member etcd (%s, JSON gateway /v3/kv/put)\n", etcd.version)
	for _, n := range clients {
		st, err := throughput(n, d, etcd.writer())
		if err != nil {
			return err
		}
		fmt.Printf("  etcd      %4d clients  %8.0f writes/s  p50 %6.2fms  p99 %6.2fms  errors %d   gpuplane/etcd %.2fx\n",
			n, st.rate, st.p50, st.p99, st.errors, gp[n]/st.rate)
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

type server struct {
	cfg agent.Config
	a   *agent.Agent
}

func (s *server) url() string {
	return "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(s.cfg.APIPort))
}

func (s *server) start() error {
	a, err := agent.Start(context.Background(), s.cfg)
	s.a = a
	return err
}

func (s *server) stop() {
	if s.a != nil {
		s.a.Close()
		s.a = nil
	}
}

func startServers(tmp string) ([]*server, error) {
	var servers []*server
	var join []string
	for i := range 3 {
		ports, err := freePorts(3)
		if err != nil {
			return nil, err
		}
		s := &server{cfg: agent.Config{
			Server: true, BootstrapExpect: 3, NodeName: fmt.Sprintf("s%d", i+1), DataDir: filepath.Join(tmp, fmt.Sprintf("s%d", i+1)),
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
	return servers, waitConverged(servers, 30*time.Second)
}

// waitConverged waits until every running server follows one leader and has
// applied its commit index.
func waitConverged(servers []*server, within time.Duration) error {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		var lead *server
		for _, s := range servers {
			if s.a != nil && s.a.Cluster().IsLeader() {
				lead = s
			}
		}
		ok := lead != nil
		for _, s := range servers {
			if s.a == nil || !ok {
				continue
			}
			st := s.a.Cluster().Status()
			ok = st.Leader == lead.cfg.NodeName && st.AppliedIndex >= lead.a.Cluster().Status().CommitIndex-1
		}
		if ok {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
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
			if s.a.Cluster().IsLeader() {
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
			max = mathMax(max, s.a.Cluster().Status().Term)
		}
		return max
	}
	leaders := map[string]bool{}
	start, t0 := term(), time.Now()
	for time.Since(t0) < d {
		for _, s := range servers {
			if s.a.Cluster().IsLeader() {
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

func gpuplaneWriter(servers []*server) writer {
	httpc := rpc.HTTPClient()
	var cs []gpuplanev1connect.ClusterServiceClient
	for _, s := range servers {
		cs = append(cs, gpuplanev1connect.NewClusterServiceClient(httpc, s.url()))
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
}

func throughput(clients int, d time.Duration, w writer) (stats, error) {
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
				t := time.Now()
				err := w(context.Background(), c, seq)
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
	return stats{
		rate: float64(len(lat)) / elapsed.Seconds(),
		p50:  msOf(lat[len(lat)/2]), p99: msOf(lat[len(lat)*99/100]), errors: errs,
	}, nil
}

// --- etcd ---

type etcdCluster struct {
	procs   []*exec.Cmd
	clients []string
	version string
	http    *http.Client
}

func startEtcd(bin, tmp string) (*etcdCluster, error) {
	out, _ := exec.Command(bin, "--version").Output()
	e := &etcdCluster{version: strings.Fields(string(out) + " etcd ?")[2], http: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 512}}}
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
		e.clients = append(e.clients, client)
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, c := range e.clients {
		for {
			err := e.put(context.Background(), c, "ready", "1")
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

func (e *etcdCluster) put(ctx context.Context, base, key, value string) error {
	body, _ := json.Marshal(map[string]string{
		"key": base64.StdEncoding.EncodeToString([]byte(key)), "value": base64.StdEncoding.EncodeToString([]byte(value)),
	})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v3/kv/put", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := e.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("put: %s: %s", resp.Status, b)
	}
	return nil
}

// writer puts keys about the size of a gpuplane accelerator entry.
func (e *etcdCluster) writer() writer {
	r := run0.Add(1)
	value := strings.Repeat("x", 96)
	return func(ctx context.Context, client, seq int) error {
		return e.put(ctx, e.clients[client%len(e.clients)], fmt.Sprintf("/bench/w%d-%d-%d", r, client, seq), value)
	}
}

func (e *etcdCluster) stop() {
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
