package sim

import (
	"context"
	"errors"
	"fmt"
)

// vLLM's memory, as the vllm dialect reproduces it (docs/engines.md,
// "Strict sim dialects"):
//
//   - Overshoot. --memory-mib is vLLM's budget (--gpu-memory-utilization
//     of the card); once its CUDA graphs are captured the process holds
//     --overshoot-mib more (CUDA graphs, NCCL, allocator memory outside the
//     profiled budget: vLLM PR #51590, issues #53013, #57475).
//   - Profiling. vLLM charges every change of the device's free memory
//     during its start to itself (vllm/v1/worker/gpu_worker.py): free
//     memory that rose (a neighbour slept, unloaded or stopped) fails the
//     start, "Error in memory profiling. Initial free memory …, current
//     free memory …"; free memory that fell (a neighbour loaded or woke)
//     comes out of the KV cache, and a fall past the KV pool fails the
//     start, "No available memory for the cache blocks".
//   - Sleep. A sleep measures free memory before and after it offloads:
//     less free after (a neighbour grew by more than the sleep freed)
//     fails it, "Memory usage increased after sleeping." (vLLM's
//     Worker.sleep assertion), with the engine asleep.
//   - LoRA. --enable-lora allocates max_loras × max_lora_rank slots at
//     start, inside the budget; a load fills a slot, an unload empties it,
//     and neither changes the memory on the card.

// errProfiling is vLLM's assertion when free memory rose while it
// profiled.
//
//lint:ignore ST1005 vLLM's words, which clients match on
var errProfiling = errors.New("Error in memory profiling")

// errNoCacheBlocks is vLLM's error when nothing is left for the KV cache.
//
//lint:ignore ST1005 vLLM's words, which clients match on
var errNoCacheBlocks = errors.New("No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine.")

// vllmMemory says the engine follows vLLM's memory behaviour.
func (c Config) vllmMemory() bool { return c.Dialect == DialectVLLM }

// othersMiB is the memory the other processes hold on each of the
// engine's cards, as the simulated NVML reports it: what moves a card's
// free memory besides the engine itself. nil without a simulated card.
func (s *server) othersMiB() map[string]uint64 {
	if s.cfg.Usage == nil {
		return nil
	}
	out := make(map[string]uint64, len(s.cfg.CardUUIDs))
	for _, card := range s.cfg.CardUUIDs {
		procs, err := s.cfg.Usage.Processes(card)
		if err != nil {
			s.cfg.Logger.Warn("read card memory", "card", card, "err", err)
			continue
		}
		var n uint64
		for _, p := range procs {
			if p.PID != s.pid {
				n += p.UsedMiB
			}
		}
		out[card] = n
	}
	return out
}

// profiled checks, at the end of a vLLM start, how the card's free memory
// moved since before (othersMiB at the start): a rise fails the start, a
// fall shrinks the KV pool (and fails it past the pool).
func (s *server) profiled(before map[string]uint64) error {
	after := s.othersMiB()
	var fell uint64
	for card, b := range before {
		a, ok := after[card]
		if !ok {
			continue
		}
		if a < b {
			free := s.cardFreeGiB(card, b)
			//lint:ignore ST1005 vLLM's words, which clients match on
			return fmt.Errorf("%w. Initial free memory %.2f GiB, current free memory %.2f GiB. This happens when other processes sharing the same container release GPU memory while vLLM is profiling during initialization.",
				errProfiling, free, free+float64(b-a)/1024)
		}
		fell = max(fell, a-b)
	}
	if fell == 0 {
		return nil
	}
	kv := s.cfg.KVPoolMiB
	if fell >= kv {
		return fmt.Errorf("%w (free memory fell by %d MiB while it profiled; its KV pool was %d MiB)", errNoCacheBlocks, fell, kv)
	}
	s.mu.Lock()
	s.kvLostMiB = fell
	s.mu.Unlock()
	s.cfg.Logger.Warn("free memory fell while profiling: the KV cache is smaller", "fell_mib", fell, "kv_pool_mib", kv-fell)
	return nil
}

// cardFreeGiB is the card's free memory with others holding othersMiB and
// this engine its footprint, for vLLM's message; 0 when the card's size is
// unknown to the sim.
func (s *server) cardFreeGiB(card string, othersMiB uint64) float64 {
	total := s.cfg.CardMiB
	s.mu.Lock()
	own := s.footprintMiB()
	s.mu.Unlock()
	if total < othersMiB+own {
		return 0
	}
	return float64(total-othersMiB-own) / 1024
}

// kvPoolMiB is the KV pool the engine runs with: the configured one less
// what a fall of free memory while it profiled took from it.
func (s *server) kvPoolMiB() uint64 {
	return s.cfg.KVPoolMiB - min(s.kvLostMiB, s.cfg.KVPoolMiB)
}

// overshootMiB is what the process holds above its budget now: vLLM's
// CUDA graphs and the rest, once captured (awake).
func (s *server) overshootMiB() uint64 {
	if s.st.phase == phAwake {
		return s.cfg.OvershootMiB
	}
	return 0
}

// vllmSleepOffload copies the weights to host RAM for a level-1 sleep
// (the wake's time), then checks vLLM's assertion: the card's free memory
// must not have fallen while the engine freed its own. before is
// othersMiB and mine the footprint, both taken before the sleep.
func (s *server) vllmSleepOffload(ctx context.Context, level int, before map[string]uint64, mine uint64) error {
	if level == 1 {
		if err := sleepFor(ctx, s.cfg.WakeTime); err != nil {
			return err
		}
	}
	after := s.othersMiB()
	s.mu.Lock()
	now := s.footprintMiB()
	s.mu.Unlock()
	freed := int64(mine) - int64(now)
	for card, b := range before {
		if a, ok := after[card]; ok && int64(a)-int64(b) > freed {
			//lint:ignore ST1005 vLLM's words, which clients match on
			return errors.New("Memory usage increased after sleeping.")
		}
	}
	return nil
}

// loraPoolMiB is the LoRA pool vLLM allocates at start: --max-loras slots
// of --max-lora-rank (16, vLLM's default, when unset).
func (c Config) loraPoolMiB() uint64 {
	if !c.EnableLoRA {
		return 0
	}
	rank := c.MaxLoRARank
	if rank <= 0 {
		rank = 16
	}
	perRank := c.LoRAMiBPerRank
	if perRank == 0 {
		perRank = DefaultLoRAMiBPerRank
	}
	loras := c.MaxLoRAs
	if loras <= 0 {
		loras = DefaultMaxLoRAs
	}
	return uint64(loras) * uint64(rank) * perRank
}

// asleep says the engine is asleep now.
func (s *server) asleep() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.st.phase == phAsleep
}
