//go:build linux

package jepsen

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// Fault kinds the nemesis draws from.
const (
	FaultPartitionHalves = "partition-majority-minority"
	FaultPartitionLeader = "partition-isolate-leader"
	FaultPartitionBridge = "partition-bridge"
	FaultPartitionRing   = "partition-ring"
	FaultKill            = "kill"
	FaultKillLeader      = "kill-leader"
	FaultPause           = "pause"
	FaultLoss            = "packet-loss"
	FaultDelay           = "raft-delay"
	FaultMembership      = "membership"
)

// AllFaults is every fault kind.
var AllFaults = []string{
	FaultPartitionHalves, FaultPartitionLeader, FaultPartitionBridge, FaultPartitionRing,
	FaultKill, FaultKillLeader, FaultPause, FaultLoss, FaultDelay, FaultMembership,
}

// ParseFaults turns a comma-separated list (with "partition" for all four
// partition kinds, and "all") into fault kinds.
func ParseFaults(s string) ([]string, error) {
	var out []string
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		switch {
		case f == "" || f == "none":
		case f == "all":
			out = append(out, AllFaults...)
		case f == "partition":
			out = append(out, FaultPartitionHalves, FaultPartitionLeader, FaultPartitionBridge, FaultPartitionRing)
		case slices.Contains(AllFaults, f):
			out = append(out, f)
		default:
			return nil, fmt.Errorf("unknown fault %q (know: all, partition, %s)", f, strings.Join(AllFaults, ", "))
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// FaultRecord is one injected fault, for the report.
type FaultRecord struct {
	Kind    string        `json:"kind"`
	Detail  string        `json:"detail"`
	Start   time.Duration `json:"start"`
	Healed  time.Duration `json:"healed"`
	Problem string        `json:"problem,omitempty"`
}

// Nemesis injects faults from a seeded schedule: a fault for a random
// 2–Hold seconds, heal, a quiet 1–Quiet seconds, and again, until ctx ends.
type Nemesis struct {
	C      *Cluster
	Faults []string
	Seed   uint64
	Hold   time.Duration
	Quiet  time.Duration
	Log    func(format string, args ...any)
	start  time.Time

	Records []FaultRecord
}

// Run injects faults until ctx ends, then heals.
func (n *Nemesis) Run(ctx context.Context) {
	n.start = time.Now()
	rng := rand.New(rand.NewPCG(n.Seed, 0x4e3e))
	if len(n.Faults) == 0 {
		<-ctx.Done()
		return
	}
	for ctx.Err() == nil {
		kind := n.Faults[rng.IntN(len(n.Faults))]
		hold := 2*time.Second + time.Duration(rng.Int64N(int64(n.Hold-2*time.Second)+1))
		rec := FaultRecord{Kind: kind, Start: time.Since(n.start).Round(time.Millisecond)}
		heal, detail, err := n.inject(ctx, kind, rng)
		rec.Detail = detail
		if err != nil {
			rec.Problem = err.Error()
		}
		n.Log("nemesis %7s: %s %s (hold %s)", rec.Start, kind, detail, hold.Round(time.Millisecond))
		sleep(ctx, hold)
		if heal != nil {
			if err := heal(); err != nil {
				rec.Problem = strings.TrimSpace(rec.Problem + "; heal: " + err.Error())
			}
		}
		if err := n.C.Heal(); err != nil {
			rec.Problem = strings.TrimSpace(rec.Problem + "; heal: " + err.Error())
		}
		rec.Healed = time.Since(n.start).Round(time.Millisecond)
		if rec.Problem != "" {
			n.Log("nemesis %7s: %s: %s", rec.Healed, kind, rec.Problem)
		}
		n.Records = append(n.Records, rec)
		sleep(ctx, time.Second+time.Duration(rng.Int64N(int64(n.Quiet-time.Second)+1)))
	}
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// inject starts one fault and returns what undoes it beyond the generic
// heal, and a description.
func (n *Nemesis) inject(ctx context.Context, kind string, rng *rand.Rand) (func() error, string, error) {
	c := n.C
	names := make([]string, len(c.Agents))
	for i, a := range c.Agents {
		names[i] = a.Name
	}
	switch kind {
	case FaultPartitionHalves:
		perm := rng.Perm(len(names))
		k := 1 + rng.IntN((len(names)-1)/2) // minority: 1 or 2 of five nodes
		var minority, majority []string
		for i, p := range perm {
			if i < k {
				minority = append(minority, names[p])
			} else {
				majority = append(majority, names[p])
			}
		}
		return nil, fmt.Sprintf("%v | %v", minority, majority), n.partition(groupsCut(minority, majority))
	case FaultPartitionLeader:
		leader := c.Leader(ctx)
		if leader == "" {
			leader = "s1"
		}
		var rest []string
		for _, nm := range names {
			if nm != leader {
				rest = append(rest, nm)
			}
		}
		return nil, fmt.Sprintf("[%s] | %v", leader, rest), n.partition(groupsCut([]string{leader}, rest))
	case FaultPartitionBridge:
		// Two halves that see only the bridge node in the middle (of five
		// nodes: two, one, two).
		perm := rng.Perm(len(names))
		k := (len(names) - 1) / 2
		var a, b []string
		for _, p := range perm[:k] {
			a = append(a, names[p])
		}
		mid := names[perm[k]]
		for _, p := range perm[k+1:] {
			b = append(b, names[p])
		}
		return nil, fmt.Sprintf("%v <- %s -> %v", a, mid, b), n.partition(groupsCut(a, b))
	case FaultPartitionRing:
		// Each node sees only its two neighbours in a random ring.
		perm := rng.Perm(len(names))
		ring := make([]string, len(names))
		for i, p := range perm {
			ring[i] = names[p]
		}
		cut := map[[2]string]bool{}
		for i := range ring {
			for j := range ring {
				d := (j - i + len(ring)) % len(ring)
				if i != j && d != 1 && d != len(ring)-1 {
					cut[[2]string{ring[i], ring[j]}] = true
				}
			}
		}
		return nil, fmt.Sprintf("ring %v", ring), n.partition(cut)
	case FaultKill, FaultKillLeader:
		victim := names[rng.IntN(len(names))]
		if kind == FaultKillLeader {
			if l := c.Leader(ctx); l != "" {
				victim = l
			}
		}
		c.Agents[c.index(victim)].Kill()
		return nil, "kill -9 " + victim, nil
	case FaultPause:
		victim := names[rng.IntN(len(names))]
		c.Agents[c.index(victim)].Pause()
		return nil, "SIGSTOP " + victim, nil
	case FaultLoss:
		p := []float64{0.1, 0.2, 0.3}[rng.IntN(3)]
		var hit []string
		for _, nm := range names {
			if rng.IntN(2) == 0 {
				hit = append(hit, nm)
			}
		}
		if len(hit) == 0 {
			hit = names
		}
		rule := fmt.Sprintf("-m statistic --mode random --probability %.2f -j DROP", p)
		for _, nm := range hit {
			if err := c.Net.SetFaults(nm, []string{rule}, []string{rule}); err != nil {
				return nil, "", err
			}
		}
		return nil, fmt.Sprintf("%.0f%% loss each way on %v", p*100, hit), nil
	case FaultDelay:
		d := time.Duration(50+rng.IntN(250)) * time.Millisecond
		c.SetRaftDelay(d, d/2)
		return nil, fmt.Sprintf("Raft links delayed %s + up to %s", d, d/2), nil
	case FaultMembership:
		return n.membership(ctx, rng)
	}
	return nil, "", fmt.Errorf("unknown fault %q", kind)
}

// groupsCut blocks every pair across the two groups.
func groupsCut(a, b []string) map[[2]string]bool {
	cut := map[[2]string]bool{}
	for _, x := range a {
		for _, y := range b {
			cut[[2]string{x, y}] = true
			cut[[2]string{y, x}] = true
		}
	}
	return cut
}

// partition installs DROP rules in each namespace for every blocked pair:
// the peer's address both ways, and the peer's Raft delay proxy, whose
// traffic arrives from the bridge address.
func (n *Nemesis) partition(cut map[[2]string]bool) error {
	c := n.C
	in, out := map[string][]string{}, map[string][]string{}
	for pair := range cut {
		src, dst := c.Agents[c.index(pair[0])], c.Agents[c.index(pair[1])]
		out[src.Name] = append(out[src.Name], "-d "+dst.IP()+" -j DROP")
		in[src.Name] = append(in[src.Name], "-s "+dst.IP()+" -j DROP")
		if dst.Server {
			port := proxyPortBase + dst.Index
			out[src.Name] = append(out[src.Name], fmt.Sprintf("-p tcp -d %s --dport %d -j DROP", hostIP, port))
			in[src.Name] = append(in[src.Name], fmt.Sprintf("-p tcp -s %s --sport %d -j DROP", hostIP, port))
		}
	}
	for _, a := range c.Agents {
		if err := c.Net.SetFaults(a.Name, in[a.Name], out[a.Name]); err != nil {
			return err
		}
	}
	return nil
}

// membership removes a server from Raft and brings it back as a new one:
// kill -9, `remove-peer` once gossip sees it dead, wipe its data dir, start
// it again (it rejoins through gossip and is added back as a voter).
func (n *Nemesis) membership(ctx context.Context, rng *rand.Rand) (func() error, string, error) {
	c := n.C
	servers := c.Servers()
	victim := servers[rng.IntN(len(servers))]
	victim.Kill()
	detail := fmt.Sprintf("remove and re-add %s", victim.Name)
	deadline := time.Now().Add(30 * time.Second)
	var err error
	for time.Now().Before(deadline) && ctx.Err() == nil {
		for _, s := range servers {
			if s == victim {
				continue
			}
			cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			_, err = c.Client(s.Name).Cluster.RemovePeer(cctx, connect.NewRequest(&pb.RemovePeerRequest{Name: victim.Name}))
			cancel()
			if err == nil {
				if werr := victim.Wipe(); werr != nil {
					return nil, detail, werr
				}
				return nil, detail + " (removed, data wiped)", nil
			}
		}
		sleep(ctx, time.Second)
	}
	// Not removed: it restarts with its data at heal.
	return nil, detail + " (not removed)", fmt.Errorf("remove-peer %s: %v", victim.Name, err)
}
