package executor

import (
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/node/watchdog"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// Starts on a card run side by side only while every share on it fits the
// card and none of them starts alone; a start waits for the first start in
// its way, and says why.
func TestAdmitStartsThatFit(t *testing.T) {
	card := &pb.Card{Index: 0, Uuid: "GPU-0", MemoryMib: 24000}
	e := &Executor{cards: map[uint32]*pb.Card{0: card}, engines: map[key]watchdog.Engine{}}
	c := &cardStarts{index: 0}
	simStart := func(model string, mib uint64) *starter {
		return &starter{k: key{model, 0}, kind: "sim", shareMiB: mib, timeout: 2 * time.Minute}
	}
	first := simStart("first", 9000)
	if b, why := e.admit(c, first); b != nil {
		t.Fatalf("a start on an idle card waits for %v: %s", b.k, why)
	}
	c.starting = append(c.starting, started{starter: first, since: time.Now()})

	for _, tc := range []struct {
		name    string
		st      *starter
		running uint64 // MiB of an engine already running on the card
		why     string
	}{
		{name: "fits", st: simStart("second", 9000)},
		{name: "does not fit", st: simStart("second", 16000), why: "the card's 24000 MiB do not hold every share at once (25000 MiB)"},
		{name: "does not fit beside a running engine", st: simStart("second", 9000), running: 7000,
			why: "the card's 24000 MiB do not hold every share at once (25000 MiB)"},
		{name: "the whole card", st: simStart("second", 0), why: "the card's 24000 MiB do not hold every share at once (33000 MiB)"},
		{name: "starts alone", st: &starter{k: key{"second", 0}, kind: "vllm", alone: true, shareMiB: 1000},
			why: "a vllm engine starts alone"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clear(e.engines)
			if tc.running > 0 {
				e.engines[key{"running", 0}] = watchdog.Engine{Model: "running", CardUUIDs: []string{"GPU-0"}, ShareMiB: tc.running}
			}
			b, why := e.admit(c, tc.st)
			switch {
			case tc.why == "" && b != nil:
				t.Errorf("waits for %v: %s; want it admitted", b.k, why)
			case tc.why != "" && (b == nil || b.starter != first || why != tc.why):
				t.Errorf("admit = %v, %q; want it to wait for first/0: %q", b, why, tc.why)
			}
		})
	}

	// A start that must start alone keeps every other start waiting.
	c.starting = []started{{starter: &starter{k: key{"big", 0}, kind: "llamacpp", alone: true, shareMiB: 1000}, since: time.Now()}}
	if b, why := e.admit(c, simStart("small", 1000)); b == nil || why != "a llamacpp engine starts alone" {
		t.Errorf("a sim start beside a starting llama.cpp engine: %v, %q; want it to wait", b, why)
	}
}
