package inventory

import (
	"errors"
	"fmt"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// Options says where Detect finds the cards.
type Options struct {
	// NodeName seeds the UUIDs of simulated cards.
	NodeName string
	// SimSpec, when set, simulates these cards instead of reading NVML
	// (--sim-gpus).
	SimSpec string
	// Dev simulates DefaultSimSpec when no NVIDIA driver or card is found
	// (--dev).
	Dev bool
	// Server runs with no cards when there is no NVIDIA driver (docs/operations.md:
	// control-plane servers usually have no GPUs); a client node, which
	// exists to run engines, fails instead. Dev wins over it.
	Server bool
	// Lib is the NVML to read; nil means the system's, nvml.New().
	Lib nvml.Interface
}

// Result is what Detect found.
type Result struct {
	Cards     []*pb.Card
	Simulated bool
	// Message is the one line the agent prints on start, e.g.
	// "found 8 NVIDIA cards through NVML: a100-40gb=8".
	Message string
	// Warnings are problems worth a log line that did not stop detection,
	// such as a product missing from the device catalog.
	Warnings []string
}

// Detect finds this node's cards: simulated when opts.SimSpec is set, else
// read from NVML. Without an NVIDIA driver it simulates DefaultSimSpec in dev
// mode, finds no cards on a server, and fails on a client node, naming the
// --sim-gpus flag.
func Detect(opts Options) (Result, error) {
	if opts.SimSpec != "" {
		return simulate(opts.NodeName, opts.SimSpec, "simulating %s (--sim-gpus): %s")
	}
	lib := opts.Lib
	if lib == nil {
		lib = nvml.New()
	}
	cards, warnings, err := readNVML(lib)
	var noDriver string
	switch {
	case errors.Is(err, nvml.ERROR_LIBRARY_NOT_FOUND):
		noDriver = "no NVIDIA driver found (" + nvmlLibrary + ")"
	case errors.Is(err, nvml.ERROR_DRIVER_NOT_LOADED):
		noDriver = "no NVIDIA driver loaded (" + nvmlLibrary + " is installed, the kernel module is not)"
	case err != nil:
		return Result{}, fmt.Errorf("read cards through NVML: %w", err)
	}
	switch {
	case noDriver != "" && opts.Dev:
		return simulate(opts.NodeName, DefaultSimSpec, noDriver+": simulating %s: %s")
	case noDriver != "" && opts.Server:
		return Result{Message: noDriver + ": running as a server with no cards (--sim-gpus simulates some)"}, nil
	case noDriver != "":
		return Result{}, fmt.Errorf("%s; pass --sim-gpus to simulate cards, e.g. --sim-gpus %s", noDriver, DefaultSimSpec)
	case len(cards) == 0 && opts.Dev:
		return simulate(opts.NodeName, DefaultSimSpec, "NVML found no NVIDIA cards: simulating %s: %s")
	}
	msg := fmt.Sprintf("found %s through NVML", plural(len(cards), "NVIDIA card"))
	if len(cards) > 0 {
		msg += ": " + kindCounts(cards)
	}
	if n := unhealthy(cards); n > 0 {
		msg += fmt.Sprintf(" (%d unhealthy)", n)
	}
	return Result{Cards: cards, Message: msg, Warnings: warnings}, nil
}

// simulate builds the Result for simulated cards; format takes the card count
// and the kinds.
func simulate(node, spec, format string) (Result, error) {
	cards, err := Simulated(node, spec)
	if err != nil {
		return Result{}, err
	}
	return Result{
		Cards:     cards,
		Simulated: true,
		Message:   fmt.Sprintf(format, plural(len(cards), "card"), kindCounts(cards)),
	}, nil
}

// kindCounts summarises cards as KIND=COUNT in order of first index, the
// --sim-gpus syntax: "l4=2,h100=1".
func kindCounts(cards []*pb.Card) string {
	var kinds []string
	counts := map[string]int{}
	for _, c := range cards {
		if counts[c.GetDevice()] == 0 {
			kinds = append(kinds, c.GetDevice())
		}
		counts[c.GetDevice()]++
	}
	parts := make([]string, len(kinds))
	for i, k := range kinds {
		parts[i] = fmt.Sprintf("%s=%d", k, counts[k])
	}
	return strings.Join(parts, ",")
}

func unhealthy(cards []*pb.Card) int {
	n := 0
	for _, c := range cards {
		if !c.GetHealthy() {
			n++
		}
	}
	return n
}

func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
