package engine

import (
	"time"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// DefaultStartTimeouts is how long one start of an engine of each kind may
// take to become ready when its deployment sets no spec.engine.startTimeout.
// A start that takes longer has failed: the executor stops the engine,
// reports the replica Failed and frees its cards for the next replica.
var DefaultStartTimeouts = map[string]time.Duration{
	// vLLM reads the weights (from network storage, for a large model),
	// then profiles memory and captures CUDA graphs for each batch size.
	KindVLLM: 30 * time.Minute,
	// llama-server maps a GGUF file and copies its layers to the card.
	KindLlamaCpp: 10 * time.Minute,
	// The start includes the preload: creating the model from a GGUF
	// file (hashing it, copying it into Ollama's store) and loading it,
	// which Ollama itself allows OLLAMA_LOAD_TIMEOUT (5 minutes by
	// default) to make progress.
	KindOllama: 10 * time.Minute,
	// A user's program: long enough for a small model, short enough that
	// one that never listens does not hold its cards for long.
	KindCommand: 5 * time.Minute,
	// The sim engine is ready after its --load-seconds (1 s by default).
	KindSim: 2 * time.Minute,
}

// fallbackStartTimeout bounds the start of a kind with no default (one this
// node does not know, whose command cannot be built anyway).
const fallbackStartTimeout = 15 * time.Minute

// StartTimeout is how long one start of the engine e describes may take to
// become ready: spec.engine.startTimeout when set, else its kind's default.
func StartTimeout(e *pb.EngineSpec) time.Duration {
	if s := e.GetStartTimeoutSeconds(); s > 0 {
		return time.Duration(s) * time.Second
	}
	if d, ok := DefaultStartTimeouts[e.GetKind()]; ok {
		return d
	}
	return fallbackStartTimeout
}

// startsAlone are the kinds whose start must not overlap another start on
// the same card: each sizes what it takes from the card's free memory at
// start, so a neighbour loading at the same moment is counted as its own
// use or takes what it counted as free.
var startsAlone = map[string]bool{
	// vLLM's memory profiling charges every change of the device's free
	// memory during its start to its own non-torch use (vllm-project/vllm
	// issue 55827): two starting at once shrink each other's KV cache or
	// fail "No available memory for the cache blocks".
	KindVLLM: true,
	// llama-server fits its context and offload to the free device memory
	// it finds (--fit, on by default).
	KindLlamaCpp: true,
	// A user's program may be either of them.
	KindCommand: true,
	// `ollama serve` loads nothing at start, and the sim engine takes its
	// configured footprint: both start beside anything that fits.
}

// StartsAlone reports whether an engine of kind must start alone on its
// cards (no other engine starting there meanwhile); any other kind starts
// beside the other starts whose shares fit the card with it.
func StartsAlone(kind string) bool { return startsAlone[kind] }
