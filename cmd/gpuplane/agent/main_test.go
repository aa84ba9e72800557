package agent_test

import (
	"context"
	"os"
	"os/signal"
	"syscall"
	"testing"

	"github.com/gpuplane/gpuplane/cmd/gpuplane/cli"
)

// TestMain lets this test binary stand in for gpuplane where an in-process
// agent runs its own executable (os.Executable): its sim engines and engine
// log writers are `gpuplane engine …`. Without it, each would run this
// package's tests again, agents and engines included.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "engine" {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		code := cli.Run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
		stop()
		os.Exit(code)
	}
	os.Exit(m.Run())
}
