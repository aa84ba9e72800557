// Command gpuplane is the gpuplane CLI and agent; see package cli.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"runtime/pprof"
	"syscall"

	"github.com/gpuplane/gpuplane/cmd/gpuplane/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// GPUPLANE_CPUPROFILE=FILE writes a CPU profile of the whole run (an
	// agent's until it stops on SIGINT or SIGTERM), for benchmarks:
	// bench/cluster sets it with GPUPLANE_BENCH_CPUPROFILE_DIR.
	if path := os.Getenv("GPUPLANE_CPUPROFILE"); path != "" {
		f, err := os.Create(path)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "GPUPLANE_CPUPROFILE: %v\n", err)
			os.Exit(1)
		}
		defer f.Close()
		defer pprof.StopCPUProfile()
	}
	code := cli.Run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	if code != 0 {
		pprof.StopCPUProfile()
		os.Exit(code)
	}
}
