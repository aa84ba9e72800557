package engine

import (
	"context"
	"os"
	"strings"
	"syscall"
	"testing"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// Ollama 0.30 and later fits its model to the free memory it finds; the
// strict ollama dialect does too. On a whole card it takes what its
// neighbours leave free; on a share of a card it runs only under a hard
// limit, which holds it to its share; without one it is refused, with the
// reason.
func TestStrictOllamaTakesTheFreeMemoryUnlessHeld(t *testing.T) {
	c := newCard(t)
	// A neighbour (this test's process) holds 9000 MiB of the card.
	if err := c.usage.Register(c.uuid, os.Getpid(), 9000); err != nil {
		t.Fatal(err)
	}
	spec := &pb.ModelSpec{Model: "llama3.2:1b", ServedModelName: "chat",
		Engine: &pb.EngineSpec{Kind: KindSim, MemoryPercent: 45, Args: []string{"--dialect", "ollama", "--load-seconds", "0", "--tokens-per-second", "0"}}}
	share := &pb.Replica{Model: "chat", Cards: []uint32{0}, MemoryMib: 10365}

	p := Params{Model: "chat", Spec: spec, Host: "127.0.0.1", Port: 8100, Self: gpuplaneBin(t), Replica: share,
		Cards: []*pb.Card{{Index: 0, Uuid: c.uuid, MemoryMib: 23034}}}
	_, err := Build(p, Enforcement{Mode: ModeNone})
	if err == nil || !strings.Contains(err.Error(), "cannot be held to a share of 10365 MiB on a shared card without hard limits") {
		t.Fatalf("Ollama on 45 %% of a card without hard limits: %v, want the refusal", err)
	}

	for _, tc := range []struct {
		name    string
		replica *pb.Replica
		enf     Enforcement
		want    uint64
	}{
		{"whole card", &pb.Replica{Model: "chat", Cards: []uint32{0}, MemoryMib: 23034}, Enforcement{Mode: ModeNone}, 23034 - 9000},
		{"share under MPS", share, Enforcement{Mode: ModeMPS, MPSPipeDir: t.TempDir()}, 10365},
	} {
		proc, cmd := startBuiltOn(t, c, spec, false, tc.replica, tc.enf)
		if err := cmd.Preload.Run(context.Background(), proc.base, func(string) {}); err != nil {
			t.Fatalf("%s: preload: %v", tc.name, err)
		}
		c.waitUsed(t, proc.pid, tc.want, tc.name+": loaded")
		_ = syscall.Kill(proc.pid, syscall.SIGTERM)
		c.waitUsed(t, proc.pid, 0, tc.name+": stopped")
	}
}
