//go:build linux

package jepsen

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"connectrpc.com/connect"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
	"github.com/gpuplane/gpuplane/proto/gpuplane/v1/gpuplanev1connect"
)

// Clients is the set of Connect clients for one node's API.
type Clients struct {
	Accelerators gpuplanev1connect.AcceleratorServiceClient
	Models       gpuplanev1connect.ModelServiceClient
	Cluster      gpuplanev1connect.ClusterServiceClient
	Nodes        gpuplanev1connect.NodeServiceClient
	Audit        gpuplanev1connect.AuditServiceClient
	Events       gpuplanev1connect.EventServiceClient
}

// httpClient speaks HTTP/1.1, one request per connection at a time, so that a
// connection stalled by a partition or a paused process holds up only the
// request on it; every request carries its own deadline.
func httpClient() *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 2 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 32,
		IdleConnTimeout:     30 * time.Second,
	}}
}

func newClients(h *http.Client, base string) *Clients {
	return &Clients{
		Accelerators: gpuplanev1connect.NewAcceleratorServiceClient(h, base),
		Models:       gpuplanev1connect.NewModelServiceClient(h, base),
		Cluster:      gpuplanev1connect.NewClusterServiceClient(h, base),
		Nodes:        gpuplanev1connect.NewNodeServiceClient(h, base),
		Audit:        gpuplanev1connect.NewAuditServiceClient(h, base),
		Events:       gpuplanev1connect.NewEventServiceClient(h, base),
	}
}

// Cluster is the test network with its agents: servers s1..s3, clients c4,
// c5, and the hollow processes h6, h7, ... (each running several hollow
// client nodes) when asked for.
type Cluster struct {
	Dir     string
	Bin     string
	Net     *Network
	Agents  []*Agent // index i-1 is node i
	proxies []*DelayProxy
	http    *http.Client
	clients map[string]*Clients
}

// Servers are the Raft voters.
func (c *Cluster) Servers() []*Agent {
	var s []*Agent
	for _, a := range c.Agents {
		if a.Server {
			s = append(s, a)
		}
	}
	return s
}

// Hollow are the hollow processes.
func (c *Cluster) Hollow() []*Agent {
	var h []*Agent
	for _, a := range c.Agents {
		if a.Hollow > 0 {
			h = append(h, a)
		}
	}
	return h
}

// Nodes are the names of every cluster node the agents run.
func (c *Cluster) Nodes() []string {
	var n []string
	for _, a := range c.Agents {
		n = append(n, a.Nodes()...)
	}
	return n
}

// Client returns the API clients of the named agent (of a hollow process:
// its first node's).
func (c *Cluster) Client(name string) *Clients { return c.clients[name] }

// StartCluster builds the network, the Raft delay proxies and the agents,
// and waits until the three servers agree on a leader and every node is
// registered. hollow gives the hollow processes, one count of hollow nodes
// each (HollowLayout). On error everything created is removed.
func StartCluster(ctx context.Context, dir, bin string, hollow []int, agentArgs ...string) (*Cluster, error) {
	names := []string{"s1", "s2", "s3", "c4", "c5"}
	for range hollow {
		names = append(names, fmt.Sprintf("h%d", len(names)+1))
	}
	netw, err := NewNetwork(names)
	if err != nil {
		return nil, err
	}
	c := &Cluster{Dir: dir, Bin: bin, Net: netw, http: httpClient(), clients: map[string]*Clients{}}
	join := []string{}
	for i := 1; i <= 3; i++ {
		join = append(join, fmt.Sprintf("%s:%d", nodeIP(i), gossipPort))
	}
	for i, name := range names {
		a := newAgent(bin, dir, i+1, name, strings.HasPrefix(name, "s"), join)
		if i >= 5 {
			a.Hollow = hollow[i-5]
		}
		a.extra = agentArgs
		c.Agents = append(c.Agents, a)
		c.clients[name] = newClients(c.http, a.APIURL())
	}
	// Raft links between servers go through one delay proxy per
	// destination.
	for _, dst := range c.Servers() {
		p, err := NewDelayProxy(fmt.Sprintf("%s:%d", hostIP, proxyPortBase+dst.Index), fmt.Sprintf("%s:%d", dst.IP(), raftPort))
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("delay proxy for %s: %w", dst.Name, err)
		}
		c.proxies = append(c.proxies, p)
		for _, src := range c.Servers() {
			if src != dst {
				if err := netw.RedirectTCP(src.Name, dst.IP(), raftPort, proxyPortBase+dst.Index); err != nil {
					c.Close()
					return nil, err
				}
			}
		}
	}
	for _, a := range c.Agents {
		if err := a.Start(); err != nil {
			c.Close()
			return nil, err
		}
	}
	if err := c.WaitHealthy(ctx, 90*time.Second); err != nil {
		c.Close()
		return nil, fmt.Errorf("cluster did not form: %w", err)
	}
	return c, nil
}

// SetRaftDelay sets the delay of every Raft link.
func (c *Cluster) SetRaftDelay(d, jitter time.Duration) {
	for _, p := range c.proxies {
		p.SetDelay(d, jitter)
	}
}

// ProxiedConns is how many Raft connections went through the delay proxies.
func (c *Cluster) ProxiedConns() int64 {
	var n int64
	for _, p := range c.proxies {
		n += p.Accepted.Load()
	}
	return n
}

// Status asks one server for its Raft status.
func (c *Cluster) Status(ctx context.Context, name string) (*pb.StatusResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	res, err := c.clients[name].Cluster.Status(ctx, connect.NewRequest(&pb.StatusRequest{}))
	if err != nil {
		return nil, err
	}
	return res.Msg, nil
}

// Leader is the name of the server that says it leads, or "".
func (c *Cluster) Leader(ctx context.Context) string {
	for _, s := range c.Servers() {
		if !s.Running() || s.Paused() {
			continue
		}
		if st, err := c.Status(ctx, s.Name); err == nil && st.GetRaftState() == "Leader" {
			return s.Name
		}
	}
	return ""
}

// WaitHealthy waits until every server is up, agrees on one leader, has the
// same applied index and state hash as the others, and every node is
// registered and alive.
func (c *Cluster) WaitHealthy(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) && ctx.Err() == nil {
		last = c.healthy(ctx)
		if last == nil {
			return nil
		}
		time.Sleep(500 * time.Millisecond)
	}
	if last == nil {
		last = ctx.Err()
	}
	return last
}

func (c *Cluster) healthy(ctx context.Context) error {
	var leader string
	var applied uint64
	var hash string
	for i, s := range c.Servers() {
		st, err := c.Status(ctx, s.Name)
		if err != nil {
			return fmt.Errorf("status of %s: %w", s.Name, err)
		}
		if st.GetLeader() == "" {
			return fmt.Errorf("%s knows no leader", s.Name)
		}
		if len(st.GetServers()) != 3 {
			return fmt.Errorf("%s sees %d Raft servers, want 3", s.Name, len(st.GetServers()))
		}
		if i == 0 {
			leader, applied, hash = st.GetLeader(), st.GetAppliedIndex(), st.GetStateHash()
			continue
		}
		if st.GetLeader() != leader {
			return fmt.Errorf("%s follows %s, another follows %s", s.Name, st.GetLeader(), leader)
		}
		if st.GetAppliedIndex() != applied || st.GetStateHash() != hash {
			return fmt.Errorf("%s applied %d (hash %.12s), another %d (hash %.12s)", s.Name, st.GetAppliedIndex(), st.GetStateHash(), applied, hash)
		}
	}
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	nodes, err := c.clients["s1"].Nodes.ListNodes(cctx, connect.NewRequest(&pb.ListNodesRequest{}))
	if err != nil {
		return fmt.Errorf("list nodes: %w", err)
	}
	alive := 0
	for _, n := range nodes.Msg.GetNodes() {
		if n.GetStatus() == pb.NodeStatus_NODE_STATUS_ALIVE {
			alive++
		}
	}
	if want := len(c.Nodes()); alive != want {
		return fmt.Errorf("%d of %d nodes registered and alive", alive, want)
	}
	return nil
}

// Heal lifts every fault: rules flushed, delay off, paused agents continued,
// stopped agents started.
func (c *Cluster) Heal() error {
	var errs []error
	errs = append(errs, c.Net.Heal())
	c.SetRaftDelay(0, 0)
	for _, a := range c.Agents {
		a.Resume()
		if !a.Running() {
			errs = append(errs, a.Start())
		}
	}
	return errors.Join(errs...)
}

func (c *Cluster) index(name string) int {
	for i, a := range c.Agents {
		if a.Name == name {
			return i
		}
	}
	panic("no node " + name)
}

// StopAll stops every agent gracefully (SIGTERM, then SIGKILL after 10s).
func (c *Cluster) StopAll() {
	for _, a := range c.Agents {
		a.Stop(10 * time.Second)
	}
}

// Close kills the agents and removes proxies, namespaces and the bridge.
func (c *Cluster) Close() {
	for _, a := range c.Agents {
		a.Kill()
	}
	for _, p := range c.proxies {
		p.Close()
	}
	c.Net.Close()
	if t, ok := c.http.Transport.(*http.Transport); ok {
		t.CloseIdleConnections()
	}
}

// removeDataDirs deletes the agents' data (kept after a failed run).
func (c *Cluster) removeDataDirs() {
	os.RemoveAll(filepath.Join(c.Dir, "data"))
}
