package engine

import (
	"fmt"

	"github.com/gpuplane/gpuplane/internal/engines"
)

// MemoryRule is the memory rule of the engine a replica's spec runs
// (internal/engines, docs/engines.md): a sim engine with a dialect
// follows its engine's.
func (p Params) MemoryRule() engines.Rule { return engines.For(p.Spec.GetEngine()) }

// knobMiB is the memory the engine's own knob is given: the replica's
// share less what the engine is known to use above its knob, so that the
// share is the most it uses. A share the overshoot alone would fill is an
// error naming both numbers.
func (p Params) knobMiB() (uint64, error) {
	return p.MemoryRule().KnobMiB(p.Replica.GetMemoryMib())
}

// smallestCardMiB is the memory of the smallest of the replica's cards.
func (p Params) smallestCardMiB() uint64 {
	var least uint64
	for _, c := range p.Cards {
		if least == 0 || c.GetMemoryMib() < least {
			least = c.GetMemoryMib()
		}
	}
	return least
}

// vllmUtilization is --gpu-memory-utilization for a share of the card: the
// knob (share less vLLM's overshoot) over the card's memory, to four places
// (fractionOfCard: never a whole MiB more than the knob).
func (p Params) vllmUtilization() (string, error) {
	knob, err := p.knobMiB()
	if err != nil {
		return "", err
	}
	return fractionOfCard(knob, p.smallestCardMiB()), nil
}

// unboundedOnSharedCard refuses an engine with no knob that bounds its GPU
// memory (Ollama: its runner fits layers and context to the free memory
// it sees; a sim speaking it does the same) on a share of a card without
// hard limits to hold it there.
func (p Params) unboundedOnSharedCard(enf Enforcement) error {
	if p.MemoryRule().Kind != KindOllama || p.wholeCard() || enf.Mode == ModeMPS || enf.Mode == ModeHAMi {
		return nil
	}
	r := p.MemoryRule()
	return fmt.Errorf("%s %s cannot be held to a share of %d MiB on a shared card without hard limits: it has no memory knob (%s); start the node's agent with --enforce mps or hami, or place it on a dedicated accelerator (docs/engines.md)",
		r.Name, r.Versions, p.Replica.GetMemoryMib(), r.Knob)
}
