// Command gossip runs -n gossip members (cluster.NewGossip, the agents'
// own memberlist set-up) in one process on loopback, joined one after the
// other through a random earlier member, and reports how long until every
// member sees every other alive and then, over -d, the process's CPU per
// member and how many members some member does not hold alive. With
// GOMAXPROCS=1 it shows whether a gossip configuration survives members
// that share little CPU (a hollow fleet, bench/fleet) without suspecting
// each other faster than they can refute it:
//
//	GOMAXPROCS=1 go run ./bench/gossip -n 300
package main

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	_ "net/http/pprof"
	"os"
	"runtime/pprof"
	"syscall"
	"time"

	"github.com/gpuplane/gpuplane/cluster"
)

func cpu() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func main() {
	n := flag.Int("n", 200, "gossip members")
	dur := flag.Duration("d", 20*time.Second, "how long CPU is measured once all members see each other")
	prof := flag.String("prof", "", "write a CPU profile of the measured period to this file")
	rate := flag.Float64("rate", 0, "members started per second (0: each as soon as the one before has joined)")
	kill := flag.Float64("kill", 0, "then shut this fraction of the members down at once (no leave) and measure until every other member holds them failed")
	pprofAddr := flag.String("pprof", "", "serve net/http/pprof on this address (to profile the joins)")
	flag.Parse()
	if *pprofAddr != "" {
		go func() { _ = http.ListenAndServe(*pprofAddr, nil) }()
	}
	var pace *time.Ticker
	if *rate > 0 {
		pace = time.NewTicker(time.Duration(float64(time.Second) / *rate))
	}
	lg := slog.New(slog.NewTextHandler(io.Discard, nil))
	var gs []*cluster.Gossip
	for i := range *n {
		if pace != nil {
			<-pace.C
		}
		g, err := cluster.NewGossip(cluster.GossipConfig{Name: fmt.Sprintf("n%04d", i), Bind: "127.0.0.1:0",
			Meta: cluster.Meta{Role: "client", API: "x:1", Digest: "abcdefabcdef"}, Logger: lg})
		if err != nil {
			panic(err)
		}
		if i > 0 {
			for try := 0; ; try++ {
				if _, err := g.Join([]string{gs[rand.IntN(len(gs))].Addr()}); err == nil {
					break
				} else if try > 5 {
					panic(err)
				}
			}
		}
		gs = append(gs, g)
		if len(gs)%100 == 0 {
			fmt.Fprintf(os.Stderr, "%s %d members joined\n", time.Now().Format("15:04:05"), len(gs))
		}
	}
	start := time.Now()
	for {
		ok := 0
		for _, g := range gs {
			alive := 0
			for _, m := range g.Members() {
				if m.Status == cluster.GossipAlive {
					alive++
				}
			}
			if alive == *n {
				ok++
			}
		}
		if ok == *n {
			break
		}
		if time.Since(start) > time.Minute {
			fmt.Printf("%d of %d members did not see every member alive within a minute\n", *n-ok, *n)
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	fmt.Printf("%d members: %v until every member held every member alive\n", *n, time.Since(start).Round(time.Millisecond))
	time.Sleep(5 * time.Second)
	if *prof != "" {
		f, err := os.Create(*prof)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		defer pprof.StopCPUProfile()
	}
	c0, t0 := cpu(), time.Now()
	time.Sleep(*dur)
	c := cpu() - c0
	el := time.Since(t0)
	notAlive := 0
	for _, g := range gs {
		for _, m := range g.Members() {
			if m.Status != cluster.GossipAlive {
				notAlive++
			}
		}
	}
	fmt.Printf("n=%d cpu %.3f cores, %.1f ms/s per node, %.3f s/min per node; not-alive views %d\n", *n, c.Seconds()/el.Seconds(), c.Seconds()/el.Seconds()*1000/float64(*n), c.Seconds()/el.Minutes()/float64(*n), notAlive)
	if *kill > 0 {
		killed(gs, max(1, int(*kill*float64(*n))))
	}
}

// killed shuts the last k members down at once and reports how long until
// every remaining member holds each of them failed, the CPU meanwhile,
// and how many live members some member held failed on the way. It looks
// up the killed members by name every 500 ms and scans whole views only
// every 2 s, so that its own reading costs little of the CPU it measures.
func killed(gs []*cluster.Gossip, k int) {
	live := gs[:len(gs)-k]
	var dead []string
	for i, g := range gs[len(gs)-k:] {
		dead = append(dead, fmt.Sprintf("n%04d", len(gs)-k+i))
		_ = g.Shutdown()
	}
	isDead := map[string]bool{}
	for _, name := range dead {
		isDead[name] = true
	}
	c0, t0 := cpu(), time.Now()
	falsely := map[string]bool{}
	for round := 0; ; round++ {
		done := 0
		for _, g := range live {
			failed := 0
			for _, name := range dead {
				if m, ok := g.Member(name); ok && m.Status != cluster.GossipAlive {
					failed++
				}
			}
			if failed == k {
				done++
			}
			if round%4 == 0 {
				for _, m := range g.Members() {
					if !isDead[m.Name] && m.Status != cluster.GossipAlive {
						falsely[m.Name] = true
					}
				}
			}
		}
		if done == len(live) || time.Since(t0) > 2*time.Minute {
			el := time.Since(t0)
			fmt.Printf("%d of %d members shut down at once: %d of %d live members held all of them failed after %v; CPU %.2f cores meanwhile; %d live members held failed by some member on the way\n",
				k, len(gs), done, len(live), el.Round(100*time.Millisecond), (cpu()-c0).Seconds()/el.Seconds(), len(falsely))
			return
		}
		time.Sleep(500 * time.Millisecond)
	}
}
