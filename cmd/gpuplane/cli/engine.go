package cli

import (
	"log/slog"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpuplane/gpuplane/node/engine/sim"
	"github.com/gpuplane/gpuplane/node/executor"
	"github.com/gpuplane/gpuplane/node/inventory"
)

// newEngineCommand is `gpuplane engine`, the engines built into the binary.
// The executor runs them; people rarely do, so the group is hidden.
func newEngineCommand(g *globals) *cobra.Command {
	c := newGroupCommand("engine", "Run an engine built into gpuplane", nil, newEngineSimCommand(g), newEngineLogCommand(g))
	c.Hidden = true
	return c
}

// newEngineSimCommand is `gpuplane engine sim`: the simulated inference
// engine of SPEC §6. It serves until SIGTERM or interrupt.
func newEngineSimCommand(g *globals) *cobra.Command {
	var cfg sim.Config
	var loadSeconds float64
	var cards string
	cmd := &cobra.Command{
		Use:   "sim",
		Short: "Serve a simulated OpenAI-compatible model",
		Long: `Serve a simulated model over an OpenAI-compatible API (/v1/models,
/v1/completions, /v1/chat/completions, /health). /health answers 503 for
--load-seconds, then 200; once loaded the engine registers --memory-mib on each
of --card-uuids with the simulated NVML (the directory in $` + inventory.EnvSimUsageDir + `),
so that the node's watchdog sees it. The executor starts it for deployments of
engine kind sim, sized to their share.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cfg.ServedModelName == "" {
				return usageErrorf(cmd, "--served-model-name is required")
			}
			if loadSeconds < 0 || cfg.TokensPerSecond < 0 {
				return usageErrorf(cmd, "--load-seconds and --tokens-per-second must not be negative")
			}
			cfg.LoadTime = time.Duration(loadSeconds * float64(time.Second))
			if cards != "" {
				cfg.CardUUIDs = strings.Split(cards, ",")
			}
			if dir := g.getenv(inventory.EnvSimUsageDir); dir != "" {
				cfg.Usage = inventory.NewSimUsage(dir)
			}
			cfg.Logger = slog.New(slog.NewTextHandler(g.stderr, nil))
			return sim.Run(ctx(cmd), cfg)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Host, "host", "127.0.0.1", "address to listen on")
	f.IntVar(&cfg.Port, "port", 8000, "port to listen on")
	f.StringVar(&cfg.ServedModelName, "served-model-name", "", "the model name clients send")
	f.Float64Var(&loadSeconds, "load-seconds", 1, "seconds before /health answers 200")
	f.Uint64Var(&cfg.MemoryMiB, "memory-mib", 0, "GPU memory to register on each card once loaded (the executor passes the share)")
	f.Float64Var(&cfg.TokensPerSecond, "tokens-per-second", 50, "generation speed; 0 answers at once")
	f.StringVar(&cards, "card-uuids", "", "cards to register the memory on, comma-separated UUIDs")
	return cmd
}

// newEngineLogCommand is `gpuplane engine log`: the executor runs one next to
// every engine, its stdin the engine's stdout and stderr, to write the
// engine's log with a cap on its size on disk (see executor.WriteLog).
func newEngineLogCommand(g *globals) *cobra.Command {
	var dir string
	var maxBytes int64
	var keep int
	cmd := &cobra.Command{
		Use:   "log",
		Short: "Write an engine's output (stdin) to its size-capped, rotated log",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if dir == "" || maxBytes <= 0 || keep < 0 {
				return usageErrorf(cmd, "--dir is required, --max-bytes must be more than 0 and --keep at least 0")
			}
			return executor.WriteLog(g.stdin, dir, maxBytes, keep)
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "dir", "", "the replica's directory, where engine.log is written")
	f.Int64Var(&maxBytes, "max-bytes", 10<<20, "the most bytes of log kept on disk, all files together")
	f.IntVar(&keep, "keep", 3, "rotated files kept besides engine.log")
	return cmd
}
