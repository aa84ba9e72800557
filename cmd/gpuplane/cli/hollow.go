package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpuplane/gpuplane/cmd/gpuplane/agent"
)

// runHollow is `gpuplane agent --hollow N`: N hollow client nodes in one
// process (agent.Config.Hollow), as kubemark runs hollow kubelets, until
// interrupted. Each is a whole client agent with its own memberlist on its
// own port, its own simulated cards, its own event stream from a server
// and its own (hollow) executor. They start rate a second (0: at once).
func runHollow(cmd *cobra.Command, g *globals, base agent.Config, n int, rate float64) error {
	if n < 1 || n > 10000 {
		return usageErrorf(cmd, "--hollow: must be 1 to 10000 nodes, got %d", n)
	}
	if rate != 0 && !(rate >= 0.001 && rate <= 1e6) {
		return usageErrorf(cmd, "--hollow-rate: must be 0 (all at once) or 0.001 to 1000000 nodes a second, got %v", rate)
	}
	if base.Server || base.Dev {
		return usageErrorf(cmd, "--hollow runs client nodes: drop --server and --dev")
	}
	if base.DataDir == "" {
		return usageErrorf(cmd, "--hollow needs --data-dir (each node gets a dir under it)")
	}
	prefix := base.NodeName
	if prefix == "" {
		prefix = "hollow"
	}
	fixedAPI, fixedGossip := cmd.Flags().Changed("api-port"), cmd.Flags().Changed("gossip-port")
	ctx := cmd.Context()
	agents := make([]*agent.Agent, n)
	closeAll := func() error {
		var wg sync.WaitGroup
		errs := make([]error, n)
		for i, a := range agents {
			if a != nil {
				wg.Go(func() { errs[i] = a.Close() })
			}
		}
		wg.Wait()
		return errors.Join(errs...)
	}
	var pace <-chan time.Time
	if rate > 0 {
		t := time.NewTicker(time.Duration(float64(time.Second) / rate))
		defer t.Stop()
		pace = t.C
	}
	for i := range n {
		if pace != nil && i > 0 {
			select {
			case <-pace:
			case <-ctx.Done():
				return closeAll()
			}
		}
		cfg := base
		cfg.Hollow = true
		cfg.NodeName = fmt.Sprintf("%s-%04d", prefix, i)
		cfg.DataDir = filepath.Join(base.DataDir, cfg.NodeName)
		cfg.APIPort, cfg.GossipPort, cfg.GatewayPort = 0, 0, 0
		if fixedAPI {
			cfg.APIPort = base.APIPort + i
		}
		if fixedGossip {
			cfg.GossipPort = base.GossipPort + i
		}
		cfg.Out = io.Discard
		a, err := agent.Start(ctx, cfg)
		if err != nil {
			_ = closeAll()
			return fmt.Errorf("hollow node %s: %w", cfg.NodeName, err)
		}
		agents[i] = a
	}
	fmt.Fprintf(g.stdout, "gpuplane agent %s: %d hollow client nodes %s-0000..%s-%04d running (data dirs under %s)\n",
		version, n, prefix, prefix, n-1, base.DataDir)
	waitAny(ctx, agents)
	fmt.Fprintln(g.stdout, "shutting down")
	return closeAll()
}

// waitAny returns when ctx ends or any agent stops.
func waitAny(ctx context.Context, agents []*agent.Agent) {
	done := make(chan struct{}, len(agents))
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for _, a := range agents {
		go func() {
			_ = a.Wait(wctx)
			done <- struct{}{}
		}()
	}
	<-done
}
